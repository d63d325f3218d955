"""Settling what a crashed or stopped worker left behind, from outside the graph.

``reconcile(target, thread_id)`` is what ``langgraph-cancel reconcile`` runs, and
what ``langgraph-cancel resume`` runs before it resumes a thread. Reconciliation
lives in one module, :mod:`langgraph_cancel.nodes.reconcile`, which the graph's
entry, the cancel protocol, the command line and the sweeper all use; this module
keeps its names importable where they have always been.
"""

from __future__ import annotations

from langgraph_cancel.nodes.reconcile import (
    RECONCILABLE,
    RECONCILE_LEASE_TTL,
    SettledEffect,
    ThreadReconciliation,
    areconcile,
    reap_expired_leases,
    reconcile,
    threads_to_reconcile,
)
from langgraph_cancel.workers import lease_is_live

#: Seconds of the lease reconciliation holds on a thread (``RECONCILE_LEASE_TTL``).
LEASE_TTL = RECONCILE_LEASE_TTL

__all__ = [
    "LEASE_TTL",
    "RECONCILABLE",
    "SettledEffect",
    "ThreadReconciliation",
    "areconcile",
    "lease_is_live",
    "reap_expired_leases",
    "reconcile",
    "threads_to_reconcile",
]

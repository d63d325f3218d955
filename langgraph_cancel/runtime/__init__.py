"""The runtime layer: which run a node works for, and whether that run was asked to stop.

- ``scope``: ``RunScope``, one run of one thread in this process (its ledger, run
  record, cancel signal, limits, and the calls its stop waits for);
- ``lookup``: finding a node's scope (the invocation's, the thread's live run, a
  new run, or an ephemeral one) and ``is_cancelled()`` for tools;
- ``signal``: ``CancelSignal`` (level-triggered, first reason wins) and the hub
  that feeds it from same-process requests, PostgreSQL ``LISTEN`` and polls;
- ``leases``: the daemon thread renewing every lease this process holds;
- ``config``: what a run's config must say (a thread, a durability that
  checkpoints each batch).

Every name is importable from ``langgraph_cancel.runtime`` as before.
"""

from __future__ import annotations

from langgraph_cancel.ledgers import (
    CONFIG_KEY_LEDGER,
    ENV_DB,
    coerce_ledger,
    ledger_for_url,
    resolve_ledger,
)
from langgraph_cancel.process import worker_id
from langgraph_cancel.runtime.config import check_durability, default_db_url, thread_id_of
from langgraph_cancel.runtime.leases import LEASES, LeaseKeeper
from langgraph_cancel.runtime.lookup import (
    ascope_for,
    drop_scope,
    ephemeral_scope,
    invocation_scope,
    is_cancelled,
    peek_scope,
    scope_for,
)
from langgraph_cancel.runtime.scope import (
    INTERRUPTED_REASON,
    RunScope,
    async_ledger_of,
    current_scope,
)
from langgraph_cancel.runtime.signal import HUB, CancelSignal
from langgraph_cancel.urls import DEFAULT_DB_URL


def __getattr__(name: str) -> str:
    # ``WORKER_ID`` is read on each access: a forked child has an identity of its own
    # (``langgraph_cancel.process.worker_id``), which a constant would not follow.
    if name == "WORKER_ID":
        return worker_id()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONFIG_KEY_LEDGER",
    "DEFAULT_DB_URL",
    "ENV_DB",
    "HUB",
    "INTERRUPTED_REASON",
    "LEASES",
    "WORKER_ID",
    "CancelSignal",
    "LeaseKeeper",
    "RunScope",
    "ascope_for",
    "async_ledger_of",
    "check_durability",
    "coerce_ledger",
    "current_scope",
    "default_db_url",
    "drop_scope",
    "ephemeral_scope",
    "invocation_scope",
    "is_cancelled",
    "ledger_for_url",
    "peek_scope",
    "resolve_ledger",
    "scope_for",
    "thread_id_of",
    "worker_id",
]

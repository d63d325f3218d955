"""Settling what a crashed or stopped worker left behind, from outside the graph.

``reconcile(target, thread_id)`` asks each tool's reconcile hook what became
of a thread's effects whose outcome was never recorded (``dispatched`` with no
outcome, ``unknown``) and finishes compensations left half-way
(``compensating``). It is what ``langgraph-cancel reconcile`` runs, and what
``langgraph-cancel resume`` runs before it resumes a thread.

It never races a live worker: it takes the thread's lease first and skips a
thread another worker holds a live lease on (that worker's in-flight calls are
still being awaited). With no ``thread_id`` it works on every thread that needs
it, after reaping expired leases (workers that stopped heartbeating: a crash).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from langchain_core.tools import BaseTool

from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.runtime import CancelSignal, RunScope, coerce_ledger, worker_id
from langgraph_cancel.types import (
    EffectRecord,
    EffectStatus,
    LeaseRecord,
)
from langgraph_cancel.workers import lease_is_live

#: Effect statuses reconciliation acts on.
RECONCILABLE: frozenset[EffectStatus] = frozenset(
    {EffectStatus.DISPATCHED, EffectStatus.UNKNOWN, EffectStatus.COMPENSATING}
)
LEASE_TTL = 60.0


@dataclass(frozen=True)
class SettledEffect:
    """One effect reconciliation looked at, before and after.

    Attributes:
        effect: The effect as it is now.
        before: Its status before reconciliation.
    """

    effect: EffectRecord
    before: EffectStatus

    @property
    def changed(self) -> bool:
        """True when reconciliation moved the effect."""
        return self.effect.status is not self.before


@dataclass
class ThreadReconciliation:
    """What ``reconcile`` did for one thread.

    Attributes:
        thread_id: The thread.
        effects: Every effect looked at (settled or still unknown).
        busy: The worker holding a live lease, when the thread was skipped.
        busy_until: When that lease expires.
        reaped: The owner of the expired lease released first, if any.
    """

    thread_id: str
    effects: list[SettledEffect] = field(default_factory=list)
    busy: str | None = None
    busy_until: str | None = None
    reaped: str | None = None

    @property
    def settled(self) -> list[SettledEffect]:
        """Effects that reached a known state."""
        return [e for e in self.effects if e.effect.status not in RECONCILABLE]

    @property
    def still_unknown(self) -> list[EffectRecord]:
        """Effects nobody could settle: each has an owner and a next action."""
        return [e.effect for e in self.effects if e.effect.status in RECONCILABLE]


def _tools(tools: Mapping[str, BaseTool] | Sequence[BaseTool] | None) -> dict[str, BaseTool]:
    if tools is None:
        return {}
    if isinstance(tools, Mapping):
        return dict(tools)
    return {t.name: t for t in tools}


def reap_expired_leases(target: object) -> list[LeaseRecord]:
    """Release every lease whose holder stopped heartbeating (a crashed worker).

    Args:
        target: A saver, a ``Ledger`` or a database URL.

    Returns:
        The leases released.
    """
    ledger = coerce_ledger(target)
    reaped: list[LeaseRecord] = []
    for lease in ledger.expired_leases():
        ledger.release_lease(lease.thread_id, lease.owner)
        reaped.append(lease)
    return reaped


def threads_to_reconcile(target: object) -> list[str]:
    """Threads with effects in flight with no outcome, unknown, or half-compensated."""
    ledger = coerce_ledger(target)
    threads: dict[str, None] = {}
    for status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN, EffectStatus.COMPENSATING):
        for rec in ledger.effects_by_status(status):
            threads.setdefault(rec.thread_id, None)
    return list(threads)


async def _reconcile_thread(
    ledger: Ledger, thread_id: str, tools: dict[str, BaseTool], owner: str
) -> ThreadReconciliation:
    from langgraph_cancel.graph import CancellationSettings, reconcile_thread

    run = ledger.require_latest_run(thread_id)
    out = ThreadReconciliation(thread_id)
    held = ledger.lease(thread_id)
    try:
        ledger.acquire_lease(thread_id, owner, ttl=LEASE_TTL)
    except ThreadBusyError as exc:
        out.busy, out.busy_until = exc.owner, exc.expires_at
        return out
    if held is not None and held.owner != owner and not lease_is_live(held):
        out.reaped = held.owner  # its worker stopped heartbeating: we took the lease over
    try:
        before = {
            e.effect_id: e.status for e in ledger.unsettled(thread_id) if e.status in RECONCILABLE
        }
        if not before:
            return out
        scope = RunScope(
            ledger=ledger,
            thread_id=thread_id,
            run=run,
            owner=owner,
            signal=CancelSignal(ledger, run.run_id, poll_interval=1.0),
        )
        await asyncio.to_thread(
            reconcile_thread, scope, CancellationSettings(tools=tools), interactive=False
        )
        for effect_id, status in before.items():
            out.effects.append(SettledEffect(ledger.get_effect(effect_id), status))
    finally:
        ledger.release_lease(thread_id, owner)
    return out


async def areconcile(
    target: object,
    thread_id: str | None = None,
    *,
    tools: Mapping[str, BaseTool] | Sequence[BaseTool] | None = None,
    owner: str | None = None,
) -> list[ThreadReconciliation]:
    """Settle unknown and in-flight effects through their tools' reconcile hooks.

    Args:
        target: A saver, a ``Ledger`` or a database URL.
        thread_id: One thread; ``None``: reap expired leases, then every thread
            that needs it.
        tools: The tools (by name, or a list) whose hooks to use; tools known
            to an ``EffectToolNode`` of this process are used too. An effect
            whose tool is unknown becomes (or stays) ``unknown`` with an owner
            and a next action: nothing is guessed.
        owner: The lease owner to act as (default: this process's worker id).

    Returns:
        One entry per thread looked at.

    Raises:
        UnknownThreadError: If ``thread_id`` is given and the ledger has never seen it.
    """
    ledger = coerce_ledger(target)
    known = _tools(tools)
    me = owner or worker_id()
    if thread_id is not None:
        return [await _reconcile_thread(ledger, thread_id, known, me)]
    reaped = {lease.thread_id: lease.owner for lease in reap_expired_leases(ledger)}
    threads = list(dict.fromkeys([*reaped, *threads_to_reconcile(ledger)]))
    results: list[ThreadReconciliation] = []
    for thread in threads:
        result = await _reconcile_thread(ledger, thread, known, me)
        result.reaped = reaped.get(thread) or result.reaped
        results.append(result)
    return results


def reconcile(
    target: object,
    thread_id: str | None = None,
    *,
    tools: Mapping[str, BaseTool] | Sequence[BaseTool] | None = None,
    owner: str | None = None,
) -> list[ThreadReconciliation]:
    """Sync :func:`areconcile`."""
    from langgraph_cancel.hooks import run_sync as _run_sync

    result: list[ThreadReconciliation] = _run_sync(
        areconcile(target, thread_id, tools=tools, owner=owner)
    )
    return result


__all__ = [
    "RECONCILABLE",
    "SettledEffect",
    "ThreadReconciliation",
    "areconcile",
    "lease_is_live",
    "reap_expired_leases",
    "reconcile",
    "threads_to_reconcile",
]

"""Reconciliation: settling outcomes the ledger does not know, in a graph or outside one.

One module serves every place that settles: the ``reconcile`` entry subgraph
(``nodes.entry``) before new input runs, the cancel protocol (``nodes.cancel``)
for calls still in flight when a run stops, ``langgraph-cancel reconcile`` /
``resume`` and the sweeper.

- ``reconcile_thread`` asks each tool's reconcile hook what became of a
  thread's effects whose outcome was never recorded (``dispatched`` with no
  outcome, ``unknown``) and finishes compensations left half-way
  (``compensating``).
- ``ask_human_about`` asks a person, in one ``interrupt()`` listing each unknown
  effect, about what the hooks could not settle. The answer
  (``Command(resume=...)``) carries one decision per effect:
  ``{"effect_id": ..., "decision": "committed" | "not_applied" | "unknown",
  "result": ..., "owner": ..., "next_action": ..., "reviewer": ...}``, either as a
  list or as ``{"decisions": [...]}``.
- ``reconcile`` / ``areconcile`` do it from outside the graph. They never race a
  live worker: they take the thread's lease first and skip a thread another
  worker holds a live lease on (that worker's in-flight calls are still being
  awaited). With no ``thread_id`` they work on every thread that needs it, after
  reaping expired leases (workers that stopped heartbeating: a crash), except those
  kept on a stopped run's thread until the thread is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.tools import BaseTool
from langgraph.types import interrupt

from langgraph_cancel.compensation import compensate_effect
from langgraph_cancel.effects import EffectSpec, Outcome
from langgraph_cancel.errors import IllegalTransitionError, InvalidDecisionError, ThreadBusyError
from langgraph_cancel.execution.settlement import apply_outcome
from langgraph_cancel.hooks import call_reconcile, run_sync
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledgers import coerce_ledger
from langgraph_cancel.nodes.settings import CancellationSettings
from langgraph_cancel.runtime import CancelSignal, RunScope, worker_id
from langgraph_cancel.types import (
    EffectKind,
    EffectRecord,
    EffectStatus,
    LeaseRecord,
    RunStatus,
)
from langgraph_cancel.workers import lease_is_live

#: Effect statuses reconciliation acts on.
RECONCILABLE: frozenset[EffectStatus] = frozenset(
    {EffectStatus.DISPATCHED, EffectStatus.UNKNOWN, EffectStatus.COMPENSATING}
)
#: Seconds of the lease reconciliation from outside the graph holds on a thread.
RECONCILE_LEASE_TTL = 60.0
RECONCILE_DECISIONS = ("committed", "not_applied", "unknown")


def question(effects: list[EffectRecord], error: str | None = None) -> dict[str, Any]:
    """The interrupt payload describing unknown outcomes (and why the last answer failed)."""
    return {
        "type": "langgraph_cancel.reconcile",
        "message": (
            f"{len(effects)} effect(s) may or may not have happened. Check the external "
            "system by idempotency key and decide each."
        ),
        "error": error,
        "effects": [
            {
                "effect_id": e.effect_id,
                "tool": e.tool,
                "kind": e.kind.value,
                "args": e.args,
                "idempotency_key": e.idempotency_key,
                "owner": e.owner,
                "next_action": e.next_action,
                "error": e.error,
                "allowed_decisions": list(RECONCILE_DECISIONS),
            }
            for e in effects
        ],
    }


def parse_decisions(value: Any, effects: list[EffectRecord]) -> list[dict[str, Any]]:
    """Validate a resume value against the effects asked about.

    Raises:
        InvalidDecisionError: For anything malformed; nothing is applied then.
    """
    raw = value.get("decisions") if isinstance(value, dict) else value
    if not isinstance(raw, list):
        raise InvalidDecisionError(
            "reconcile resume value must be a list of decisions or {'decisions': [...]}"
        )
    known = {e.effect_id for e in effects}
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for item in raw:
        if not isinstance(item, dict):
            raise InvalidDecisionError(f"a decision must be an object, got {item!r}")
        effect_id = item.get("effect_id")
        decision = item.get("decision")
        if not isinstance(effect_id, str) or effect_id not in known:  # a list is not hashable
            raise InvalidDecisionError(f"decision for an effect not asked about: {effect_id!r}")
        if effect_id in seen:
            raise InvalidDecisionError(f"two decisions for {effect_id!r}")
        if decision not in RECONCILE_DECISIONS:
            raise InvalidDecisionError(
                f"decision must be one of {', '.join(RECONCILE_DECISIONS)}, got {decision!r}"
            )
        if decision == "unknown" and not (item.get("owner") and item.get("next_action")):
            raise InvalidDecisionError("leaving an effect unknown needs an owner and a next_action")
        seen.add(effect_id)
        out.append(item)
    return out


def ask_human_about(scope: RunScope, effects: list[EffectRecord]) -> None:
    """Interrupt with the unknown effects; apply the decisions when resumed.

    A malformed answer is not applied: the question is asked again, carrying
    the error (LangGraph keeps every resume value of a node, so raising would
    replay the bad answer on the next resume).
    """
    error: str | None = None
    while True:
        answer = interrupt(question(effects, error))
        try:
            decisions = parse_decisions(answer, effects)
        except InvalidDecisionError as exc:
            error = str(exc)
            continue
        break
    ledger = scope.ledger
    for item in decisions:
        reviewer = str(item.get("reviewer") or "human")
        target = {
            "committed": EffectStatus.COMMITTED,
            "not_applied": EffectStatus.NOT_APPLIED,
            "unknown": EffectStatus.UNKNOWN,
        }[item["decision"]]
        kwargs: dict[str, Any] = {"actor": reviewer, "detail": {"decision": item}}
        if target is EffectStatus.COMMITTED:
            kwargs["result"] = {
                "content": str(item.get("result", "confirmed by reviewer")),
                "status": "success",
            }
        if target is EffectStatus.UNKNOWN:
            kwargs["owner"] = str(item["owner"])
            kwargs["next_action"] = str(item["next_action"])
        # Settled meanwhile by someone else: their record stands.
        with contextlib.suppress(IllegalTransitionError):
            ledger.transition(item["effect_id"], target, **kwargs)


# ------------------------------------------------------------ settling by hooks
def spec_of_unknown() -> EffectSpec:
    """The fail-safe declaration for a tool this process does not know."""
    return EffectSpec(kind=EffectKind.IRREVERSIBLE, classified=False)


def reconcile_now(spec: EffectSpec, key: str, args: dict[str, Any]) -> Outcome:
    """Ask a reconcile hook, from sync code (the hook gets a private event loop)."""
    outcome: Outcome = run_sync(call_reconcile(spec, key, args))
    return outcome


def reconcile_thread(
    scope: RunScope, settings: CancellationSettings, *, interactive: bool
) -> list[EffectRecord]:
    """Settle a thread's unsettled effects through their hooks; return what stays unknown.

    Blocking: call it from a worker thread in async code.
    """
    ledger = scope.ledger
    left: list[EffectRecord] = []
    for rec in ledger.unsettled(scope.thread_id):
        spec = settings.spec(rec.tool) or spec_of_unknown()
        if rec.status is EffectStatus.COMPENSATING:
            if spec.compensate is not None:
                compensate_effect(ledger, rec, spec, actor="reconciler")
            continue
        if rec.status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN):
            outcome = reconcile_now(spec, rec.idempotency_key, rec.args)
            if outcome.status == "unknown" and rec.status is EffectStatus.UNKNOWN:
                left.append(rec)
                continue
            settled = apply_outcome(ledger, rec, spec, outcome, actor="reconciler")
            if settled.status is EffectStatus.UNKNOWN:
                left.append(settled)
    return left


# ------------------------------------------------------ from outside the graph
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
        kept_lease: Whether the lease found on the thread stays there, expired: its
            run is ``cancelled`` and its worker had kept the lease for the thread's
            close, which a sweeper given the graph, ``resume`` or new input does.
    """

    thread_id: str
    effects: list[SettledEffect] = field(default_factory=list)
    busy: str | None = None
    busy_until: str | None = None
    reaped: str | None = None
    kept_lease: bool = False

    @property
    def settled(self) -> list[SettledEffect]:
        """Effects that reached a known state."""
        return [e for e in self.effects if e.effect.status not in RECONCILABLE]

    @property
    def still_unknown(self) -> list[EffectRecord]:
        """Effects nobody could settle: each has an owner and a next action."""
        return [e.effect for e in self.effects if e.effect.status in RECONCILABLE]


def tools_by_name(
    tools: Mapping[str, BaseTool] | Sequence[BaseTool] | None,
) -> dict[str, BaseTool]:
    """The tools a reconcile pass may ask, by name (a mapping, a list, or none)."""
    if tools is None:
        return {}
    if isinstance(tools, Mapping):
        return dict(tools)
    return {tool.name: tool for tool in tools}


def reap_expired_leases(target: object) -> list[LeaseRecord]:
    """Release every lease whose holder stopped heartbeating (a crashed worker).

    An expired lease on a thread whose last run is ``cancelled`` stays: a worker keeps
    its lease when its run stopped without the thread's state put right (it died, or
    its saves were lost, after the run's terminal transition), and only the thread's
    close lets it go (a sweeper given the graph, ``resume``, or new input on the
    thread). Released, nothing would bring a sweeper back to the open thread.

    Args:
        target: A saver, a ``Ledger`` or a database URL.

    Returns:
        The leases released.
    """
    ledger = coerce_ledger(target)
    reaped: list[LeaseRecord] = []
    for lease in ledger.expired_leases():
        if _stopped(ledger, lease.thread_id):
            continue
        ledger.release_lease(lease.thread_id, lease.owner)
        reaped.append(lease)
    return reaped


def _stopped(ledger: Ledger, thread_id: str) -> bool:
    """Whether the thread's last run is ``cancelled``: a lease on it waits for the close."""
    run = ledger.latest_run(thread_id)
    return run is not None and run.status is RunStatus.CANCELLED


def threads_to_reconcile(target: object) -> list[str]:
    """Threads with effects in flight with no outcome, unknown, or half-compensated."""
    ledger = coerce_ledger(target)
    threads: dict[str, None] = {}
    for status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN, EffectStatus.COMPENSATING):
        for rec in ledger.effects_by_status(status):
            threads.setdefault(rec.thread_id, None)
    return list(threads)


async def _reconcile_leased_thread(
    ledger: Ledger, thread_id: str, tools: dict[str, BaseTool], owner: str
) -> ThreadReconciliation:
    """Reconcile one thread under its lease; skip it while a live worker holds it."""
    run = ledger.require_latest_run(thread_id)
    out = ThreadReconciliation(thread_id)
    held = ledger.lease(thread_id)
    try:
        ledger.acquire_lease(thread_id, owner, ttl=RECONCILE_LEASE_TTL)
    except ThreadBusyError as exc:
        out.busy, out.busy_until = exc.owner, exc.expires_at
        return out
    if held is not None and held.owner != owner and not lease_is_live(held):
        out.reaped = held.owner  # its worker stopped heartbeating: we took the lease over
    # A lease found on a stopped run's thread was kept for the thread's close, which
    # this pass does not do: it stays until that close (``reap_expired_leases``).
    out.kept_lease = held is not None and run.status is RunStatus.CANCELLED
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
        if out.kept_lease:
            ledger.expire_lease(thread_id, owner)
        else:
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
    known = tools_by_name(tools)
    me = owner or worker_id()
    if thread_id is not None:
        return [await _reconcile_leased_thread(ledger, thread_id, known, me)]
    reaped = {lease.thread_id: lease.owner for lease in reap_expired_leases(ledger)}
    threads = list(dict.fromkeys([*reaped, *threads_to_reconcile(ledger)]))
    results: list[ThreadReconciliation] = []
    for thread in threads:
        result = await _reconcile_leased_thread(ledger, thread, known, me)
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
    result: list[ThreadReconciliation] = run_sync(
        areconcile(target, thread_id, tools=tools, owner=owner)
    )
    return result


__all__ = [
    "RECONCILABLE",
    "RECONCILE_DECISIONS",
    "RECONCILE_LEASE_TTL",
    "SettledEffect",
    "ThreadReconciliation",
    "areconcile",
    "ask_human_about",
    "parse_decisions",
    "question",
    "reap_expired_leases",
    "reconcile",
    "reconcile_now",
    "reconcile_thread",
    "spec_of_unknown",
    "threads_to_reconcile",
    "tools_by_name",
]

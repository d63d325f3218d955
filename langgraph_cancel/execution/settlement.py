"""Settling a call whose outcome is not simply known: unknown, reconciled, returned late.

Shared by the per-call protocol, the cancel node and the reconciler: whoever
finds a dispatched call without an outcome settles it the same way, and an
unknown outcome always carries an owner and a next action (invariant I3).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langgraph_cancel.effects import EffectSpec, Outcome
from langgraph_cancel.errors import IllegalTransitionError, LedgerError
from langgraph_cancel.execution.answers import outcome_payload, result_text
from langgraph_cancel.execution.drive import drive_ledger
from langgraph_cancel.execution.steps import Protocol, ledger_call
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.process import RUNNING_CALLS
from langgraph_cancel.types import EffectKind, EffectRecord, EffectStatus


@contextmanager
def running(effect_id: str) -> Iterator[None]:
    """Mark ``effect_id``'s call as running in this process for the block."""
    RUNNING_CALLS.add(effect_id)
    try:
        yield
    finally:
        RUNNING_CALLS.discard(effect_id)


def start_running(effect_id: str) -> None:
    """Mark a call running until ``stop_running`` (for calls that outlive their wait)."""
    RUNNING_CALLS.add(effect_id)


def stop_running(effect_id: str) -> None:
    """The call of ``effect_id`` has ended."""
    RUNNING_CALLS.discard(effect_id)


def running_here(effect_id: str) -> bool:
    """Whether this process is still making the call of ``effect_id``."""
    return effect_id in RUNNING_CALLS


def unknown_owner(spec: EffectSpec) -> tuple[str, str]:
    """Who must act on an unknown outcome, and what they must do."""
    if spec.reconcile is not None:
        return (
            "reconciler",
            "run `langgraph-cancel reconcile THREAD` (asks the external system by idempotency "
            "key); if it still cannot tell, a person decides",
        )
    return (
        "operator",
        "check the external system for this idempotency key, then settle the effect as "
        "committed or not_applied (langgraph-cancel reconcile THREAD)",
    )


def unknown_fields(spec: EffectSpec, why: str) -> dict[str, Any]:
    """The transition fields of an unknown outcome: owner, next action, why."""
    owner, next_action = unknown_owner(spec)
    return {"owner": owner, "next_action": next_action, "error": why}


def mark_unknown_steps(rec: EffectRecord, spec: EffectSpec, why: str) -> Protocol[EffectRecord]:
    """Record an unknown outcome with an owner and a next action (invariant I3)."""
    try:
        return (
            yield from ledger_call(
                Ledger.transition,
                rec.effect_id,
                EffectStatus.UNKNOWN,
                actor="langgraph-cancel",
                **unknown_fields(spec, why),
            )
        )
    except IllegalTransitionError:
        return (yield from ledger_call(Ledger.get_effect, rec.effect_id))


def mark_unknown(ledger: Ledger, rec: EffectRecord, spec: EffectSpec, why: str) -> EffectRecord:
    """``mark_unknown_steps``, from sync code."""
    return drive_ledger(ledger, mark_unknown_steps(rec, spec, why))


def mark_never_sent_steps(
    rec: EffectRecord, actor: str, reason: str
) -> Protocol[EffectRecord | None]:
    """``rec``, whose intent is durable but whose call never left the process: recorded
    ``not_applied`` (droppable, or dispatchable again under its key). None when another
    writer moved it first, or the ledger could not be reached (it stays in flight for
    reconciliation to settle)."""
    return (yield from never_sent_steps(rec.effect_id, actor, reason))


def never_sent_steps(effect_id: str, actor: str, reason: str) -> Protocol[EffectRecord | None]:
    """``mark_never_sent_steps`` for the effect with this id."""
    try:
        moved: EffectRecord = yield from ledger_call(
            Ledger.transition,
            effect_id,
            EffectStatus.NOT_APPLIED,
            expected=[EffectStatus.DISPATCHED],
            actor=actor,
            detail={"never_sent": True, "reason": reason},
        )
    except LedgerError:
        return None
    return moved


def mark_never_sent(ledger: Ledger, rec: EffectRecord, actor: str, reason: str) -> None:
    """``mark_never_sent_steps``, from sync code."""
    drive_ledger(ledger, mark_never_sent_steps(rec, actor, reason))


def apply_outcome_steps(
    rec: EffectRecord, spec: EffectSpec, outcome: Outcome, *, actor: str
) -> Protocol[EffectRecord]:
    """Settle an in-flight or unknown effect with what reconciliation found.

    A provider with no record of a call whose request this process is still making
    has not seen it *yet*: the call stays unknown (its outcome is recorded when it
    returns), never ``not_applied``, which would free its key for another effect.
    """
    if outcome.status == "not_applied" and running_here(rec.effect_id):
        why = f"the request is still in flight in this process; {outcome.reason or ''}"
        return (yield from mark_unknown_steps(rec, spec, why.rstrip("; ")))
    try:
        if outcome.status == "committed":
            return (
                yield from ledger_call(
                    Ledger.transition,
                    rec.effect_id,
                    EffectStatus.COMMITTED,
                    actor=actor,
                    result={"content": result_text(outcome.result), "status": "success"},
                    detail={"reconciled": True},
                )
            )
        if outcome.status == "not_applied":
            return (
                yield from ledger_call(
                    Ledger.transition,
                    rec.effect_id,
                    EffectStatus.NOT_APPLIED,
                    actor=actor,
                    detail={"reconciled": True, "reason": outcome.reason},
                )
            )
    except IllegalTransitionError:
        return (yield from ledger_call(Ledger.get_effect, rec.effect_id))
    return (yield from mark_unknown_steps(rec, spec, outcome.reason or "reconcile could not tell"))


def apply_outcome(
    ledger: Ledger, rec: EffectRecord, spec: EffectSpec, outcome: Outcome, *, actor: str
) -> EffectRecord:
    """``apply_outcome_steps``, from sync code."""
    return drive_ledger(ledger, apply_outcome_steps(rec, spec, outcome, actor=actor))


def record_late_outcome(ledger: Ledger, rec: EffectRecord, actor: str, output: Any) -> None:
    """A call recorded unknown when the run stopped waiting for it came back: keep its
    outcome (a failure stays unknown: only reconciliation, or a person, can settle it)."""
    with contextlib.suppress(Exception):
        ledger.transition(
            rec.effect_id,
            EffectStatus.COMMITTED,
            expected=[EffectStatus.UNKNOWN],
            actor=actor,
            result=outcome_payload(output),
            detail={"settled_late": True},
        )


def fail_safe_spec() -> EffectSpec:
    """The declaration of a tool this process does not know: irreversible, approval."""
    return EffectSpec(kind=EffectKind.IRREVERSIBLE, classified=False)


__all__ = [
    "apply_outcome",
    "apply_outcome_steps",
    "fail_safe_spec",
    "mark_never_sent",
    "mark_never_sent_steps",
    "mark_unknown",
    "mark_unknown_steps",
    "never_sent_steps",
    "record_late_outcome",
    "running",
    "running_here",
    "start_running",
    "stop_running",
    "unknown_fields",
    "unknown_owner",
]

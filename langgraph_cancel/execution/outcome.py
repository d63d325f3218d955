"""The outcome of a dispatched call, recorded: returned, paused, cut off, or left in flight.

Every dispatched call ends in one compare-and-set from ``dispatched``:

- it returned: ``committed`` (``scheduled`` for a call its provider holds for a
  delay window), or ``failed`` when its answer reports an error; a call that
  raised is classified in ``failure.py``;
- it paused at its tool's own ``interrupt()``: ``not_applied``, to run again on
  resume under the same key;
- the run's task was cancelled while it was in flight: what the driver saw
  within the grace, or ``unknown`` with an owner;
- an earlier attempt left it ``dispatched`` (a crash): the reconcile hook, or a
  retry under the same key when that cannot double it, or ``unknown``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from langgraph_cancel.effects import EffectSpec
from langgraph_cancel.errors import LedgerError
from langgraph_cancel.execution.answers import answer_text, is_error_answer, outcome_payload
from langgraph_cancel.execution.context import CallContext
from langgraph_cancel.execution.failure import failed
from langgraph_cancel.execution.plan import CallPlan
from langgraph_cancel.execution.settlement import apply_outcome_steps, mark_unknown_steps
from langgraph_cancel.execution.steps import (
    DispatchCancelled,
    Protocol,
    Reconcile,
    SettleWhenReturned,
    from_dispatched,
    ledger_call,
    transition_steps,
)
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import EffectRecord, EffectStatus, TransitionRequest, utcnow

logger = logging.getLogger("langgraph_cancel.tools")


def returned(
    ctx: CallContext,
    plan: CallPlan,
    rec: EffectRecord,
    answer: Any,
    raised: BaseException | None,
    *,
    defer: bool,
) -> Protocol[Any]:
    """Record a dispatched call that came back with ``answer``; the answer.

    Args:
        ctx: The call's context.
        plan: The call.
        rec: Its ``dispatched`` record.
        answer: What the handler returned.
        raised: The exception ``ToolNode`` answered with ``answer``, if any.
        defer: A success may wait for the batch's next write.
    """
    if raised is not None:
        return (yield from failed(ctx, plan, rec, raised, answer))
    if is_error_answer(answer):
        # The tool (or a wrapper inside this one) answered with an error: recorded as
        # a failure, with its words.
        yield from transition_steps(
            from_dispatched(
                rec,
                EffectStatus.FAILED,
                ctx.owner,
                error=answer_text(answer),
                detail={"reported": True},
            ),
            lost_ok=True,
        )
        return answer
    success = success_request(ctx, rec, answer, plan.spec)
    if defer:
        yield from ctx.batch.succeeded(success)
    else:
        yield from transition_steps(success, lost_ok=True)
    return answer


def success_request(
    ctx: CallContext, rec: EffectRecord, answer: Any, spec: EffectSpec | None = None
) -> TransitionRequest:
    """The outcome write of a call that returned.

    A call its provider holds for a delay window (``effect(..., delay=, revoke=)``)
    is recorded ``scheduled``, revocable until its release time, instead of committed.
    """
    if spec is not None and spec.delay is not None and spec.revoke is not None:
        return from_dispatched(
            rec,
            EffectStatus.SCHEDULED,
            ctx.owner,
            result=outcome_payload(answer),
            release_at=(rec.dispatched_at or utcnow()) + spec.delay,
        )
    return from_dispatched(
        rec,
        EffectStatus.COMMITTED,
        ctx.owner,
        result=outcome_payload(answer),
    )


def interrupted(ctx: CallContext, rec: EffectRecord) -> Protocol[None]:
    """A call paused by its tool's own ``interrupt()``: it runs again on resume."""
    yield from transition_steps(
        from_dispatched(
            rec,
            EffectStatus.NOT_APPLIED,
            ctx.owner,
            detail={"interrupted": True},
        ),
        lost_ok=True,
    )


def after_task_cancel(
    ctx: CallContext, plan: CallPlan, rec: EffectRecord, cancelled: DispatchCancelled
) -> Protocol[None]:
    """The run's task was cancelled with this call in flight: record what became of it.

    Only the call is settled here. A task is cancelled when the run is stopped (a
    server's ``runs.cancel``), but also when a sibling task raised or paused at an
    interrupt, and then the run goes on later: whether the run was stopped is for
    the graph (``add_cancellation``) or the next turn to say.
    """
    if not cancelled.finished:
        timeout = plan.spec.cancel_timeout or ctx.cancel_timeout
        yield from mark_unknown_steps(
            rec, plan.spec, f"still in flight {timeout:g}s after the run was cancelled"
        )
        if cancelled.pending is not None:
            yield SettleWhenReturned(cancelled.pending, rec, ctx.owner)
        return
    try:
        if cancelled.error is None:
            with contextlib.suppress(Exception):  # recorded; the cancellation goes on
                yield from returned(ctx, plan, rec, cancelled.output, cancelled.raised, defer=False)
        elif isinstance(cancelled.error, Exception):
            # Recorded; what goes on is the task's cancellation, not the tool's error.
            with contextlib.suppress(type(cancelled.error)):
                yield from failed(ctx, plan, rec, cancelled.error, None)
    except LedgerError:
        logger.exception("could not record the outcome of %s", rec.effect_id)


def settle_in_flight(ctx: CallContext, plan: CallPlan, rec: EffectRecord) -> Protocol[EffectRecord]:
    """A record left ``dispatched`` by an earlier attempt: find out what happened."""
    spec = plan.spec
    if spec.reconcile is None:
        if spec.retry_safe:
            return (
                yield from ledger_call(
                    Ledger.transition,
                    rec.effect_id,
                    EffectStatus.DISPATCHED,
                    expected=[EffectStatus.DISPATCHED],
                    actor=ctx.owner,
                    owner=ctx.owner,
                    detail={"retry_same_key": True, "idempotency_key": rec.idempotency_key},
                )
            )
        return (yield from mark_unknown_steps(rec, spec, "left in flight by an earlier attempt"))
    outcome = yield Reconcile(spec, rec.idempotency_key, rec.args)
    return (yield from apply_outcome_steps(rec, spec, outcome, actor="reconciler"))


__all__ = [
    "after_task_cancel",
    "interrupted",
    "returned",
    "settle_in_flight",
    "success_request",
]

"""The call's record before anything leaves: planned under its key, or held in the outbox.

A side-effecting call is planned in the ledger (``planned``) before it is
reviewed or dispatched, under its idempotency key. A key another effect holds
means the external system would take this call for that one: it is not
dispatched, and the model is told. A call whose tool-call id names another
call's record is planned under an id of its own. A call the package holds for
its delay window goes to the outbox (``scheduled``) instead of out.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolMessage

from langgraph_cancel.errors import DispatchRefusedError, DuplicateIdempotencyKeyError
from langgraph_cancel.execution.answers import replay_message
from langgraph_cancel.execution.cancel_check import stopped_before_dispatch
from langgraph_cancel.execution.context import CallContext
from langgraph_cancel.execution.identity import own_record_steps
from langgraph_cancel.execution.plan import CallPlan
from langgraph_cancel.execution.steps import AwaitPlanSaved, CancelCheck, Protocol, ledger_call
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import EffectRecord, EffectStatus, TransitionRequest, utcnow


def plan_effect(ctx: CallContext, plan: CallPlan) -> Protocol[EffectRecord | ToolMessage]:
    """The call's record (new or from an earlier attempt), or why it cannot have one.

    An idempotency key already held by another effect (the same refund asked for
    again, maybe in another thread) means the external system would treat this
    call as that one: it is not dispatched, and the model is told.
    """
    try:
        rec, _created = yield from ctx.record(plan)
    except DuplicateIdempotencyKeyError as exc:
        return (yield from _duplicate_key(ctx, plan, exc))
    return rec


def _duplicate_key(
    ctx: CallContext, plan: CallPlan, exc: DuplicateIdempotencyKeyError
) -> Protocol[ToolMessage]:
    holder = yield from ledger_call(Ledger.effect_by_key, plan.key)
    where = (
        f"effect {holder.effect_id} (thread {holder.thread_id}, {holder.status.value})"
        if holder is not None
        else "another effect"
    )
    text = (
        f"Not run: idempotency key {plan.key!r} already belongs to {where}; the external "
        "system would treat this call as that one. "
        + (
            f"Its recorded result: {replay_message(holder).content}"
            if holder is not None and holder.status is EffectStatus.COMMITTED
            else "Check that effect before asking again."
        )
    )
    yield from ctx.record(
        plan,
        idempotency_key=f"{plan.key}#duplicate:{ctx.scope.thread_id}:{plan.ledger_id}",
        status=EffectStatus.FAILED,
        error=text,
        detail={"duplicate_of": getattr(holder, "effect_id", None), "error": str(exc)},
    )
    return ToolMessage(text, name=plan.tool.name, tool_call_id=plan.call_id, status="error")


def moved_plan(ctx: CallContext, plan: CallPlan) -> Protocol[tuple[CallPlan, EffectRecord | None]]:
    """The call under the id of its own record (its tool-call id names another call's)."""
    own, found = yield from own_record_steps(
        ctx.scope.thread_id, plan.call, moved=True, base_id=plan.base_id
    )
    return plan.under_own_id(ctx.scope.thread_id, own), found


def planned_record(ctx: CallContext, plan: CallPlan) -> Protocol[tuple[CallPlan, Any]]:
    """A new call's record, planned under an id of its own when its id is taken.

    Returns:
        The plan (moved to the call's own id when needed) and its record, or the
        ``ToolMessage`` that answers a call that cannot have one.
    """
    planned = yield from plan_effect(ctx, plan)
    if isinstance(planned, EffectRecord) and plan.needs_own_id(planned):
        # The id names another call's record (planned meanwhile): this call goes
        # under its own.
        plan, found = yield from moved_plan(ctx, plan)
        planned = found if found is not None else (yield from plan_effect(ctx, plan))
    return plan, planned


def hold(ctx: CallContext, plan: CallPlan, rec: EffectRecord) -> Protocol[Any]:
    """A call the package holds for its delay window: its intent goes to the outbox.

    Nothing leaves the process: the record moves to ``scheduled`` with its release
    time (refused, like a dispatch, once the run is no longer running), and the
    outbox sends it after the window (``langgraph_cancel.outbox``).
    """
    yield from ctx.batch.flush_outcome()
    yield AwaitPlanSaved(ctx.config, ctx.checkpoint_timeout)
    delay = plan.spec.delay
    if delay is None or (yield CancelCheck()):
        return (yield from stopped_before_dispatch(ctx, plan, rec))
    (held,) = yield from ledger_call(
        Ledger.transition_many,
        [
            TransitionRequest(
                effect_id=rec.effect_id,
                to=EffectStatus.SCHEDULED,
                expected=frozenset({rec.status}),
                actor=ctx.owner,
                owner=ctx.owner,
                release_at=utcnow() + delay,
                require_active_run=True,
                detail={"held": True, "idempotency_key": rec.idempotency_key},
            )
        ],
    )
    if isinstance(held, DispatchRefusedError):
        ctx.scope.signal.set()
        return (yield from stopped_before_dispatch(ctx, plan, rec))
    if isinstance(held, Exception):
        held = yield from ledger_call(Ledger.get_effect, rec.effect_id)
    return replay_message(held, plan.call)


__all__ = ["hold", "moved_plan", "plan_effect", "planned_record"]

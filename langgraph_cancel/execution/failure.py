"""Classifying a call that raised: failed, not applied, or whatever reconciliation finds.

An exception is not one outcome. A transient fault (``EffectSpec.retryable``: a
timeout, a dropped connection) may have reached the provider, so the tool's
reconcile hook is asked, and an answer nobody can give leaves the outcome
``unknown`` with an owner. Any other exception means the call did not apply:
``failed`` when ``ToolNode`` answers it with a message, ``not_applied`` when it
propagates (so a re-run may dispatch the call again under the same key).
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolMessage

from langgraph_cancel.execution.answers import answer_text, replay_message, result_text
from langgraph_cancel.execution.context import CallContext
from langgraph_cancel.execution.plan import CallPlan
from langgraph_cancel.execution.settlement import mark_unknown_steps
from langgraph_cancel.execution.steps import Protocol, Reconcile, from_dispatched, transition_steps
from langgraph_cancel.types import EffectRecord, EffectStatus, TransitionRequest


def failed(
    ctx: CallContext, plan: CallPlan, rec: EffectRecord, exc: BaseException, answer: Any
) -> Protocol[Any]:
    """Record a call that raised; its answer (``answer``: ToolNode's message for it).

    A transient fault on a side effect may have been applied: the tool's reconcile
    hook is asked. Any other exception means the call did not apply.

    Raises:
        BaseException: ``exc`` again when ToolNode would let it propagate (no answer).
    """
    if isinstance(exc, plan.spec.retryable):
        return (yield from _after_transient_fault(plan, rec, exc, answer))
    if answer is None:
        # Propagating (handle_tool_errors does not cover it): the call raised, so it did
        # not apply. Say so before the error leaves, or the record stays "dispatched"
        # and a re-run (a retry policy, a retrying wrapper, a resume) declares it unknown.
        yield from transition_steps(
            from_dispatched(
                rec,
                EffectStatus.NOT_APPLIED,
                ctx.owner,
                error=repr(exc),
                detail={"propagated": True},
            ),
            lost_ok=True,
        )
        raise exc
    yield from transition_steps(
        from_dispatched(
            rec,
            EffectStatus.FAILED,
            ctx.owner,
            error=answer_text(answer),
        ),
        lost_ok=True,
    )
    return answer


def _after_transient_fault(
    plan: CallPlan, rec: EffectRecord, exc: BaseException, answer: Any
) -> Protocol[Any]:
    """A transient fault: the reconcile hook says whether the call applied.

    Raises:
        BaseException: ``exc`` again when the call did not apply and ToolNode would
            let it propagate (no answer).
    """
    outcome = yield Reconcile(plan.spec, rec.idempotency_key, rec.args)
    if outcome.status == "committed":
        result = {"content": result_text(outcome.result), "status": "success"}
        yield from transition_steps(
            TransitionRequest(
                effect_id=rec.effect_id,
                to=EffectStatus.COMMITTED,
                actor="reconciler",
                result=result,
                detail={"after_error": repr(exc)},
            ),
            lost_ok=True,
        )
        return ToolMessage(result["content"], name=plan.tool.name, tool_call_id=plan.call_id)
    if outcome.status == "not_applied":
        yield from transition_steps(
            TransitionRequest(
                effect_id=rec.effect_id,
                to=EffectStatus.NOT_APPLIED,
                actor="reconciler",
                error=repr(exc),
                detail={"after_error": repr(exc)},
            ),
            lost_ok=True,
        )
        if answer is None:
            raise exc
        return answer
    unknown = yield from mark_unknown_steps(rec, plan.spec, f"{exc!r}; {outcome.reason}")
    return replay_message(unknown, plan.call)


__all__ = ["failed"]

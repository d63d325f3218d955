"""Read-only calls: the short path, with no intent owed before they run.

A read changes nothing outside, so nothing is written before it goes; its
outcome is recorded after it returns (folded into the batch's next write), and
a re-run answers a settled read from its record. A stopped run drops a read
not yet begun; a read in flight may be abandoned when its tool allows it.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_cancel.execution.answers import (
    ABANDONED_READ,
    answer_text,
    is_error_answer,
    not_run,
    outcome_payload,
    replay,
)
from langgraph_cancel.execution.attempts import attempts
from langgraph_cancel.execution.cancel_check import drop_call
from langgraph_cancel.execution.context import CallContext
from langgraph_cancel.execution.plan import CallPlan
from langgraph_cancel.execution.steps import Abandoned, CancelCheck, Observe, Protocol
from langgraph_cancel.types import CancelPolicy, EffectRecord, EffectStatus


def run_read(
    request: ToolCallRequest, ctx: CallContext, plan: CallPlan, rec: EffectRecord | None
) -> Protocol[Any]:
    """The answer of a read-only call: from its record, or from running it."""
    if rec is not None:
        return replay(rec, plan.call)
    if (yield CancelCheck()):
        yield Observe()
        yield from drop_call(ctx, plan, None)
        return not_run(plan.call)
    abandon = plan.spec.cancel_policy is CancelPolicy.ABANDON
    try:
        answer, raised = yield from attempts(request, ctx, plan, abandon=abandon)
    except Abandoned:
        yield from ctx.batch.note_read(
            plan, status=EffectStatus.FAILED, error=ABANDONED_READ, detail={"abandoned": True}
        )
        return ToolMessage(
            ABANDONED_READ, name=plan.tool.name, tool_call_id=plan.call_id, status="error"
        )
    # Any other exception is not handled by ToolNode: the node fails, and a re-run runs
    # the read again (it changed nothing), so nothing is recorded.
    if raised is not None or is_error_answer(answer):
        yield from ctx.batch.note_read(plan, status=EffectStatus.FAILED, error=answer_text(answer))
    else:
        yield from ctx.batch.note_read(
            plan, status=EffectStatus.COMMITTED, result=outcome_payload(answer)
        )
    return answer


__all__ = ["run_read"]

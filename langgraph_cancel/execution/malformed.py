"""Calls no tool can run as asked: no id, no key, arguments off the schema, an unknown tool.

None of them is dispatched. ``ToolNode`` gives its own answer where it has one
(an unknown tool, arguments its validation refuses), and the call is recorded
``failed`` once, under its id, so the same call again finds its record. Should
the tool accept arguments the schema check doubted, the call is a regular one
after all: it is handed back to the protocol (``Accepted``) to take the guarded
path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp, is_invalid_resume
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_cancel.effects import EffectSpec
from langgraph_cancel.execution.answers import answer_text
from langgraph_cancel.execution.context import CallContext
from langgraph_cancel.execution.identity import (
    call_turn,
    history_of,
    recorded_call,
    reused_call_id,
)
from langgraph_cancel.execution.observed import ArgumentsAccepted, with_argument_check
from langgraph_cancel.execution.plan import CallPlan, Malformed, classify
from langgraph_cancel.execution.steps import Dispatch, Protocol, ledger_call
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import EffectKind, EffectStatus


@dataclass(frozen=True, slots=True)
class Accepted:
    """A call the schema check doubted and the tool accepted: a regular call after all.

    Attributes:
        plan: The call, classified without the schema check.
    """

    plan: CallPlan


def malformed_call(
    request: ToolCallRequest,
    ctx: CallContext,
    call: ToolCall,
    tool: BaseTool,
    spec: EffectSpec,
    problem: Malformed,
) -> Protocol[Any]:
    """The answer to a malformed call (recorded ``failed``), or ``Accepted``."""
    if problem.reason == "no_id":
        return ToolMessage(problem.text, name=tool.name, tool_call_id="", status="error")
    if problem.reason in ("key", "not_object"):
        yield from record_malformed(ctx, call, spec.kind, problem.text)
        return ToolMessage(
            problem.text, name=tool.name, tool_call_id=str(call["id"]), status="error"
        )
    # Arguments off the tool's schema: ToolNode's own answer (its message, or its
    # error with handle_tool_errors=False), from a run that validates and stops
    # before the tool's body. Should the tool accept them after all, the call is
    # a regular one and takes the guarded path.
    try:
        answer = yield Dispatch(with_argument_check(request, tool))
    except ArgumentsAccepted:
        plan = classify(
            ctx.batch.index_of(call),
            call,
            tool,
            spec,
            ctx.scope.thread_id,
            check=False,
            turn=call_turn(history_of(request.state), str(call["id"])),
        )
        assert isinstance(plan, CallPlan)
        return Accepted(plan)
    except GraphBubbleUp:
        raise
    except Exception as exc:
        if not is_invalid_resume(exc):
            yield from record_malformed(ctx, call, spec.kind, f"{type(exc).__name__}: {exc}")
        raise
    yield from record_malformed(ctx, call, spec.kind, answer_text(answer))
    return answer


def unguarded_call(
    request: ToolCallRequest, ctx: CallContext, call: ToolCall, kind: EffectKind
) -> Protocol[Any]:
    """A call no tool runs (an unknown tool): ToolNode answers it; recorded failed."""
    try:
        answer = yield Dispatch(request)
    except GraphBubbleUp:
        raise
    except Exception as exc:
        if not is_invalid_resume(exc):
            yield from record_malformed(ctx, call, kind, f"{type(exc).__name__}: {exc}")
        raise
    yield from record_malformed(ctx, call, kind, answer_text(answer))
    return answer


def record_malformed(ctx: CallContext, call: Any, kind: EffectKind, text: str) -> Protocol[None]:
    """Record a call that never ran as ``failed``, once: the same call again finds it."""
    recorded = recorded_call(call)
    for call_id in (str(recorded["id"]), reused_call_id(recorded)):
        rec, created = yield from ledger_call(
            Ledger.plan,
            thread_id=ctx.scope.thread_id,
            run_id=ctx.scope.run_id,
            tool_call_id=call_id,
            tool=recorded["name"],
            kind=kind,
            args=recorded["args"],
            status=EffectStatus.FAILED,
            error=text,
            owner=ctx.owner,
            actor=ctx.owner,
            detail={"malformed": True},
        )
        if created or (rec.tool == recorded["name"] and rec.args == recorded["args"]):
            return


__all__ = ["Accepted", "malformed_call", "record_malformed", "unguarded_call"]

"""The per-call effect protocol: what happens around one tool call, written once.

For every call that reaches a tool through ``ToolNode``'s ``wrap_tool_call`` seam:

1. Which record is this call's own ("same step?"); a call whose tool-call id names
   another call's record runs under an id of its own (``intent.py``).
2. Already settled? Answer from the ledger (``answers.py``: a re-run after an
   interrupt, a crash, a retry policy never calls the tool again).
3. Cancelled? Record the call ``dropped`` and answer "not run" (``cancel_check.py``).
4. Needs approval and has none? Ask, where it stands (``approval.py``).
5. The intent, durable before the call leaves the process (``dispatched``), after
   the checkpoint of the step that asked for it is saved (``dispatch.py``).
6. The handler: ``ToolNode``'s own execution (injection, validation, error
   handling, ``Command`` outputs, a tool's own ``interrupt()``), retried where
   that is safe (``attempts.py``).
7. The outcome: committed, failed, or (for an ambiguous fault) whatever the
   tool's reconcile hook finds; unknown, with an owner, when nobody can tell
   (``outcome.py``, ``failure.py``).

Read-only calls take a shorter path (``reads.py``): nothing outside changes, so
no intent is owed before they run; their outcomes are recorded after they
return. Calls no tool can run as asked are answered in ``malformed.py``.

This module is the entry and the router: it classifies the call, finds its
record, and sends it to the step its record's status calls for. Every piece of
I/O is a ``Step`` (``steps.py``) that a sync or an async driver answers; a batch
(``batch.py``) folds the ledger writes of a whole tool node execution into as
few statements as the semantics allow.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_cancel.effects import spec_of
from langgraph_cancel.errors import EffectConflictError
from langgraph_cancel.execution.answers import replay
from langgraph_cancel.execution.approval import ask_review, trust_review
from langgraph_cancel.execution.attempts import FIRST_RETRY_WAIT
from langgraph_cancel.execution.cancel_check import stopped_before_dispatch
from langgraph_cancel.execution.context import CallContext, ReviewMode
from langgraph_cancel.execution.dispatch import dispatch
from langgraph_cancel.execution.identity import (
    as_tool_call,
    ensure_same_call,
    history_of,
)
from langgraph_cancel.execution.intent import hold, moved_plan, plan_effect, planned_record
from langgraph_cancel.execution.malformed import Accepted, malformed_call, unguarded_call
from langgraph_cancel.execution.outcome import settle_in_flight, success_request
from langgraph_cancel.execution.plan import CallPlan, Malformed, classify
from langgraph_cancel.execution.reads import run_read
from langgraph_cancel.execution.steps import CancelCheck, DispatchCancelled, Protocol, ledger_call
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import EffectKind, EffectRecord, EffectStatus

logger = logging.getLogger("langgraph_cancel.tools")

#: Statuses from which a call is sent out (after approval, when it needs one).
DISPATCHABLE = (EffectStatus.PLANNED, EffectStatus.APPROVED, EffectStatus.NOT_APPLIED)


def intercept(request: ToolCallRequest, ctx: CallContext) -> Protocol[Any]:
    """The protocol of one call: its answer (a ``ToolMessage``, a ``Command``, a list)."""
    call = as_tool_call(request.tool_call)
    tool = request.tool
    if not call.get("id"):
        # No record can name it and no answer can reach it: nothing runs.
        return ToolMessage(
            "Error: tool call without an id cannot be tracked; not run.",
            name=str(call.get("name") or ""),
            tool_call_id="",
            status="error",
        )
    if tool is None:
        # Not a tool of the node, and no wrapper supplied one: ToolNode's own answer.
        return (yield from unguarded_call(request, ctx, call, EffectKind.IRREVERSIBLE))
    spec = spec_of(tool)
    index = ctx.batch.index_of(call)
    turn = ctx.batch.call_turn(history_of(request.state), str(call["id"]))
    classified = classify(index, call, tool, spec, ctx.scope.thread_id, turn=turn)
    if isinstance(classified, Malformed):
        answer = yield from malformed_call(request, ctx, call, tool, spec, classified)
        if not isinstance(answer, Accepted):
            return answer
        found, rec = yield from ctx.batch.lookup(answer.plan)
        return (yield from _route(request, ctx, found, rec))
    plan, rec = yield from ctx.batch.lookup(classified)
    replaced_by = (rec.approval or {}).get("replaced_by") if rec is not None else None
    if rec is not None and rec.status is EffectStatus.REJECTED and replaced_by:
        # A reviewer's edit moved the call to a new key: the new effect is its own.
        rec = yield from ledger_call(Ledger.get_effect, str(replaced_by))
        plan = replace(plan, own_id=rec.tool_call_id, key=rec.idempotency_key)
    if rec is not None and (conflict := _conflict(plan, rec)) is not None:
        return conflict
    return (yield from _route(request, ctx, plan, rec))


def _route(
    request: ToolCallRequest, ctx: CallContext, plan: CallPlan, rec: EffectRecord | None
) -> Protocol[Any]:
    """The short path for a read with nothing to replay it from; the effect path otherwise."""
    if plan.fast_read and (rec is None or rec.settled):
        return (yield from run_read(request, ctx, plan, rec))
    return (yield from _effect(request, ctx, plan, rec))


def _conflict(plan: CallPlan, rec: EffectRecord) -> ToolMessage | None:
    """The answer for a call whose id names another call's record; None when it is its own."""
    try:
        ensure_same_call(rec, plan.tool.name, plan.call.get("args"))
    except EffectConflictError as exc:
        logger.warning("%s", exc)
        return ToolMessage(str(exc), name=plan.tool.name, tool_call_id=plan.call_id, status="error")
    return None


def _effect(
    request: ToolCallRequest, ctx: CallContext, plan: CallPlan, rec: EffectRecord | None
) -> Protocol[Any]:
    """A side effect (or a read that needs approval), from wherever its record stands."""
    if not _fresh_dispatch(plan, rec):
        # Only a fresh dispatch carries the previous call's outcome along.
        yield from ctx.batch.flush_outcome()
    if rec is not None and ctx.batch.take_begun(rec):
        # Its intent went with the batch's plan; its checkpoint and the stop are
        # checked before it goes.
        return (yield from dispatch(request, ctx, plan, rec, begun=True))
    if rec is None:
        plan, planned = yield from planned_record(ctx, plan)
        if isinstance(planned, ToolMessage):
            return planned  # the key belongs to another effect: not dispatched
        rec = planned
        if (conflict := _conflict(plan, rec)) is not None:
            return conflict
    if rec.status is EffectStatus.DISPATCHED:
        # Left in flight by an earlier attempt (crash, cancelled task): settle it first.
        rec = yield from settle_in_flight(ctx, plan, rec)
        if rec.status is EffectStatus.DISPATCHED:
            return (yield from dispatch(request, ctx, plan, rec, redispatch=True))
    if rec.status in (EffectStatus.PLANNED, EffectStatus.PENDING_APPROVAL):
        unreviewed = rec.status is EffectStatus.PENDING_APPROVAL or plan.needs_review
        if unreviewed and ctx.review(request) == "ask":
            if (yield CancelCheck()):
                # A stopped run asks nobody: the call is dropped, as a queued one is.
                return (yield from stopped_before_dispatch(ctx, plan, rec))
            decided = yield from ask_review(ctx, plan, rec)
            if decided.effect_id != rec.effect_id:
                plan = replace(plan, own_id=decided.tool_call_id, key=decided.idempotency_key)
            rec = decided
            if rec.status is not EffectStatus.APPROVED:
                return replay(rec, plan.call)
        elif rec.status is EffectStatus.PENDING_APPROVAL:
            rec = yield from trust_review(ctx, rec)
    if plan.spec.held and rec.status in (EffectStatus.PLANNED, EffectStatus.APPROVED):
        return (yield from hold(ctx, plan, rec))
    if rec.status in DISPATCHABLE:
        return (yield from dispatch(request, ctx, plan, rec))
    return replay(rec, plan.call)


def _fresh_dispatch(plan: CallPlan, rec: EffectRecord | None) -> bool:
    """True when the call's next ledger write is its intent."""
    if rec is None:
        return False
    if rec.status is EffectStatus.PLANNED:
        return not plan.needs_review
    return rec.status in (EffectStatus.APPROVED, EffectStatus.NOT_APPLIED)


__all__ = [
    "DISPATCHABLE",
    "FIRST_RETRY_WAIT",
    "CallContext",
    "DispatchCancelled",
    "ReviewMode",
    "intercept",
    "moved_plan",
    "plan_effect",
    "success_request",
]

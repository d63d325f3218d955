"""The dispatch: the intent made durable, then the call sent out and its outcome recorded.

In this order, for every side effect: the checkpoint of the step that asked
for the call is saved; the run's signal is checked (a stopped run drops the
call, ``cancel_check.py``); the record moves to ``dispatched`` in a write that
is refused once the run no longer runs (the intent, durable before the call
leaves the process); the handler runs (``attempts.py``); the outcome is
recorded (``outcome.py``, ``failure.py``). A call a stop waited for has its
outcome streamed as ``settled`` once it is durable.
"""

from __future__ import annotations

import contextlib
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp, GraphInterrupt, is_invalid_resume
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_cancel.errors import (
    BatchSuperseded,
    CheckpointNotSavedError,
    DispatchRefusedError,
    IllegalTransitionError,
    LedgerError,
)
from langgraph_cancel.execution.answers import replay_message
from langgraph_cancel.execution.attempts import attempts
from langgraph_cancel.execution.cancel_check import stopped_before_dispatch
from langgraph_cancel.execution.context import CallContext
from langgraph_cancel.execution.failure import failed
from langgraph_cancel.execution.outcome import after_task_cancel, interrupted, returned
from langgraph_cancel.execution.plan import CallPlan
from langgraph_cancel.execution.settlement import (
    mark_never_sent_steps,
    mark_unknown_steps,
    start_running,
    stop_running,
)
from langgraph_cancel.execution.steps import (
    AwaitPlanSaved,
    CancelCheck,
    DispatchCancelled,
    IntentWriteCancelled,
    PlanWaitCancelled,
    Protocol,
    SettleWhenReturned,
    StoppedWaiting,
    ledger_call,
)
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.progress import ProgressKind, announce_effect
from langgraph_cancel.types import EffectRecord


def dispatch(
    request: ToolCallRequest,
    ctx: CallContext,
    plan: CallPlan,
    rec: EffectRecord,
    *,
    redispatch: bool = False,
    begun: bool = False,
) -> Protocol[Any]:
    """Send the call of ``rec`` out, its intent durable first; its answer.

    Args:
        request: The call as ``ToolNode`` hands it to the handler.
        ctx: The call's context.
        plan: The call.
        rec: Its record (``planned``, ``approved``, ``not_applied``; ``dispatched``
            with ``redispatch`` or ``begun``).
        redispatch: The record is already ``dispatched`` (a retry under the same key
            after an earlier attempt left it in flight): no new intent is written.
        begun: The record went ``dispatched`` with its batch's plan (``Batch.prepare``),
            written while the step's checkpoint was still being saved: it goes once
            that checkpoint is saved and the run is not stopped.
    """
    if begun:
        ready = yield from _begun_may_go(ctx, plan, rec)
        if ready is not None:
            return ready  # the run stopped first: the call never left the process
        return (yield from _send(request, ctx, plan, rec))
    begun_rec = yield from _write_intent(ctx, plan, rec, redispatch=redispatch)
    if not isinstance(begun_rec, EffectRecord):
        return begun_rec  # not dispatched: the answer from the record
    plan = plan.with_args(begun_rec.args)
    if plan.call is not request.tool_call:
        request = request.override(tool_call=plan.call)
    return (yield from _send(request, ctx, plan, begun_rec))


def _begun_may_go(ctx: CallContext, plan: CallPlan, rec: EffectRecord) -> Protocol[Any]:
    """The checks a begun call's intent was written ahead of: its step's checkpoint
    saved, the batch not superseded, the run not stopped. None when it may go;
    otherwise the record says it was never sent, and the answer is the call's
    as a stopped run's.

    Raises:
        CheckpointNotSavedError: The step's checkpoint was not saved in time.
        BatchSuperseded: The node's thread took the batch over.
        PlanWaitCancelled: The run's asyncio task was cancelled meanwhile.
    """
    try:
        ctx.batch.check_supervisor()
        yield AwaitPlanSaved(ctx.config, ctx.checkpoint_timeout)
    except (CheckpointNotSavedError, BatchSuperseded) as stopped:
        yield from mark_never_sent_steps(rec, ctx.owner, str(stopped))
        raise
    except PlanWaitCancelled:
        yield from mark_never_sent_steps(rec, ctx.owner, "the run's task was cancelled")
        raise
    if not (yield CancelCheck()):
        return None
    unsent = yield from mark_never_sent_steps(rec, ctx.owner, "the run was stopped")
    return (yield from stopped_before_dispatch(ctx, plan, unsent or rec))


def _write_intent(
    ctx: CallContext, plan: CallPlan, rec: EffectRecord, *, redispatch: bool
) -> Protocol[EffectRecord | ToolMessage]:
    """The ``dispatched`` record, durable before the call goes; or the answer of a call
    that does not go (the run stopped, or another writer moved the record first)."""
    batch = ctx.batch
    batch.check_supervisor()
    # The step that asked for this call must be on disk before it goes out, or a
    # crash would lose the call and the resume ask for it anew.
    yield AwaitPlanSaved(ctx.config, ctx.checkpoint_timeout)
    if (yield CancelCheck()):
        yield from batch.flush_outcome()
        return (yield from stopped_before_dispatch(ctx, plan, rec))
    try:
        begun = rec if redispatch else (yield from batch.begin(plan, rec))
    except IntentWriteCancelled as cancelled:
        # The run's task was cancelled while the intent was written: the call does not
        # go, and a durable intent says so before the cancellation goes on.
        if cancelled.intent is not None:
            yield from mark_never_sent_steps(
                cancelled.intent, ctx.owner, "the run's task was cancelled"
            )
        raise
    if isinstance(begun, DispatchRefusedError):
        ctx.scope.signal.set()
        return (yield from stopped_before_dispatch(ctx, plan, rec))
    if isinstance(begun, IllegalTransitionError):
        # Moved since it was read (a cancel node dropped it, a racing worker took it).
        return replay_message((yield from ledger_call(Ledger.get_effect, rec.effect_id)), plan.call)
    if isinstance(begun, Exception):
        raise begun  # the intent was not written: nothing was dispatched
    return begun


def _send(
    request: ToolCallRequest, ctx: CallContext, plan: CallPlan, rec: EffectRecord
) -> Protocol[Any]:
    """Run the handler on a ``dispatched`` call and record what became of it."""
    batch = ctx.batch
    start_running(rec.effect_id)
    still_running = False
    batch.started()
    try:
        answer, raised = yield from attempts(request, ctx, plan, record=rec)
    except StoppedWaiting as stop:
        still_running = True
        unknown = yield from mark_unknown_steps(rec, plan.spec, str(stop))
        yield SettleWhenReturned(stop.pending, rec, ctx.owner)
        yield from settled_if_awaited(ctx, rec)
        return replay_message(unknown, plan.call)
    except DispatchCancelled as cancelled:
        still_running = not cancelled.finished
        yield from after_task_cancel(ctx, plan, rec, cancelled)
        yield from settled_if_awaited(ctx, rec)
        raise
    except GraphInterrupt:
        # interrupt() inside the tool: the call paused before it finished, and
        # LangGraph runs it again from its start on resume (under the same key).
        yield from interrupted(ctx, rec)
        raise
    except (GraphBubbleUp, BatchSuperseded):
        raise
    except Exception as exc:
        if is_invalid_resume(exc):
            yield from interrupted(ctx, rec)  # the tool's own interrupt, answered invalidly
            raise
        answer = yield from failed(ctx, plan, rec, exc, None)
        yield from settled_if_awaited(ctx, rec)
        return answer
    finally:
        batch.finished()
        if not still_running:
            stop_running(rec.effect_id)
    answer = yield from returned(ctx, plan, rec, answer, raised, defer=True)
    yield from settled_if_awaited(ctx, rec)
    return answer


def settled_if_awaited(ctx: CallContext, rec: EffectRecord) -> Protocol[None]:
    """A call a stop waited for has its outcome: stream it (``settled``), durable first."""
    if not ctx.scope.conclude(rec.effect_id):
        return
    with contextlib.suppress(LedgerError):
        yield from ctx.batch.flush_outcome()
        settled = yield from ledger_call(Ledger.get_effect, rec.effect_id)
        announce_effect(ProgressKind.SETTLED, settled)


__all__ = ["dispatch", "settled_if_awaited"]

"""The per-call effect protocol: what happens around one tool call, written once.

For every call that reaches a tool through ``ToolNode``'s ``wrap_tool_call`` seam:

1. Which record is this call's own ("same step?"); a call whose tool-call id names
   another call's record runs under an id of its own.
2. Already settled? Answer from the ledger (a re-run after an interrupt, a crash,
   a retry policy never calls the tool again).
3. Cancelled? Record the call ``dropped`` and answer "not run".
4. Needs approval and has none? Ask, where it stands (``review.py``).
5. The intent, durable before the call leaves the process (``dispatched``), after
   the checkpoint of the step that asked for it is saved.
6. The handler: ``ToolNode``'s own execution (injection, validation, error
   handling, ``Command`` outputs, a tool's own ``interrupt()``).
7. The outcome: committed, failed, or (for an ambiguous fault) whatever the
   tool's reconcile hook finds; unknown, with an owner, when nobody can tell.

Read-only calls take a shorter path: nothing outside changes, so no intent is
owed before they run; their outcomes are recorded after they return.

Every piece of I/O is a ``Step`` (``steps.py``) that a sync or an async driver
answers; a batch (``batch.py``) folds the ledger writes of a whole tool node
execution into as few statements as the semantics allow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from langgraph.errors import GraphBubbleUp, GraphInterrupt, is_invalid_resume
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import interrupt

from langgraph_cancel.effects import EffectSpec, spec_of
from langgraph_cancel.errors import (
    ApprovalRequiredError,
    BatchSuperseded,
    DispatchRefusedError,
    DuplicateIdempotencyKeyError,
    EffectConflictError,
    IllegalTransitionError,
    LedgerError,
)
from langgraph_cancel.execution.answers import (
    ABANDONED_READ,
    NOT_RUN_CANCELLED,
    not_run,
    outcome_payload,
    replay,
    replay_message,
    result_text,
)
from langgraph_cancel.execution.identity import (
    as_tool_call,
    call_turn,
    ensure_same_call,
    history_of,
    own_record_steps,
    recorded_call,
    reused_call_id,
)
from langgraph_cancel.execution.observed import ArgumentsAccepted, Capture, with_argument_check
from langgraph_cancel.execution.plan import CallPlan, Malformed, classify
from langgraph_cancel.execution.review import (
    decision_request,
    edited_key,
    parse_review,
    replacement_steps,
    review_request,
    review_schema,
    reviewer_of,
)
from langgraph_cancel.execution.settlement import (
    apply_outcome_steps,
    mark_unknown_steps,
    start_running,
    stop_running,
)
from langgraph_cancel.execution.steps import (
    Abandoned,
    AwaitPlanSaved,
    CancelCheck,
    Dispatch,
    Observe,
    Pause,
    Protocol,
    Reconcile,
    SettleWhenReturned,
    StoppedWaiting,
    ledger_call,
)
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ordering import OrderingNote, ordering_note
from langgraph_cancel.progress import ProgressKind, announce_effect
from langgraph_cancel.runtime import RunScope
from langgraph_cancel.types import (
    CancelPolicy,
    EffectKind,
    EffectRecord,
    EffectStatus,
    TransitionRequest,
    utcnow,
)

if TYPE_CHECKING:
    from langgraph_cancel.execution.batch import Batch

logger = logging.getLogger("langgraph_cancel.tools")

#: Who reviews a call that needs approval: ask here, or trust a decision made elsewhere.
ReviewMode = Literal["ask", "trust"]
# Backoff before a tool's second attempt; it doubles for each attempt after that.
FIRST_RETRY_WAIT = 0.05


class DispatchCancelled(asyncio.CancelledError):
    """The run's asyncio task was cancelled while a call was in flight.

    The driver waited for the call within its grace (shielded); this carries what
    it found, for the protocol to record before the cancellation goes on.

    Attributes:
        finished: The call returned (or raised) within the grace.
        output: What it returned.
        error: What it raised.
        pending: The still-running call, when it did not finish.
    """

    def __init__(
        self,
        *,
        finished: bool,
        output: Any = None,
        error: BaseException | None = None,
        pending: Any = None,
    ) -> None:
        super().__init__("run task cancelled while a call was in flight")
        self.finished = finished
        self.output = output
        self.error = error
        self.pending = pending
        #: The exception ToolNode answered with ``output``, if it caught one.
        self.raised: BaseException | None = None


@dataclass(frozen=True, slots=True)
class CallContext:
    """What the protocol needs to act for one call.

    Attributes:
        scope: The run (ledger, thread, owner, cancel signal).
        batch: The tool node execution the call belongs to.
        config: The call's config (its step's checkpoint, the reviewer's identity).
        runtime: The call's ``ToolRuntime`` (or ``None`` outside a graph).
        cancel_timeout: Seconds a cancelled run still waits for a call in flight.
        checkpoint_timeout: Seconds a side effect waits for its step's checkpoint.
        review: ``"ask"`` interrupts for a call needing approval and having none;
            ``"trust"`` lets it go (someone else reviewed it, or nobody is to).
        capture: Whether ``ToolNode`` may turn a tool's exception into a message
            (``handle_tool_errors`` handles tool errors): then the exception is
            caught on its way, so a transient fault is still told from a failure.
    """

    scope: RunScope
    batch: Batch
    config: RunnableConfig
    runtime: Any
    cancel_timeout: float
    checkpoint_timeout: float
    review: Callable[[ToolCallRequest], ReviewMode]
    capture: bool = False

    @property
    def ledger(self) -> Ledger:
        """The run's ledger."""
        return self.scope.ledger

    @property
    def owner(self) -> str:
        """The worker acting for the run."""
        return self.scope.owner


# ------------------------------------------------------------------- entry
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
        return (yield from _unguarded(request, ctx, call, EffectKind.IRREVERSIBLE))
    spec = spec_of(tool)
    index = ctx.batch.index_of(call)
    turn = call_turn(history_of(request.state), str(call["id"]))
    classified = classify(index, call, tool, spec, ctx.scope.thread_id, turn=turn)
    if isinstance(classified, Malformed):
        return (yield from _malformed(request, ctx, call, tool, spec, classified))
    plan, rec = yield from ctx.batch.lookup(classified)
    replaced_by = (rec.approval or {}).get("replaced_by") if rec is not None else None
    if rec is not None and rec.status is EffectStatus.REJECTED and replaced_by:
        # A reviewer's edit moved the call to a new key: the new effect is its own.
        rec = yield from ledger_call(Ledger.get_effect, str(replaced_by))
        plan = replace(plan, own_id=rec.tool_call_id, key=rec.idempotency_key)
    if rec is not None and (conflict := _conflict(plan, rec)) is not None:
        return conflict
    if plan.fast_read and (rec is None or rec.settled):
        return (yield from _read(request, ctx, plan, rec))
    return (yield from _effect(request, ctx, plan, rec))


def _conflict(plan: CallPlan, rec: EffectRecord) -> ToolMessage | None:
    """The answer for a call whose id names another call's record; None when it is its own."""
    try:
        ensure_same_call(rec, plan.tool.name, plan.call.get("args"))
    except EffectConflictError as exc:
        logger.warning("%s", exc)
        return ToolMessage(str(exc), name=plan.tool.name, tool_call_id=plan.call_id, status="error")
    return None


# ------------------------------------------------------------ malformed
def _malformed(
    request: ToolCallRequest,
    ctx: CallContext,
    call: ToolCall,
    tool: BaseTool,
    spec: EffectSpec,
    problem: Malformed,
) -> Protocol[Any]:
    if problem.reason == "no_id":
        return ToolMessage(problem.text, name=tool.name, tool_call_id="", status="error")
    if problem.reason in ("key", "not_object"):
        yield from _record_malformed(ctx, call, spec.kind, problem.text)
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
        found, rec = yield from ctx.batch.lookup(plan)
        if plan.fast_read and (rec is None or rec.settled):
            return (yield from _read(request, ctx, found, rec))
        return (yield from _effect(request, ctx, found, rec))
    except GraphBubbleUp:
        raise
    except Exception as exc:
        if not is_invalid_resume(exc):
            yield from _record_malformed(ctx, call, spec.kind, f"{type(exc).__name__}: {exc}")
        raise
    yield from _record_malformed(ctx, call, spec.kind, _text_of(answer))
    return answer


def _unguarded(
    request: ToolCallRequest, ctx: CallContext, call: ToolCall, kind: EffectKind
) -> Protocol[Any]:
    """A call no tool runs (an unknown tool): ToolNode answers it; recorded failed."""
    try:
        answer = yield Dispatch(request)
    except GraphBubbleUp:
        raise
    except Exception as exc:
        if not is_invalid_resume(exc):
            yield from _record_malformed(ctx, call, kind, f"{type(exc).__name__}: {exc}")
        raise
    yield from _record_malformed(ctx, call, kind, _text_of(answer))
    return answer


def _record_malformed(ctx: CallContext, call: Any, kind: EffectKind, text: str) -> Protocol[None]:
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


# ----------------------------------------------------------------- reads
def _read(
    request: ToolCallRequest, ctx: CallContext, plan: CallPlan, rec: EffectRecord | None
) -> Protocol[Any]:
    if rec is not None:
        return replay(rec, plan.call)
    if (yield CancelCheck()):
        yield Observe()
        yield from _drop(ctx, plan, None)
        return not_run(plan.call)
    abandon = plan.spec.cancel_policy is CancelPolicy.ABANDON
    try:
        answer, raised = yield from _attempts(request, ctx, plan, abandon=abandon)
    except Abandoned:
        yield from ctx.batch.note_read(
            plan, status=EffectStatus.FAILED, error=ABANDONED_READ, detail={"abandoned": True}
        )
        return ToolMessage(
            ABANDONED_READ, name=plan.tool.name, tool_call_id=plan.call_id, status="error"
        )
    except BaseException:
        # Not handled by ToolNode: the node fails, and a re-run runs the read again (it
        # changed nothing), so nothing is recorded.
        raise
    if raised is not None or _is_error(answer):
        yield from ctx.batch.note_read(plan, status=EffectStatus.FAILED, error=_text_of(answer))
    else:
        yield from ctx.batch.note_read(
            plan, status=EffectStatus.COMMITTED, result=outcome_payload(answer)
        )
    return answer


# --------------------------------------------------------------- effects
def _effect(
    request: ToolCallRequest, ctx: CallContext, plan: CallPlan, rec: EffectRecord | None
) -> Protocol[Any]:
    batch = ctx.batch
    if not _fresh_dispatch(plan, rec):
        # Only a fresh dispatch carries the previous call's outcome along.
        yield from batch.flush_outcome()
    if rec is None:
        planned = yield from plan_effect(ctx, plan)
        if isinstance(planned, EffectRecord) and plan.needs_own_id(planned):
            # The id names another call's record (planned meanwhile): this call goes
            # under its own.
            plan, found = yield from moved_plan(ctx, plan)
            planned = found if found is not None else (yield from plan_effect(ctx, plan))
        if isinstance(planned, ToolMessage):
            return planned  # the key belongs to another effect: not dispatched
        rec = planned
        if (conflict := _conflict(plan, rec)) is not None:
            return conflict
    if rec.status is EffectStatus.DISPATCHED:
        # Left in flight by an earlier attempt (crash, cancelled task): settle it first.
        rec = yield from _settle_in_flight(ctx, plan, rec)
        if rec.status is EffectStatus.DISPATCHED:
            return (yield from _dispatch(request, ctx, plan, rec, redispatch=True))
    if rec.status in (EffectStatus.PLANNED, EffectStatus.PENDING_APPROVAL):
        unreviewed = rec.status is EffectStatus.PENDING_APPROVAL or plan.needs_review
        if unreviewed and ctx.review(request) == "ask":
            decided = yield from _review(ctx, plan, rec)
            if decided.effect_id != rec.effect_id:
                plan = replace(plan, own_id=decided.tool_call_id, key=decided.idempotency_key)
            rec = decided
            if rec.status is not EffectStatus.APPROVED:
                return replay(rec, plan.call)
        elif rec.status is EffectStatus.PENDING_APPROVAL:
            rec = yield from _trust(ctx, rec)
    if plan.spec.held and rec.status in (EffectStatus.PLANNED, EffectStatus.APPROVED):
        return (yield from _hold(ctx, plan, rec))
    if rec.status in (EffectStatus.PLANNED, EffectStatus.APPROVED, EffectStatus.NOT_APPLIED):
        return (yield from _dispatch(request, ctx, plan, rec))
    return replay(rec, plan.call)


def _hold(ctx: CallContext, plan: CallPlan, rec: EffectRecord) -> Protocol[Any]:
    """A call the package holds for its delay window: its intent goes to the outbox.

    Nothing leaves the process: the record moves to ``scheduled`` with its release
    time (refused, like a dispatch, once the run is no longer running), and the
    outbox sends it after the window (``langgraph_cancel.outbox``).
    """
    yield from ctx.batch.flush_outcome()
    yield AwaitPlanSaved(ctx.config, ctx.checkpoint_timeout)
    delay = plan.spec.delay
    if delay is None or (yield CancelCheck()):
        yield Observe()
        yield from _drop(ctx, plan, rec)
        return replay_message((yield from ledger_call(Ledger.get_effect, rec.effect_id)), plan.call)
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
        yield Observe()
        yield from _drop(ctx, plan, rec)
        held = yield from ledger_call(Ledger.get_effect, rec.effect_id)
    elif isinstance(held, Exception):
        held = yield from ledger_call(Ledger.get_effect, rec.effect_id)
    return replay_message(held, plan.call)


def _fresh_dispatch(plan: CallPlan, rec: EffectRecord | None) -> bool:
    """True when the call's next ledger write is its intent."""
    if rec is None:
        return False
    if rec.status is EffectStatus.PLANNED:
        return not plan.needs_review
    return rec.status in (EffectStatus.APPROVED, EffectStatus.NOT_APPLIED)


def _review(ctx: CallContext, plan: CallPlan, rec: EffectRecord) -> Protocol[EffectRecord]:
    """Ask a person about the call where it stands; the record with their decision.

    Raises:
        ApprovalRequiredError: The call runs outside a graph step, where nobody can
            be asked (the node invoked on its own).
    """
    try:
        get_config()
    except RuntimeError:
        raise ApprovalRequiredError(
            f"{plan.tool.name!r} needs approval ({plan.spec.why_permanent()}) and has none, "
            "and outside a graph step nobody can be asked: run the node in a graph, or "
            "classify the tool with effect(..., requires_approval=False) if it may run "
            "unasked"
        ) from None
    if rec.status is EffectStatus.PLANNED:
        try:
            rec = yield from ledger_call(
                Ledger.transition,
                rec.effect_id,
                EffectStatus.PENDING_APPROVAL,
                expected=[EffectStatus.PLANNED],
                actor="review",
                detail={"reason": "approval required"},
            )
        except IllegalTransitionError:
            rec = yield from ledger_call(Ledger.get_effect, rec.effect_id)
            if rec.status is not EffectStatus.PENDING_APPROVAL:
                return rec
    error: str | None = None
    ordering: OrderingNote | None = None
    if rec.kind is not EffectKind.IRREVERSIBLE:
        ran = yield from ledger_call(Ledger.run_effects, ctx.scope.run_id)
        ordering = ordering_note(ran, [rec.kind])
    while True:
        # On resume LangGraph re-runs the node and hands the saved answers back in
        # order, so this loop replays the invalid ones up to the new answer.
        question = review_request(plan.tool, plan.spec, rec, plan.call_id)
        if ordering is not None:
            question["ordering"] = ordering
        if error is not None:
            question["error"] = error
            question["description"] = (
                f"The answer was invalid: {error}. Decide again.\n\n{question['description']}"
            )
        answer = interrupt(question, response_schema=review_schema(plan.tool))
        try:
            review = parse_review(answer, plan.tool, plan.spec, rec)
        except ValueError as exc:
            error = str(exc)
            continue
        reviewer = review.reviewer or reviewer_of(ctx.config, ctx.runtime)
        new_key = edited_key(plan.spec, rec, review.args) if review.args is not None else None
        if new_key is None:
            try:
                return (yield from _transition(ctx, decision_request(rec, review, reviewer)))
            except IllegalTransitionError:
                # Moved meanwhile (a cancel dropped it): what it is now is the answer.
                return (yield from ledger_call(Ledger.get_effect, rec.effect_id))
        replaced = yield from replacement_steps(
            rec, plan.call, review, reviewer, new_key, ledger_id=plan.ledger_id, seq=plan.index
        )
        if isinstance(replaced, EffectRecord):
            return replaced
        error = replaced


def _trust(ctx: CallContext, rec: EffectRecord) -> Protocol[EffectRecord]:
    """A call someone else reviews (or nobody is to): approved, and said so."""
    try:
        return (
            yield from ledger_call(
                Ledger.transition,
                rec.effect_id,
                EffectStatus.APPROVED,
                expected=[EffectStatus.PENDING_APPROVAL],
                actor=ctx.owner,
                approval={"decision": "approve", "source": "delegated", "reviewer": ctx.owner},
                detail={"decision": "approve", "delegated": True},
            )
        )
    except IllegalTransitionError:
        return (yield from ledger_call(Ledger.get_effect, rec.effect_id))


def _dispatch(
    request: ToolCallRequest,
    ctx: CallContext,
    plan: CallPlan,
    rec: EffectRecord,
    *,
    redispatch: bool = False,
) -> Protocol[Any]:
    batch = ctx.batch
    batch.check_supervisor()
    # The step that asked for this call must be on disk before it goes out, or a
    # crash would lose the call and the resume ask for it anew.
    yield AwaitPlanSaved(ctx.config, ctx.checkpoint_timeout)
    if (yield CancelCheck()):
        yield from batch.flush_outcome()
        yield Observe()
        yield from _drop(ctx, plan, rec)
        return replay_message((yield from ledger_call(Ledger.get_effect, rec.effect_id)), plan.call)
    begun = rec if redispatch else (yield from batch.begin(plan, rec))
    if isinstance(begun, DispatchRefusedError):
        ctx.scope.signal.set()
        yield Observe()
        yield from _drop(ctx, plan, rec)
        return replay_message((yield from ledger_call(Ledger.get_effect, rec.effect_id)), plan.call)
    if isinstance(begun, IllegalTransitionError):
        # Moved since it was read (a cancel node dropped it, a racing worker took it).
        return replay_message((yield from ledger_call(Ledger.get_effect, rec.effect_id)), plan.call)
    if isinstance(begun, Exception):
        raise begun  # the intent was not written: nothing was dispatched
    rec = begun
    plan = plan.with_args(rec.args)
    if plan.call is not request.tool_call:
        request = request.override(tool_call=plan.call)
    start_running(rec.effect_id)
    still_running = False
    batch.started()
    try:
        answer, raised = yield from _attempts(request, ctx, plan, record=rec)
    except StoppedWaiting as stop:
        still_running = True
        unknown = yield from mark_unknown_steps(rec, plan.spec, str(stop))
        yield SettleWhenReturned(stop.pending, rec, ctx.owner)
        yield from _settled_if_awaited(ctx, rec)
        return replay_message(unknown, plan.call)
    except DispatchCancelled as cancelled:
        still_running = not cancelled.finished
        yield from _after_task_cancel(ctx, plan, rec, cancelled)
        yield from _settled_if_awaited(ctx, rec)
        raise
    except GraphInterrupt:
        # interrupt() inside the tool: the call paused before it finished, and
        # LangGraph runs it again from its start on resume (under the same key).
        yield from _interrupted(ctx, rec)
        raise
    except (GraphBubbleUp, BatchSuperseded):
        raise
    except Exception as exc:
        if is_invalid_resume(exc):
            yield from _interrupted(ctx, rec)  # the tool's own interrupt, answered invalidly
            raise
        failed = yield from _failed(ctx, plan, rec, exc, None)
        yield from _settled_if_awaited(ctx, rec)
        return failed
    finally:
        batch.finished()
        if not still_running:
            stop_running(rec.effect_id)
    returned = yield from _returned(ctx, plan, rec, answer, raised, defer=True)
    yield from _settled_if_awaited(ctx, rec)
    return returned


def _settled_if_awaited(ctx: CallContext, rec: EffectRecord) -> Protocol[None]:
    """A call a stop waited for has its outcome: stream it (``settled``), durable first."""
    if rec.effect_id not in ctx.scope.awaited:
        return
    ctx.scope.awaited.discard(rec.effect_id)
    with contextlib.suppress(LedgerError):
        yield from ctx.batch.flush_outcome()
        settled = yield from ledger_call(Ledger.get_effect, rec.effect_id)
        announce_effect(ProgressKind.SETTLED, settled)


def _returned(
    ctx: CallContext,
    plan: CallPlan,
    rec: EffectRecord,
    answer: Any,
    raised: BaseException | None,
    *,
    defer: bool,
) -> Protocol[Any]:
    """Record a dispatched call that came back with ``answer`` (``raised``: the exception
    ``ToolNode`` answered with it); the answer. ``defer``: a success may wait for the
    batch's next write."""
    if raised is not None:
        return (yield from _failed(ctx, plan, rec, raised, answer))
    if _is_error(answer):
        # The tool (or a wrapper inside this one) answered with an error: recorded as
        # a failure, with its words.
        yield from _transition(
            ctx,
            TransitionRequest(
                effect_id=rec.effect_id,
                to=EffectStatus.FAILED,
                expected=frozenset({EffectStatus.DISPATCHED}),
                actor=ctx.owner,
                error=_text_of(answer),
                detail={"reported": True},
            ),
            lost_ok=True,
        )
        return answer
    success = success_request(ctx, rec, answer, plan.spec)
    if defer:
        yield from ctx.batch.succeeded(success)
    else:
        yield from _transition(ctx, success, lost_ok=True)
    return answer


def success_request(
    ctx: CallContext, rec: EffectRecord, answer: Any, spec: EffectSpec | None = None
) -> TransitionRequest:
    """The outcome write of a call that returned.

    A call its provider holds for a delay window (``effect(..., delay=, revoke=)``)
    is recorded ``scheduled``, revocable until its release time, instead of committed.
    """
    if spec is not None and spec.delay is not None and spec.revoke is not None:
        return TransitionRequest(
            effect_id=rec.effect_id,
            to=EffectStatus.SCHEDULED,
            expected=frozenset({EffectStatus.DISPATCHED}),
            actor=ctx.owner,
            result=outcome_payload(answer),
            release_at=(rec.dispatched_at or utcnow()) + spec.delay,
        )
    return TransitionRequest(
        effect_id=rec.effect_id,
        to=EffectStatus.COMMITTED,
        expected=frozenset({EffectStatus.DISPATCHED}),
        actor=ctx.owner,
        result=outcome_payload(answer),
    )


def _attempts(
    request: ToolCallRequest,
    ctx: CallContext,
    plan: CallPlan,
    *,
    abandon: bool = False,
    record: EffectRecord | None = None,
) -> Protocol[tuple[Any, BaseException | None]]:
    """Run the handler, again for a transient fault when a retry cannot double the effect.

    Returns:
        The handler's answer, and the exception ``ToolNode`` turned into it (if any).
    """
    spec = plan.spec
    attempts = spec.max_attempts if spec.retry_safe else 1
    wait = FIRST_RETRY_WAIT
    for attempt in range(1, attempts + 1):
        capture = Capture() if ctx.capture else None
        step = Dispatch(
            capture.around(request) if capture is not None else request,
            grace=_grace(ctx, spec),
            abandon=abandon,
            record=record,
            spec=spec,
            key=plan.key,
        )
        last = attempt == attempts
        try:
            answer = yield step
        except DispatchCancelled as cancelled:
            cancelled.raised = capture.error if capture is not None else None
            raise
        except spec.retryable:
            if last:
                raise
        else:
            raised = capture.error if capture is not None else None
            if raised is None or last or not isinstance(raised, spec.retryable):
                return answer, raised
        yield Pause(wait)
        wait = min(wait * 2, 2.0)
    raise AssertionError("unreachable")  # pragma: no cover


def _grace(ctx: CallContext, spec: EffectSpec) -> float | None:
    """How long a cancelled run still waits for this tool's in-flight call."""
    if spec.kind is EffectKind.READ_ONLY and spec.cancel_policy is CancelPolicy.ABANDON:
        return None
    if spec.cancel_policy is CancelPolicy.RECONCILE:
        return 0.0
    return spec.cancel_timeout if spec.cancel_timeout is not None else ctx.cancel_timeout


def _failed(
    ctx: CallContext, plan: CallPlan, rec: EffectRecord, exc: BaseException, answer: Any
) -> Protocol[Any]:
    """Record a call that raised; its answer (``answer``: ToolNode's message for it).

    A transient fault on a side effect may have been applied: the tool's reconcile
    hook is asked. Any other exception means the call did not apply.

    Raises:
        BaseException: ``exc`` again when ToolNode would let it propagate (no answer).
    """
    spec = plan.spec
    if isinstance(exc, spec.retryable):
        outcome = yield Reconcile(spec, rec.idempotency_key, rec.args)
        if outcome.status == "committed":
            result = {"content": result_text(outcome.result), "status": "success"}
            yield from _transition(
                ctx,
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
            yield from _transition(
                ctx,
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
        unknown = yield from mark_unknown_steps(rec, spec, f"{exc!r}; {outcome.reason}")
        return replay_message(unknown, plan.call)
    if answer is None:
        # Propagating (handle_tool_errors does not cover it): the call raised, so it did
        # not apply. Say so before the error leaves, or the record stays "dispatched"
        # and a re-run (a retry policy, a retrying wrapper, a resume) declares it unknown.
        yield from _transition(
            ctx,
            TransitionRequest(
                effect_id=rec.effect_id,
                to=EffectStatus.NOT_APPLIED,
                expected=frozenset({EffectStatus.DISPATCHED}),
                actor=ctx.owner,
                error=repr(exc),
                detail={"propagated": True},
            ),
            lost_ok=True,
        )
        raise exc
    yield from _transition(
        ctx,
        TransitionRequest(
            effect_id=rec.effect_id,
            to=EffectStatus.FAILED,
            expected=frozenset({EffectStatus.DISPATCHED}),
            actor=ctx.owner,
            error=_text_of(answer),
        ),
        lost_ok=True,
    )
    return answer


def _interrupted(ctx: CallContext, rec: EffectRecord) -> Protocol[None]:
    """A call paused by its tool's own ``interrupt()``: it runs again on resume."""
    yield from _transition(
        ctx,
        TransitionRequest(
            effect_id=rec.effect_id,
            to=EffectStatus.NOT_APPLIED,
            expected=frozenset({EffectStatus.DISPATCHED}),
            actor=ctx.owner,
            detail={"interrupted": True},
        ),
        lost_ok=True,
    )


def _after_task_cancel(
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
                yield from _returned(
                    ctx, plan, rec, cancelled.output, cancelled.raised, defer=False
                )
        elif isinstance(cancelled.error, Exception):
            # Recorded; what goes on is the task's cancellation, not the tool's error.
            with contextlib.suppress(type(cancelled.error)):
                yield from _failed(ctx, plan, rec, cancelled.error, None)
    except LedgerError:
        logger.exception("could not record the outcome of %s", rec.effect_id)


def _settle_in_flight(
    ctx: CallContext, plan: CallPlan, rec: EffectRecord
) -> Protocol[EffectRecord]:
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


def _drop(ctx: CallContext, plan: CallPlan, existing: EffectRecord | None) -> Protocol[None]:
    """Record that the call never runs: the run was cancelled before its dispatch."""
    if existing is None:
        dropped, _created = yield from ledger_call(
            Ledger.plan,
            thread_id=ctx.scope.thread_id,
            run_id=ctx.scope.run_id,
            tool_call_id=plan.ledger_id,
            tool=plan.tool.name,
            kind=plan.spec.kind,
            args=plan.args,
            idempotency_key=plan.key,
            seq=plan.index,
            status=EffectStatus.DROPPED,
            error=NOT_RUN_CANCELLED,
            owner=ctx.owner,
            actor=ctx.owner,
        )
        announce_effect(ProgressKind.DROPPED, dropped)
    elif existing.status in (
        EffectStatus.PLANNED,
        EffectStatus.PENDING_APPROVAL,
        EffectStatus.APPROVED,
        EffectStatus.NOT_APPLIED,
    ):
        # Moved on meanwhile (dispatched by a sibling): whoever moved it settles it.
        try:
            moved = yield from ledger_call(
                Ledger.transition,
                existing.effect_id,
                EffectStatus.DROPPED,
                actor=ctx.owner,
                error=NOT_RUN_CANCELLED,
            )
        except IllegalTransitionError:
            return
        announce_effect(ProgressKind.DROPPED, moved)


def plan_effect(ctx: CallContext, plan: CallPlan) -> Protocol[EffectRecord | ToolMessage]:
    """The call's record (new or from an earlier attempt), or why it cannot have one.

    An idempotency key already held by another effect (the same refund asked for
    again, maybe in another thread) means the external system would treat this
    call as that one: it is not dispatched, and the model is told.
    """
    try:
        rec, _created = yield from ledger_call(
            Ledger.plan,
            thread_id=ctx.scope.thread_id,
            run_id=ctx.scope.run_id,
            tool_call_id=plan.ledger_id,
            tool=plan.tool.name,
            kind=plan.spec.kind,
            args=plan.args,
            idempotency_key=plan.key,
            seq=plan.index,
            owner=ctx.owner,
            actor=ctx.owner,
        )
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
    yield from ledger_call(
        Ledger.plan,
        thread_id=ctx.scope.thread_id,
        run_id=ctx.scope.run_id,
        tool_call_id=plan.ledger_id,
        tool=plan.tool.name,
        kind=plan.spec.kind,
        args=plan.args,
        idempotency_key=f"{plan.key}#duplicate:{ctx.scope.thread_id}:{plan.ledger_id}",
        seq=plan.index,
        status=EffectStatus.FAILED,
        error=text,
        owner=ctx.owner,
        actor=ctx.owner,
        detail={"duplicate_of": getattr(holder, "effect_id", None), "error": str(exc)},
    )
    return ToolMessage(text, name=plan.tool.name, tool_call_id=plan.call_id, status="error")


def moved_plan(ctx: CallContext, plan: CallPlan) -> Protocol[tuple[CallPlan, EffectRecord | None]]:
    """The call under the id of its own record (its tool-call id names another call's)."""
    own, found = yield from own_record_steps(
        ctx.scope.thread_id, plan.call, moved=True, base_id=plan.base_id
    )
    return plan.under_own_id(ctx.scope.thread_id, own), found


def _transition(
    ctx: CallContext, req: TransitionRequest, *, lost_ok: bool = False
) -> Protocol[EffectRecord]:
    """One compare-and-set; ``lost_ok``: another writer moved it first, its record stands."""
    try:
        return (
            yield from ledger_call(
                Ledger.transition,
                req.effect_id,
                req.to,
                expected=req.expected,
                actor=req.actor,
                detail=req.detail,
                **_optional_fields(req),
            )
        )
    except IllegalTransitionError as exc:
        if not lost_ok:
            raise
        logger.warning("could not record %s as %s: %s", req.effect_id, req.to.value, exc)
        return (yield from ledger_call(Ledger.get_effect, req.effect_id))


def _optional_fields(req: TransitionRequest) -> dict[str, Any]:
    """The fields of ``req`` that ``Ledger.transition`` takes only when given."""
    fields: dict[str, Any] = {}
    for name in ("result", "error", "next_action"):
        value = getattr(req, name)
        if value is not ...:
            fields[name] = value
    for name in ("owner", "approval", "args"):
        value = getattr(req, name)
        if value is not None:
            fields[name] = value
    return fields


def _is_error(answer: Any) -> bool:
    return isinstance(answer, ToolMessage) and answer.status == "error"


def _text_of(answer: Any) -> str:
    """The words of an answer, for a record's ``error``."""
    if isinstance(answer, ToolMessage):
        return result_text(answer.content)
    return str(outcome_payload(answer)["content"])


__all__ = [
    "FIRST_RETRY_WAIT",
    "CallContext",
    "DispatchCancelled",
    "ReviewMode",
    "intercept",
    "moved_plan",
    "plan_effect",
    "success_request",
]

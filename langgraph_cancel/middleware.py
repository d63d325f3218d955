"""``EffectMiddleware``: the same guarantees for agents built with ``create_agent``.

::

    agent = create_agent(model, tools, middleware=[EffectMiddleware()],
                         checkpointer=SqliteCancelSaver(...))

Its ``wrap_tool_call`` / ``awrap_tool_call`` are the effect interceptor that
``EffectToolNode`` puts on its own tool-call seam (``execution/interceptor.py``):
effect classification, a durable intent before each dispatch, replay instead of
re-execution, the cancel check before each dispatch, and a review (in LangChain's
per-call shape) for a call that needs approval and has none. Its
``wrap_model_call`` / ``awrap_model_call`` carry the run's lifecycle, with no graph
node of their own (the agent's graph is ``create_agent``'s, step for step): new
input starts the run, settling first what an earlier run left unknown and
answering, where they stand, the calls of a turn that was cut short; a model call
after a stop was asked for finishes the cancel instead and ends the agent; the
reply that ends the turn completes the run. ``create_agent`` runs a turn's
tool calls concurrently, so the plan order of ``EffectToolNode`` (reversible
before irreversible, one at a time) does not apply here.

With LangChain's ``HumanInTheLoopMiddleware``, pass it as ``approval=`` (in any
order in ``middleware=``): the tools it gates are its to review, and a call it
approved runs without being asked again; the others that need approval are asked
here. A reviewer's edit runs, and is recorded, as edited.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, NotRequired

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    ToolCall,
    ToolMessage,
)
from langgraph.config import get_config
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from langgraph_cancel.checkpointers.durable import PLAN_SAVE_TIMEOUT
from langgraph_cancel.execution.answers import placed_answers, with_answers
from langgraph_cancel.execution.call_lease import CALL_LEASES, call_lease_owner
from langgraph_cancel.execution.context import ReviewMode
from langgraph_cancel.execution.identity import dangling_tool_calls
from langgraph_cancel.execution.interceptor import DEFAULT_CANCEL_TIMEOUT, EffectInterceptor
from langgraph_cancel.execution.served import Classification, ServedEffects
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.flush import commit_before_flush
from langgraph_cancel.limits import LimitGuard, Limits, tokens_of
from langgraph_cancel.nodes.cancel import answer_dangling, finalize_cancel
from langgraph_cancel.nodes.reconcile import reconcile_thread
from langgraph_cancel.nodes.settings import REPORT_KEY, CancellationSettings
from langgraph_cancel.offloop import off_the_loop
from langgraph_cancel.progress import announce_cancelled
from langgraph_cancel.runtime import RunScope, check_durability, drop_scope, scope_for
from langgraph_cancel.types import RunStatus

if TYPE_CHECKING:
    from langchain.agents.middleware import HumanInTheLoopMiddleware

#: ``HumanInTheLoopMiddleware``'s state key for a reviewer's edits (by tool-call id).
HITL_EDITS_KEY = "hitl_edited_tool_calls"
#: Why an earlier run is closed when a new turn starts while it had not finished.
SUPERSEDED_REASON = "a new turn began before this run had finished"
#: ``RunScope.extra`` key: the id of the input message that opened the run's turn.
TURN_INPUT = "middleware_turn_input"
#: ``RunScope.extra`` key prefix: the calls of a ``return_direct`` batch not yet done.
DIRECT_BATCH = "middleware_direct_batch"
#: The closing reply of a stopped agent that came back to its model after the stop.
STOPPED_REPLY = "Stopped: this run was cancelled."


class CancelAgentState(AgentState[Any]):
    """``create_agent`` state plus the cancellation report."""

    cancellation_report: NotRequired[Annotated[dict[str, Any] | None, "langgraph_cancel"]]


class EffectMiddleware(AgentMiddleware[CancelAgentState, Any, Any]):
    """Effect classification, ledger, approval and cancel checks for ``create_agent``.

    Args:
        ledger: The ledger or its URL; default: it follows the checkpointer.
        approval: Who reviews a call that needs approval: ``True`` (default) asks
            here, where the call stands; a ``HumanInTheLoopMiddleware`` reviews the
            tools it gates (they are not asked about twice) and the others are asked
            here; ``False`` lets every call run without review.
        compensate_on_cancel: Undo committed reversible effects on cancel.
        cancel_timeout: Seconds to wait for in-flight calls on cancel.
        checkpoint_timeout: Seconds a side-effecting call waits for the checkpoint
            of the model step that asked for it before it is refused.
        limits: A run's budget and deadline (``Limits``): a breach stops the run
            as a cancel request would, naming the limit in the report.
        effects: Classifications by tool name (``effect(...)`` as a decorator, or a
            kind) for tools no ``effect(...)`` decorated: ones a middleware adds to
            a model request and serves from its ``wrap_tool_call``, or the agent's
            own. A name not given stays unclassified (irreversible, approval).
    """

    state_schema = CancelAgentState

    def __init__(
        self,
        *,
        ledger: Ledger | str | None = None,
        approval: bool | HumanInTheLoopMiddleware[Any, Any, Any] = True,
        compensate_on_cancel: bool = False,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
        checkpoint_timeout: float = PLAN_SAVE_TIMEOUT,
        limits: Limits | None = None,
        effects: Mapping[str, Classification] | None = None,
    ) -> None:
        super().__init__()
        self.served = ServedEffects(effects)
        self.ledger = ledger
        self.limits = limits
        self.approval = approval
        self._direct_lock = threading.Lock()
        self.interceptor = EffectInterceptor(
            ledger=ledger,
            cancel_timeout=cancel_timeout,
            checkpoint_timeout=checkpoint_timeout,
            review=self._review_mode,
        )
        self.settings = CancellationSettings(
            ledger=ledger,
            compensate_on_cancel=compensate_on_cancel,
            cancel_timeout=cancel_timeout,
            limits=limits,
        )

    # ------------------------------------------------------------ review
    def _review_mode(self, request: ToolCallRequest) -> ReviewMode:
        approval = self.approval
        if approval is True:
            return "ask"
        if approval is False:
            return "trust"
        gated: Mapping[str, Any] = getattr(approval, "interrupt_on", {})
        return "trust" if request.tool_call.get("name") in gated else "ask"

    # ---------------------------------------------------------- lifecycle
    def _scope(self, *, new_run: bool) -> RunScope:
        config = get_config()
        check_durability(config)
        scope = scope_for(config, ledger=self.ledger, new_run=new_run)
        if self.limits is not None and scope.limits is None and not scope.run.terminal:
            # Also when a resumed run's first model call is in a new process.
            scope.enforce(LimitGuard(self.limits, scope.ledger, scope.run))
        return scope

    @staticmethod
    def _has_thread() -> bool:
        """Whether the run has a thread. Without one each call's scope would be a
        ledger of its own, in memory, that nothing else sees: there is no run to
        start, check or close (the tool calls are still guarded, as ``ToolNode``
        runs without a thread), and no work is done, not even on an event loop's
        thread that a sync ``invoke`` inside async code blocks."""
        return bool((get_config().get("configurable") or {}).get("thread_id"))

    def wrap_model_call(self, request: ModelRequest[Any], handler: Callable[..., Any]) -> Any:
        """The run's lifecycle around each model call (no graph node of its own).

        New input starts the thread's run (closing first an earlier one that was cut
        short, its unanswered calls answered where they stand); a model call after
        the run was asked to stop finishes the cancel instead and ends the agent; a
        response that ends the turn completes the run. The thread's lease is held
        while the model is called (``langgraph_cancel.execution.call_lease``), so that
        a sweeper leaves a stop asked for meanwhile to this worker.
        """
        if not self._has_thread():
            return handler(request)
        turn = off_the_loop(self._open_turn, request)
        if turn.stop is not None:
            return turn.stop
        owner = call_lease_owner(turn.scope, get_config())
        with CALL_LEASES.holding(turn.scope, owner):
            response = handler(turn.request)
            return off_the_loop(self._close_step, turn, response)

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[..., Awaitable[Any]]
    ) -> Any:
        """Async ``wrap_model_call``; a cancelled task is recorded as a stop of the run."""
        if not self._has_thread():
            return await handler(request)
        turn = await asyncio.to_thread(self._open_turn, request)
        if turn.stop is not None:
            return turn.stop
        owner = call_lease_owner(turn.scope, get_config())
        async with CALL_LEASES.aholding(turn.scope, owner):
            try:
                response = await handler(turn.request)
            except asyncio.CancelledError:
                # What a server's stop does mid-model-call: the next turn finishes the
                # cancel.
                await turn.scope.atask_cancelled()
                raise
            return await asyncio.to_thread(self._close_step, turn, response)

    def _open_turn(self, request: ModelRequest[Any]) -> _Turn:
        """Before a model call: the run it belongs to, or the stop it must make."""
        state = request.state
        history = list(state.get("messages") or []) if isinstance(state, Mapping) else []
        scope = self._scope(new_run=False)
        dangling = dangling_tool_calls(history)
        if not _answers_new_input(history):
            if scope.run.status is RunStatus.COMPLETED:
                return _Turn(self._scope(new_run=True), request)  # more work after the end
            if scope.run.terminal or scope.cancel_called():
                return _Turn(scope, request, stop=self._stop(scope, state, history, dangling))
            return _Turn(scope, request)
        marker = getattr(history[-1], "id", None) if history else None
        answers: list[ToolMessage] = []
        if dangling or (not scope.run.terminal and scope.cancel_called()):
            answers = self._close_cut_short(scope, dangling)
            if answers:
                request = request.override(messages=with_answers(list(request.messages), answers))
        elif not scope.run.terminal and scope.extra.get(TURN_INPUT, marker) != marker:
            # The earlier turn ended where no model call saw it (a middleware's jump,
            # a reply stripped of its calls): it is over.
            with commit_before_flush():  # see ``_complete``
                scope.ledger.finish_run(scope.run_id, RunStatus.COMPLETED)
            drop_scope(scope)
        scope = self._scope(new_run=True)
        scope.extra[TURN_INPUT] = marker
        reconcile_thread(scope, self.settings, interactive=False)
        return _Turn(scope, request, history, answers)

    def _close_cut_short(self, earlier: RunScope, dangling: list[ToolCall]) -> list[ToolMessage]:
        """Close a run new input cut short (a stopped task, a failure, an interrupt
        nobody answered): its unanswered calls will never run now; they are recorded
        so and answered."""
        if not earlier.run.terminal:
            if not earlier.cancel_called():
                earlier.ledger.request_cancel(
                    earlier.thread_id, reason=SUPERSEDED_REASON, requested_by="langgraph-cancel"
                )
            finalize_cancel(earlier, self.settings, dangling)
            drop_scope(earlier)
        return answer_dangling(earlier, dangling)

    def _stop(
        self,
        scope: RunScope,
        state: Any,
        history: list[AnyMessage],
        dangling: list[ToolCall],
    ) -> ExtendedModelResponse[Any]:
        """Finish the cancel instead of calling the model, and end the agent."""
        scope.signal.observe()
        scope.enforce(None)
        report = finalize_cancel(scope, self.settings, dangling)
        payload = report.model_dump(mode="json")
        shown = state.get(REPORT_KEY) if isinstance(state, Mapping) else None
        result: list[BaseMessage] = []
        if isinstance(shown, Mapping) and shown.get("run_id") == report.run_id:
            # The stop was made and the agent came back to the model all the same
            # (a jump lost between hooks): a closing reply ends it by its shape.
            result.append(AIMessage(STOPPED_REPLY))
        else:
            announce_cancelled(report.run_id, report.thread_id, payload)
        messages = placed_answers(history, answer_dangling(scope, dangling), result)
        return ExtendedModelResponse(
            model_response=ModelResponse(result=result),
            command=Command(update={"messages": messages, REPORT_KEY: payload, "jump_to": "end"}),
        )

    def _close_step(self, turn: _Turn, response: Any) -> Any:
        """After a model call: count its tokens; complete the run if the turn ends."""
        model_response = response if isinstance(response, ModelResponse) else None
        messages = model_response.result if model_response is not None else [response]
        scope = turn.scope
        if self.limits is not None and self.limits.counts_tokens:
            scope.count_tokens(tokens_of([m for m in messages if isinstance(m, AIMessage)]))
        update: dict[str, Any] = {}
        if turn.answers:
            update["messages"] = placed_answers(turn.history, turn.answers, list(messages))
        if _ends_turn(messages, model_response):
            report = self._complete(scope)
            if report is not None:
                update[REPORT_KEY] = report
        if not update:
            return response
        if model_response is None:
            model_response = ModelResponse(result=list(messages))
        return ExtendedModelResponse(model_response=model_response, command=Command(update=update))

    def _complete(self, scope: RunScope) -> dict[str, Any] | None:
        """The turn is over: the run is completed, or its stop finished (its report)."""
        scope.enforce(None)
        run = scope.refresh()
        if run.status is RunStatus.RUNNING:
            # Its commit need not wait for the disk: this model step's checkpoint,
            # saved after it with a commit that waits, makes it durable first, and a
            # completion lost with the database leaves the run live, as a worker that
            # died before writing it does.
            with commit_before_flush():
                scope.ledger.finish_run(run.run_id, RunStatus.COMPLETED)
            scope.refresh()  # the next turn's input starts a run of its own
            return None
        if run.terminal:
            return None
        report = finalize_cancel(scope, self.settings, [])
        payload = report.model_dump(mode="json")
        announce_cancelled(report.run_id, report.thread_id, payload)
        return payload

    # --------------------------------------------------------- tool calls
    def _as_run(self, request: ToolCallRequest) -> ToolCallRequest:
        """The request as it will run: with a reviewer's edit, whatever the order of
        this middleware and ``HumanInTheLoopMiddleware`` (which applies the same edit
        again when it is inside this one)."""
        request = self.served.request(request)
        if request.tool is not None:
            self.settings.tools[request.tool.name] = request.tool
        state = request.state
        edits = state.get(HITL_EDITS_KEY) if isinstance(state, Mapping) else None
        edited = (
            (edits or {}).get(request.tool_call.get("id")) if isinstance(edits, Mapping) else None
        )
        if not isinstance(edited, Mapping) or not isinstance(edited.get("args"), Mapping):
            return request
        name = edited.get("name", request.tool_call["name"])
        call: ToolCall = {**request.tool_call, "name": name, "args": dict(edited["args"])}
        if name == request.tool_call["name"]:
            return request.override(tool_call=call)
        tools = getattr(request.runtime, "tools", None) or []
        tool = next((t for t in tools if t.name == name), None)
        return request.override(tool_call=call, tool=tool) if tool is not None else request

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Ledger-guarded execution of one tool call (sync agents)."""
        result: ToolMessage | Command[Any] = self.interceptor.wrap(self._as_run(request), handler)
        if _ends_with_batch(request) and self._has_thread():
            off_the_loop(self._settle_direct, request)
        return result

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Ledger-guarded execution of one tool call (async agents)."""
        result: ToolMessage | Command[Any] = await self.interceptor.awrap(
            self._as_run(request), handler
        )
        if _ends_with_batch(request) and self._has_thread():
            await asyncio.to_thread(self._settle_direct, request)
        return result

    def _settle_direct(self, request: ToolCallRequest) -> None:
        """A batch of ``return_direct`` tools ends the turn with no model call after it:
        the last of its calls to finish completes the run."""
        scope = self._scope(new_run=False)
        history = _history(request.state)
        batch = next((m for m in reversed(history) if isinstance(m, AIMessage)), None)
        if batch is None:
            return
        answered = {m.tool_call_id for m in history if isinstance(m, ToolMessage)}
        with self._direct_lock:
            waiting: set[str] = scope.extra.setdefault(
                f"{DIRECT_BATCH}:{batch.id}",
                {str(c["id"]) for c in batch.tool_calls if c["id"] not in answered},
            )
            waiting.discard(str(request.tool_call["id"]))
            if waiting:
                return
        self._complete(scope)


@dataclass(frozen=True, slots=True)
class _Turn:
    """What a model call belongs to.

    Attributes:
        scope: The run.
        request: The request to send on (a cut-short turn's calls answered in it).
        history: The thread's messages before the call.
        answers: Answers to a cut-short turn's calls, to place before the new input.
        stop: The reply instead of a model call, when the run was asked to stop.
    """

    scope: RunScope
    request: ModelRequest[Any]
    history: list[AnyMessage] = field(default_factory=list)
    answers: list[ToolMessage] = field(default_factory=list)
    stop: ExtendedModelResponse[Any] | None = None


def _history(state: Any) -> list[AnyMessage]:
    return list(state.get("messages") or []) if isinstance(state, Mapping) else []


def _answers_new_input(history: list[AnyMessage]) -> bool:
    """Whether a model call answers new input (a turn's first call), not tool results:
    something other than a tool's answer came after the last reply of the model."""
    for message in reversed(history):
        if isinstance(message, AIMessage):
            return False
        if not isinstance(message, ToolMessage):
            return True
    return True


def _ends_turn(messages: list[Any], response: ModelResponse[Any] | None) -> bool:
    """Whether ``create_agent`` ends the agent after this reply: no call left for its
    tools node (a structured response's call is answered in the reply itself)."""
    reply = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    if reply is None:
        return False
    if not reply.tool_calls:
        return True
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    if any(call["id"] not in answered for call in reply.tool_calls):
        return False
    return response is not None and response.structured_response is not None


def _ends_with_batch(request: ToolCallRequest) -> bool:
    """Whether the call's batch ends the turn: every tool it calls is ``return_direct``
    (``create_agent`` then goes to the end, not back to the model)."""
    if request.tool is None or not request.tool.return_direct:
        return False
    batch = next((m for m in reversed(_history(request.state)) if isinstance(m, AIMessage)), None)
    tools = {tool.name: tool for tool in getattr(request.runtime, "tools", None) or []}
    return batch is not None and all(
        getattr(tools.get(call["name"]), "return_direct", False) for call in batch.tool_calls
    )


__all__ = ["HITL_EDITS_KEY", "CancelAgentState", "EffectMiddleware"]

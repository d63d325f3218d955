"""``EffectMiddleware``: the same guarantees for agents built with ``create_agent``.

::

    agent = create_agent(model, tools, middleware=[EffectMiddleware()],
                         checkpointer=SqliteCancelSaver(...))

Its ``wrap_tool_call`` / ``awrap_tool_call`` are the effect interceptor that
``EffectToolNode`` puts on its own tool-call seam (``execution/interceptor.py``):
effect classification, a durable intent before each dispatch, replay instead of
re-execution, the cancel check before each dispatch, and a review (in LangChain's
per-call shape) for a call that needs approval and has none. Its other hooks
start and close the run, settle on new input what an earlier run left unknown,
and finish a cancel before the next model call. ``create_agent`` runs a turn's
tool calls concurrently, so the plan order of ``EffectToolNode`` (reversible
before irreversible, one at a time) does not apply here.

With LangChain's ``HumanInTheLoopMiddleware``, pass it as ``approval=`` (in any
order in ``middleware=``): the tools it gates are its to review, and a call it
approved runs without being asked again; the others that need approval are asked
here. A reviewer's edit runs, and is recorded, as edited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, NotRequired

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    hook_config,
)
from langchain_core.messages import AIMessage, AnyMessage, RemoveMessage, ToolCall, ToolMessage
from langgraph.config import get_config
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command

from langgraph_cancel.checkpointers.durable import PLAN_SAVE_TIMEOUT
from langgraph_cancel.execution.identity import dangling_tool_calls
from langgraph_cancel.execution.interceptor import DEFAULT_CANCEL_TIMEOUT, EffectInterceptor
from langgraph_cancel.execution.offloop import off_the_loop
from langgraph_cancel.execution.protocol import ReviewMode
from langgraph_cancel.graph import (
    REPORT_KEY,
    CancellationSettings,
    answer_dangling,
    finalize_cancel,
    reconcile_thread,
)
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.limits import LimitGuard, Limits, tokens_of
from langgraph_cancel.progress import announce_cancelled
from langgraph_cancel.runtime import RunScope, check_durability, drop_scope, scope_for
from langgraph_cancel.types import RunStatus

if TYPE_CHECKING:
    from langchain.agents.middleware import HumanInTheLoopMiddleware

#: ``HumanInTheLoopMiddleware``'s state key for a reviewer's edits (by tool-call id).
HITL_EDITS_KEY = "hitl_edited_tool_calls"
#: Why an earlier run is closed when a new turn starts while it had not finished.
SUPERSEDED_REASON = "a new turn began before this run had finished"


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
    ) -> None:
        super().__init__()
        self.ledger = ledger
        self.limits = limits
        self.approval = approval
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
            # Also when a resumed run's first hook is not before_agent (a new process).
            scope.enforce(LimitGuard(self.limits, scope.ledger, scope.run))
        return scope

    @staticmethod
    def _has_thread() -> bool:
        """Whether the run has a thread. Without one each hook's scope would be a
        ledger of its own, in memory, that nothing else sees: the hooks have nothing
        to start, check or close (the tool calls are still guarded, as ``ToolNode``
        runs without a thread), and they do no work, not even on an event loop's
        thread that a sync ``invoke`` inside async code blocks."""
        return bool((get_config().get("configurable") or {}).get("thread_id"))

    def _run_hook(
        self,
        hook: Callable[[CancelAgentState, Runtime[Any]], dict[str, Any] | None],
        state: CancelAgentState,
        runtime: Runtime[Any],
    ) -> dict[str, Any] | None:
        """``hook`` off an event loop's thread; nothing without a thread."""
        if not self._has_thread():
            return None
        return off_the_loop(hook, state, runtime)

    def before_agent(self, state: CancelAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Start the thread's run; first close an earlier one new input cut short."""
        return self._run_hook(self._before_agent, state, runtime)

    def _before_agent(
        self, state: CancelAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Start the thread's run; first close an earlier one new input cut short.

        Tool calls an earlier turn left unanswered (a stopped task, a failure, an
        interrupt nobody answered) will never run now: they are recorded so,
        answered, and the answers placed right after the calls, before the new
        input, as providers require. What an earlier run left unknown is settled
        through the tools' reconcile hooks.
        """
        messages = list(state.get("messages") or [])
        dangling = dangling_tool_calls(messages)
        update: dict[str, Any] | None = None
        if dangling:
            earlier = self._scope(new_run=False)
            if not earlier.run.terminal:
                if not earlier.cancel_called():
                    earlier.ledger.request_cancel(
                        earlier.thread_id,
                        reason=SUPERSEDED_REASON,
                        requested_by="langgraph-cancel",
                    )
                finalize_cancel(earlier, self.settings, dangling)
                drop_scope(earlier)
            update = {"messages": _answered_in_place(messages, answer_dangling(earlier, dangling))}
        scope = self._scope(new_run=True)
        reconcile_thread(scope, self.settings, interactive=False)
        return update

    async def abefore_agent(
        self, state: CancelAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async ``before_agent``."""
        if not self._has_thread():
            return None
        return await _off_loop(self._before_agent, state, runtime)

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: CancelAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """The step-boundary check: once cancel is requested, finish the cancel and end."""
        return self._run_hook(self._before_model, state, runtime)

    def _before_model(
        self, state: CancelAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """The step-boundary check: once cancel is requested, finish the cancel and end."""
        scope = self._scope(new_run=False)
        if not (scope.run.terminal or scope.cancel_called()):
            return None
        scope.signal.observe()
        scope.enforce(None)
        dangling = dangling_tool_calls(list(state.get("messages") or []))
        report = finalize_cancel(scope, self.settings, dangling)
        payload = report.model_dump(mode="json")
        announce_cancelled(report.run_id, report.thread_id, payload)
        return {
            "messages": answer_dangling(scope, dangling),
            REPORT_KEY: payload,
            "jump_to": "end",
        }

    @hook_config(can_jump_to=["end"])
    async def abefore_model(
        self, state: CancelAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async ``before_model``."""
        if not self._has_thread():
            return None
        return await _off_loop(self._before_model, state, runtime)

    def wrap_model_call(self, request: ModelRequest[Any], handler: Callable[..., Any]) -> Any:
        """Count the model's tokens for the run's budget (when it has limits)."""
        response = handler(request)
        if self.limits is not None and self.limits.counts_tokens:
            off_the_loop(self._count_tokens, response)
        return response

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[..., Awaitable[Any]]
    ) -> Any:
        """Async ``wrap_model_call``."""
        response = await handler(request)
        if self.limits is not None and self.limits.counts_tokens:
            await asyncio.to_thread(self._count_tokens, response)
        return response

    def _count_tokens(self, response: Any) -> None:
        if isinstance(response, ExtendedModelResponse):
            response = response.model_response
        messages = [response] if isinstance(response, AIMessage) else response.result
        self._scope(new_run=False).count_tokens(tokens_of(messages))

    def after_agent(self, state: CancelAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Close the run when the agent finished without a cancel."""
        return self._run_hook(self._after_agent, state, runtime)

    def _after_agent(self, state: CancelAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Close the run when the agent finished without a cancel."""
        scope = self._scope(new_run=False)
        scope.enforce(None)
        run = scope.refresh()
        if run.status is RunStatus.RUNNING:
            scope.ledger.finish_run(run.run_id, RunStatus.COMPLETED)
        elif not run.terminal:
            finalize_cancel(scope, self.settings, [])
        return None

    async def aafter_agent(
        self, state: CancelAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async ``after_agent``."""
        if not self._has_thread():
            return None
        return await _off_loop(self._after_agent, state, runtime)

    # --------------------------------------------------------- tool calls
    def _as_run(self, request: ToolCallRequest) -> ToolCallRequest:
        """The request as it will run: with a reviewer's edit, whatever the order of
        this middleware and ``HumanInTheLoopMiddleware`` (which applies the same edit
        again when it is inside this one)."""
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
        return result


def _answered_in_place(messages: list[AnyMessage], answers: list[ToolMessage]) -> list[Any]:
    """The history with ``answers`` right after the calls they answer.

    When the unanswered calls' message is the last one, the answers are appended;
    otherwise (new input came after them) the history is rewritten in order.
    """
    answered = {answer.tool_call_id for answer in answers}
    at = max(
        (
            index
            for index, message in enumerate(messages)
            if isinstance(message, AIMessage)
            and any(call.get("id") in answered for call in message.tool_calls)
        ),
        default=len(messages) - 1,
    )
    # Past the message with the calls, and past the answers it already has.
    end = at + 1
    while end < len(messages) and isinstance(messages[end], ToolMessage):
        end += 1
    if end >= len(messages):
        return list(answers)
    return [
        RemoveMessage(id=REMOVE_ALL_MESSAGES),
        *messages[:end],
        *answers,
        *messages[end:],
    ]


async def _off_loop(
    hook: Callable[[CancelAgentState, Runtime[Any]], dict[str, Any] | None],
    state: CancelAgentState,
    runtime: Runtime[Any],
) -> dict[str, Any] | None:
    """Run a hook's blocking ledger work in a thread (it copies the node's context)."""
    return await asyncio.to_thread(hook, state, runtime)


__all__ = ["HITL_EDITS_KEY", "CancelAgentState", "EffectMiddleware"]

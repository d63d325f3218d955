"""``EffectMiddleware``: the same guarantees for agents built with ``create_agent``.

::

    agent = create_agent(model, tools, middleware=[EffectMiddleware()],
                         checkpointer=SqliteCancelSaver(...))

It gives every tool call effect classification, a durable intent record,
replay instead of re-execution, the cancel check before each dispatch and
before each model call, approval before irreversible calls (the same
HITL-shaped interrupt as ``ApprovalGate``) and, on cancel, the cancellation
report in the agent's state. ``create_agent`` runs a turn's tool calls
concurrently, so the plan-order guarantee of ``EffectToolNode`` (reversible
before irreversible, one at a time) does not apply here; use
``EffectToolNode`` in your own graph when it matters.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    hook_config,
)
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command

from langgraph_cancel.checkpointers.durable import PLAN_SAVE_TIMEOUT
from langgraph_cancel.graph import (
    REPORT_KEY,
    CancellationSettings,
    _answer_dangling,
    _messages,
    finalize_cancel,
    reconcile_thread,
)
from langgraph_cancel.hooks import run_sync as _run_sync
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.nodes.tool_node import (
    EffectToolNode,
    _Planned,
    dangling_tool_calls,
)
from langgraph_cancel.runtime import RunScope, check_durability, scope_for
from langgraph_cancel.types import EffectKind, RunStatus

Handler = Callable[[ToolCallRequest], Any]

_handler: contextvars.ContextVar[tuple[Handler, bool] | None] = contextvars.ContextVar(
    "langgraph_cancel_mw_handler", default=None
)
_request: contextvars.ContextVar[ToolCallRequest | None] = contextvars.ContextVar(
    "langgraph_cancel_mw_request", default=None
)


class ToolReportedError(Exception):
    """The agent's tool node answered a side-effecting call with an error message."""

    def __init__(self, message: ToolMessage) -> None:
        self.message = message
        super().__init__(str(message.content))


class _HandlerExecutor(EffectToolNode):
    """EffectToolNode's ledger logic around ``create_agent``'s own tool execution."""

    async def _invoke(self, p: _Planned, input_type: Any, *, retry: bool) -> Any:
        found = _handler.get()
        request = _request.get()
        assert found is not None and request is not None
        handler, is_async = found
        req = request.override(tool_call=p.call)
        from langgraph_cancel.effects import bound_idempotency_key

        with bound_idempotency_key(p.key):
            if is_async:
                response = await handler(req)
            else:
                response = await asyncio.to_thread(handler, req)
        if isinstance(response, ToolMessage) and response.status == "error":
            raise ToolReportedError(response)
        return response

    def _failure_content(self, exc: Exception) -> str:
        if isinstance(exc, ToolReportedError):
            return str(exc.message.content)
        return super()._failure_content(exc)


class CancelAgentState(AgentState[Any]):
    """``create_agent`` state plus the cancellation report."""

    cancellation_report: NotRequired[Annotated[dict[str, Any] | None, "langgraph_cancel"]]


class EffectMiddleware(AgentMiddleware[CancelAgentState, Any, Any]):
    """Effect classification, ledger, approval and cancel checks for ``create_agent``.

    Args:
        ledger: The ledger or its URL; default: the checkpointer's, else
            ``$LANGGRAPH_CANCEL_DB``, else the embedded SQLite file.
        approval: Ask a person before calls that need approval (default on).
        compensate_on_cancel: Undo committed reversible effects on cancel.
        cancel_timeout: Seconds to wait for in-flight calls on cancel.
        checkpoint_timeout: Seconds a side-effecting call waits for the checkpoint
            of the model step that asked for it before it is refused (see
            ``EffectToolNode``).
    """

    state_schema = CancelAgentState

    def __init__(
        self,
        *,
        ledger: Ledger | str | None = None,
        approval: bool = True,
        compensate_on_cancel: bool = False,
        cancel_timeout: float = 30.0,
        checkpoint_timeout: float = PLAN_SAVE_TIMEOUT,
    ) -> None:
        super().__init__()
        if not checkpoint_timeout > 0:
            raise ValueError("checkpoint_timeout must be a positive number of seconds")
        self.checkpoint_timeout = checkpoint_timeout
        self.tools: list[BaseTool] = []
        self.ledger = ledger
        self.approval = approval
        self.settings = CancellationSettings(
            ledger=ledger,
            compensate_on_cancel=compensate_on_cancel,
            cancel_timeout=cancel_timeout,
        )
        self._executors: dict[str, _HandlerExecutor] = {}

    # ----------------------------------------------------------- lifecycle
    def _scope(self, *, new_run: bool) -> RunScope:
        config = get_config()
        check_durability(config)
        return scope_for(config, ledger=self.ledger, new_run=new_run)

    def before_agent(self, state: CancelAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Start (or continue) the thread's run and settle what an earlier run left unknown."""
        scope = self._scope(new_run=True)
        reconcile_thread(scope, self.settings, interactive=False)
        return None

    async def abefore_agent(
        self, state: CancelAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async ``before_agent``."""
        return await asyncio.to_thread(self.before_agent, state, runtime)

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: CancelAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """The step-boundary check: once cancel is requested, finish the cancel and end."""
        scope = self._scope(new_run=False)
        if not (scope.run.terminal or scope.cancel_called()):
            return None
        scope.signal.observe()
        dangling = dangling_tool_calls(_messages(state, "messages"))
        report = finalize_cancel(scope, self.settings, dangling)
        return {
            "messages": _answer_dangling(scope, dangling),
            REPORT_KEY: report.model_dump(mode="json"),
            "jump_to": "end",
        }

    @hook_config(can_jump_to=["end"])
    async def abefore_model(
        self, state: CancelAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async ``before_model``."""
        return await asyncio.to_thread(self.before_model, state, runtime)

    def after_model(self, state: CancelAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Approval before irreversible calls: one HITL-shaped interrupt per turn."""
        if not self.approval:
            return None
        from langgraph_cancel.nodes.approval import ApprovalGate

        gate = ApprovalGate(list(_known_tools(self).values()), ledger=self.ledger)
        update: dict[str, Any] | None = gate._func(state, get_config(), runtime)
        return update

    def after_agent(self, state: CancelAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Close the run when the agent finished without a cancel."""
        scope = self._scope(new_run=False)
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
        return await asyncio.to_thread(self.after_agent, state, runtime)

    # ---------------------------------------------------------- tool calls
    def _executor(self, tool: BaseTool) -> _HandlerExecutor:
        found = self._executors.get(tool.name)
        if found is None or found.tools_by_name.get(tool.name) is not tool:
            found = self._executors[tool.name] = _HandlerExecutor(
                [tool],
                ledger=self.ledger,
                cancel_timeout=self.settings.cancel_timeout,
                checkpoint_timeout=self.checkpoint_timeout,
            )
            self.settings.tools[tool.name] = tool
        return found

    async def _guarded(self, request: ToolCallRequest, handler: Handler, is_async: bool) -> Any:
        tool = request.tool
        if tool is None:  # unknown tool: let the agent's tool node answer it
            result = handler(request)
            return await result if is_async else result
        executor = self._executor(tool)
        scope = await asyncio.to_thread(
            scope_for, request.runtime.config, ledger=self.ledger, new_run=False
        )
        planned, error = await asyncio.to_thread(
            executor._classify, 0, request.tool_call, request.runtime, scope
        )
        if error is not None:
            return error
        assert planned is not None
        from langgraph_cancel.nodes.tool_node import _offload

        _offload.set(is_async)  # async agents: ledger I/O off the event loop
        tokens = (_handler.set((handler, is_async)), _request.set(request))
        try:
            runner = (
                executor._run_read
                if planned.spec.kind is EffectKind.READ_ONLY
                else executor._run_effect
            )
            return await runner(planned, request, "tool_calls", scope)
        finally:
            _handler.reset(tokens[0])
            _request.reset(tokens[1])

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Ledger-guarded execution of one tool call (sync agents)."""
        result: ToolMessage | Command[Any] = _run_sync(self._guarded(request, handler, False))
        return result

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Ledger-guarded execution of one tool call (async agents)."""
        result: ToolMessage | Command[Any] = await self._guarded(request, handler, True)
        return result


def _known_tools(mw: EffectMiddleware) -> dict[str, BaseTool]:
    from langgraph_cancel.nodes.tool_node import TOOL_REGISTRY

    return {**TOOL_REGISTRY, **mw.settings.tools}


__all__ = ["CancelAgentState", "EffectMiddleware", "ToolReportedError"]

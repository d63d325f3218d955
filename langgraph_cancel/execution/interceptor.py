"""``EffectInterceptor``: the effect protocol on ``ToolNode``'s own tool-call seam.

``ToolNode(wrap_tool_call=..., awrap_tool_call=...)`` hands every call to a
wrapper with a ``ToolCallRequest`` and the handler that runs it; ``create_agent``
middleware uses the same seam. The interceptor is such a wrapper: around the
handler it checks the cancel signal, asks for approval where it is needed and
missing, writes the intent durably, and records the outcome; on a re-run it
answers from the ledger instead of calling the handler. Everything else (error
handling, injection, ``Command`` outputs, a tool's own ``interrupt()``) is the
handler's, that is ``ToolNode``'s own.

``EffectToolNode`` is ``ToolNode`` with this interceptor inside the user's own
``wrap_tool_call`` (theirs outermost); ``EffectMiddleware`` is this interceptor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp, is_invalid_resume
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_cancel.checkpointers.durable import PLAN_SAVE_TIMEOUT
from langgraph_cancel.effects import spec_of
from langgraph_cancel.errors import LedgerError
from langgraph_cancel.execution.batch import Batch
from langgraph_cancel.execution.call_lease import CALL_LEASES, call_lease_owner
from langgraph_cancel.execution.context import CallContext, ReviewMode
from langgraph_cancel.execution.drivers import AsyncDriver, SyncDriver
from langgraph_cancel.execution.protocol import intercept
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.runtime import RunScope, check_durability, invocation_scope, scope_for
from langgraph_cancel.types import EffectKind

DEFAULT_CANCEL_TIMEOUT = 30.0

Handler = Callable[[ToolCallRequest], Any]
AsyncHandler = Callable[[ToolCallRequest], Awaitable[Any]]
Review = ReviewMode | Callable[[ToolCallRequest], ReviewMode]


class Carried(BaseException):
    """An error that must leave ``EffectToolNode`` as it is, carried past the error
    handling ``ToolNode`` applies to whatever a ``wrap_tool_call`` raises.

    A ledger failure fails the node (typed) instead of reaching the model as a tool
    error; a tool's exception that ``ToolNode``'s own execution let through leaves
    the node as it leaves a ``ToolNode`` without a wrapper. ``EffectToolNode``
    raises ``error`` at the end of its batch.

    Attributes:
        error: The error itself.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class EffectInterceptor:
    """The per-call effect protocol as a ``wrap_tool_call`` / ``awrap_tool_call`` pair.

    Args:
        ledger: The ledger (or its URL); default: it follows the checkpointer
            (``langgraph_cancel.ledgers``).
        cancel_timeout: Seconds a cancelled run still waits for a call in flight
            before it is recorded unknown (a tool's own ``cancel_timeout`` wins).
        checkpoint_timeout: Seconds a side effect waits for the checkpoint of the
            step that asked for it before it is refused (``CheckpointNotSavedError``).
        review: ``"ask"`` (default): a call that needs approval and has none
            interrupts where it stands; ``"trust"``: it runs (another reviewer, or
            nobody); or a function of the request choosing per call.
        capture: ``ToolNode`` turns tool errors into messages (``handle_tool_errors``
            covers them): note each exception on its way, to tell a transient fault
            from a failure.
        carry_ledger_errors: Raise ledger failures past ``ToolNode``'s error
            handling (``EffectToolNode`` unwraps them at the end of its batch).
        carry_tool_errors: Likewise for the exceptions ``ToolNode``'s execution let
            through (a node with no wrapper of the user's: ``ToolNode`` without one
            lets them leave the node).
    """

    def __init__(
        self,
        *,
        ledger: Ledger | str | None = None,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
        checkpoint_timeout: float = PLAN_SAVE_TIMEOUT,
        review: Review = "ask",
        capture: bool = False,
        carry_ledger_errors: bool = False,
        carry_tool_errors: bool = False,
    ) -> None:
        if not checkpoint_timeout > 0:
            raise ValueError("checkpoint_timeout must be a positive number of seconds")
        if cancel_timeout < 0:
            raise ValueError("cancel_timeout must not be negative")
        self.ledger = ledger
        self.cancel_timeout = cancel_timeout
        self.checkpoint_timeout = checkpoint_timeout
        self.review = review
        self.capture = capture
        self.carry_ledger_errors = carry_ledger_errors
        self.carry_tool_errors = carry_tool_errors

    # ------------------------------------------------------------- seam
    def wrap(self, request: ToolCallRequest, handler: Handler) -> Any:
        """Ledger-guarded execution of one call (a sync graph)."""
        config = _config_of(request)
        attached = Batch.attached(config)
        scope = attached.scope if attached is not None else self.scope(config)
        batch = attached if attached is not None else Batch(scope)
        driver = SyncDriver(scope, batch, handler, watch=not batch.node_watches)
        owner = _call_lease_owner(request, attached, scope, config)
        try:
            protocol = intercept(request, self._context(scope, batch, request, config))
            with CALL_LEASES.holding(scope, owner):
                return driver.run(protocol)
        except Exception as exc:
            carried = self._carried(exc)
            if carried is exc:
                raise
            raise carried from exc

    async def awrap(self, request: ToolCallRequest, handler: AsyncHandler) -> Any:
        """Ledger-guarded execution of one call (an async graph)."""
        config = _config_of(request)
        attached = Batch.attached(config)
        scope = attached.scope if attached is not None else await self.ascope(config)
        batch = attached if attached is not None else Batch(scope)
        driver = AsyncDriver(scope, batch, handler, cancel_timeout=self.cancel_timeout)
        owner = _call_lease_owner(request, attached, scope, config)
        try:
            protocol = intercept(request, self._context(scope, batch, request, config))
            async with CALL_LEASES.aholding(scope, owner):
                return await driver.run(protocol)
        except Exception as exc:
            carried = self._carried(exc)
            if carried is exc:
                raise
            raise carried from exc

    # ---------------------------------------------------------- helpers
    def _carried(self, exc: Exception) -> BaseException:
        """What leaves the interceptor for ``exc``: itself, or ``Carried`` around it."""
        if isinstance(exc, GraphBubbleUp) or is_invalid_resume(exc):
            return exc  # ToolNode lets these through as they are
        if isinstance(exc, LedgerError):
            return Carried(exc) if self.carry_ledger_errors else exc
        return Carried(exc) if self.carry_tool_errors else exc

    def _context(
        self, scope: RunScope, batch: Batch, request: ToolCallRequest, config: RunnableConfig
    ) -> CallContext:
        return CallContext(
            scope=scope,
            batch=batch,
            config=config,
            runtime=request.runtime,
            cancel_timeout=self.cancel_timeout,
            checkpoint_timeout=self.checkpoint_timeout,
            review=self._review_of,
            capture=self.capture,
        )

    def _review_of(self, request: ToolCallRequest) -> ReviewMode:
        review = self.review
        return review if isinstance(review, str) else review(request)

    def scope(self, config: RunnableConfig) -> RunScope:
        """The run a call (or a batch) with this config acts for."""
        check_durability(config)
        return invocation_scope(config, self.ledger) or scope_for(
            config, ledger=self.ledger, new_run=False
        )

    async def ascope(self, config: RunnableConfig) -> RunScope:
        """``scope`` on an event loop (its database I/O off the loop until the ledger's
        async twin does it on the loop)."""
        check_durability(config)
        found = invocation_scope(config, self.ledger)
        if found is not None and not found.run.terminal:
            return found
        return await asyncio.to_thread(scope_for, config, ledger=self.ledger, new_run=False)


def _call_lease_owner(
    request: ToolCallRequest, attached: Batch | None, scope: RunScope, config: RunnableConfig
) -> str | None:
    """Who holds the thread's lease over this call (``call_lease``); None when no lease
    is wanted: a node's batch holds it itself (``EffectToolNode``), and a read that
    needs no approval writes no intent a sweeper could take for a dead worker's."""
    if attached is not None:
        return None
    spec = None if request.tool is None else spec_of(request.tool)
    if spec is not None and spec.kind is EffectKind.READ_ONLY and not spec.requires_approval:
        return None
    return call_lease_owner(scope, config)


def _config_of(request: ToolCallRequest) -> RunnableConfig:
    runtime = request.runtime
    config = getattr(runtime, "config", None)
    return cast(RunnableConfig, config) if isinstance(config, dict) else {}


def compose_sync(
    outer: Callable[[ToolCallRequest, Handler], Any] | None,
    inner: Callable[[ToolCallRequest, Handler], Any],
) -> Callable[[ToolCallRequest, Handler], Any]:
    """``outer`` around ``inner``: ``outer``'s ``execute`` is ``inner`` on the handler."""
    if outer is None:
        return inner

    def composed(request: ToolCallRequest, execute: Handler) -> Any:
        return outer(request, lambda changed: inner(changed, execute))

    return composed


def compose_async(
    outer: Callable[[ToolCallRequest, AsyncHandler], Awaitable[Any]] | None,
    inner: Callable[[ToolCallRequest, AsyncHandler], Awaitable[Any]],
) -> Callable[[ToolCallRequest, AsyncHandler], Awaitable[Any]]:
    """``compose_sync`` for async wrappers."""
    if outer is None:
        return inner

    async def composed(request: ToolCallRequest, execute: AsyncHandler) -> Any:
        async def inner_execute(changed: ToolCallRequest) -> Any:
            return await inner(changed, execute)

        return await outer(request, inner_execute)

    return composed


__all__ = [
    "DEFAULT_CANCEL_TIMEOUT",
    "Carried",
    "EffectInterceptor",
    "compose_async",
    "compose_sync",
]

"""Stopping the token bill: a model call that stops reading when the run is cancelled.

The call streams the chat model and checks the run's cancel signal between
chunks. When the signal is up it stops reading and closes the stream (for an
HTTP provider that closes the connection, which is what stops generation and
billing), counts the tokens that arrived after the cancel was requested
(``tokens_after_cancel`` in the report) and reports the call as cancelled.
Tokens generated before the close may still be billed by the provider: the
report cannot undo that, and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from functools import partial
from typing import Any

from langchain_core.language_models import BaseChatModel, LanguageModelLike
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    AnyMessage,
    BaseMessage,
    SystemMessage,
)
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.types import Command

from langgraph_cancel.hooks import run_sync
from langgraph_cancel.nodes.names import CANCEL_NODE
from langgraph_cancel.runtime import RunScope, async_ledger_of, invocation_scope, scope_for
from langgraph_cancel.types import RunRecord


@dataclass(frozen=True, slots=True)
class ModelCallResult:
    """What a cancellable model call produced.

    Attributes:
        message: The complete message, or ``None`` when the call was cancelled.
        cancelled: True when the stream was closed because of the signal.
        chunks: Chunks read in all.
        tokens_after_cancel: Chunks that arrived after the cancel was requested.
    """

    message: AIMessage | None
    cancelled: bool
    chunks: int
    tokens_after_cancel: int


#: Seconds a stopped stream gets to deliver its next chunk (then the node closes it).
STOP_GRACE = 2.0


def _tokens_in(chunk: BaseMessage) -> int:
    usage = getattr(chunk, "usage_metadata", None)
    if usage and usage.get("output_tokens"):
        return int(usage["output_tokens"])
    content = chunk.content
    if isinstance(content, str):
        return 1 if content else 0
    return len(content)


class _StreamRead:
    """One streamed model call, read chunk by chunk until it ends or the signal is up.

    It runs in a task of its own, so the run's task being cancelled does not reach
    the provider's client: the node raises the run's signal instead and this
    reader stops at its next chunk and closes the stream itself.
    """

    def __init__(
        self,
        model: LanguageModelLike,
        messages: Sequence[AnyMessage],
        config: RunnableConfig,
        scope: RunScope,
    ) -> None:
        self.model = model
        self.messages = list(messages)
        self.config = config
        self.scope = scope
        self.message: AIMessageChunk | None = None
        self.chunks = 0
        self.arrivals: list[tuple[float, int]] = []
        self.cancelled = False

    async def run(self) -> None:
        stream = self.model.astream(self.messages, self.config)
        try:
            async for chunk in stream:
                self.chunks += 1
                if isinstance(chunk, BaseMessage):
                    self.arrivals.append((time.time(), _tokens_in(chunk)))
                if isinstance(chunk, AIMessageChunk):
                    self.message = chunk if self.message is None else self.message + chunk
                if await self.scope.signal.acancel_called():
                    self.cancelled = True
                    break
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def tokens_after(self, cutoff: float | None) -> int:
        """Tokens that arrived at or after ``cutoff`` (epoch seconds)."""
        if cutoff is None:
            return 0
        return sum(tokens for (arrived, tokens) in self.arrivals if arrived >= cutoff)


def _cancel_cutoff(scope: RunScope, run: RunRecord) -> float | None:
    """When the stop was asked for: the ledger's time, or this process's first sight of
    the signal when that is earlier (a stop raised here is recorded just after)."""
    moments = [scope.signal.raised_at]
    if run.requested_at is not None:
        moments.append(run.requested_at.astimezone(UTC).timestamp())
    known = [moment for moment in moments if moment is not None]
    return min(known) if known else None


async def _stop_reading(reader: asyncio.Future[None], grace: float) -> None:
    """Give a reader whose signal is up ``grace`` seconds to close its stream at its next
    chunk; a stream that delivers nothing meanwhile is closed by cancelling the reader."""
    done, _pending = await asyncio.wait({reader}, timeout=grace)
    if not done:
        reader.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await reader


async def _count_after_cancel(scope: RunScope, reading: _StreamRead) -> int:
    """Record, once the stream is closed, the tokens that arrived after the stop."""
    await scope.signal.aobserve()
    run = await scope.arefresh()
    after = reading.tokens_after(_cancel_cutoff(scope, run))
    await async_ledger_of(scope.ledger).aadd_tokens_after_cancel(scope.run_id, after)
    return after


async def acall_model(
    model: LanguageModelLike,
    messages: Sequence[AnyMessage],
    config: RunnableConfig,
    *,
    scope: RunScope | None = None,
    stop_grace: float = STOP_GRACE,
) -> ModelCallResult:
    """Stream ``model`` on ``messages``, closing the stream when the run is cancelled.

    The run is cancelled either through the ledger (``request_cancel``, from any
    process) or by cancelling the run's asyncio task (a LangGraph server's
    ``runs.cancel``, a client disconnect): the latter is turned into the former
    first, so in both cases this call closes the stream itself and counts the
    tokens that arrived after the stop. The task cancel is then re-raised.

    Args:
        model: A chat model (or a runnable producing message chunks).
        messages: The conversation.
        config: The node's config (it names the thread).
        scope: The run scope (default: found through ``config``).
        stop_grace: Seconds a stopped stream gets to deliver its next chunk before
            the reading is cancelled outright.

    Raises:
        asyncio.CancelledError: The run's task was cancelled (after the stream was
            closed and the tokens after the stop were counted).
    """
    if scope is None:
        scope = invocation_scope(config)
    if scope is None:
        scope = await asyncio.to_thread(partial(scope_for, config, new_run=False))
    if await scope.signal.acancel_called():
        await scope.signal.aobserve()
        return ModelCallResult(None, True, 0, 0)
    reading = _StreamRead(model, messages, config, scope)
    reader = asyncio.ensure_future(reading.run())
    try:
        await asyncio.shield(reader)
    except asyncio.CancelledError:
        try:
            await scope.atask_cancelled()
            await _stop_reading(reader, stop_grace)
            if reading.cancelled:
                await _count_after_cancel(scope, reading)
        finally:
            reader.cancel()
        raise
    if not reading.cancelled:
        return ModelCallResult(_finish(reading.message), False, reading.chunks, 0)
    after = await _count_after_cancel(scope, reading)
    return ModelCallResult(None, True, reading.chunks, after)


def _finish(streamed: AIMessageChunk | None) -> AIMessage:
    """The complete message of a stream read to its end (empty when nothing came)."""
    if streamed is None:
        return AIMessage(content="")
    return AIMessage(
        content=streamed.content,
        tool_calls=streamed.tool_calls,
        invalid_tool_calls=streamed.invalid_tool_calls,
        id=streamed.id,
        usage_metadata=streamed.usage_metadata,
        response_metadata=streamed.response_metadata,
        additional_kwargs=streamed.additional_kwargs,
    )


def call_model(
    model: LanguageModelLike,
    messages: Sequence[AnyMessage],
    config: RunnableConfig,
    *,
    scope: RunScope | None = None,
) -> ModelCallResult:
    """Sync ``acall_model``."""
    result: ModelCallResult = run_sync(acall_model(model, messages, config, scope=scope))
    return result


class CancellableModelNode(RunnableLambda[Any, Any]):
    """A model node whose stream is closed the moment the run is cancelled.

    Use it where your graph calls the model::

        builder.add_node("agent", CancellableModelNode(model, tools=tools))

    On cancel it writes nothing and routes to the cancel node; the tokens that
    arrived after the request are counted in the report.

    Args:
        model: The chat model.
        tools: Tools to bind (``model.bind_tools(tools)``), if any.
        system_prompt: A system message to put first, if any.
        messages_key: State key of the messages.
        name: Node name.
    """

    def __init__(
        self,
        model: BaseChatModel | LanguageModelLike,
        *,
        tools: Sequence[BaseTool] | None = None,
        system_prompt: str | None = None,
        messages_key: str = "messages",
        name: str = "agent",
    ) -> None:
        bound: LanguageModelLike = model
        if tools and isinstance(model, BaseChatModel):
            bound = model.bind_tools(list(tools))
        self.model = bound
        self.system_prompt = system_prompt
        self.messages_key = messages_key
        super().__init__(self._call, afunc=self._acall, name=name)

    def _messages(self, state: Any) -> list[AnyMessage]:
        messages = (
            state.get(self.messages_key, [])
            if isinstance(state, dict)
            else getattr(state, self.messages_key, [])
        )
        if self.system_prompt:
            return [SystemMessage(self.system_prompt), *messages]
        return list(messages)

    async def _acall(self, state: Any, config: RunnableConfig) -> Any:
        result = await acall_model(self.model, self._messages(state), config)
        if result.cancelled or result.message is None:
            return Command(goto=CANCEL_NODE)
        return {self.messages_key: [result.message]}

    def _call(self, state: Any, config: RunnableConfig) -> Any:
        return run_sync(self._acall(state, config))


__all__ = ["STOP_GRACE", "CancellableModelNode", "ModelCallResult", "acall_model", "call_model"]

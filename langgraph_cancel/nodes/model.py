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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from langchain_core.language_models import BaseChatModel, LanguageModelLike
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    AnyMessage,
    BaseMessage,
    SystemMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph._internal._runnable import RunnableCallable
from langgraph.types import Command

from langgraph_cancel.nodes.names import CANCEL_NODE
from langgraph_cancel.runtime import RunScope, scope_for


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


def _tokens_in(chunk: BaseMessage) -> int:
    usage = getattr(chunk, "usage_metadata", None)
    if usage and usage.get("output_tokens"):
        return int(usage["output_tokens"])
    content = chunk.content
    if isinstance(content, str):
        return 1 if content else 0
    return len(content)


def _requested_epoch(scope: RunScope) -> float | None:
    run = scope.refresh()
    if run.requested_at is None:
        return None
    return run.requested_at.astimezone(UTC).timestamp()


async def acall_model(
    model: LanguageModelLike,
    messages: Sequence[AnyMessage],
    config: RunnableConfig,
    *,
    scope: RunScope | None = None,
) -> ModelCallResult:
    """Stream ``model`` on ``messages``, closing the stream when the run is cancelled.

    Args:
        model: A chat model (or a runnable producing message chunks).
        messages: The conversation.
        config: The node's config (it names the thread).
        scope: The run scope (default: found through ``config``).
    """
    if scope is None:
        scope = await asyncio.to_thread(scope_for, config, new_run=False)
    if await scope.signal.acancel_called():
        await asyncio.to_thread(scope.signal.observe)
        return ModelCallResult(None, True, 0, 0)
    acc: AIMessageChunk | None = None
    chunks = 0
    arrivals: list[tuple[float, int]] = []
    stream = model.astream(list(messages), config)
    cancelled = False
    try:
        async for chunk in stream:
            chunks += 1
            if isinstance(chunk, BaseMessage):
                arrivals.append((time.time(), _tokens_in(chunk)))
            if isinstance(chunk, AIMessageChunk):
                acc = chunk if acc is None else acc + chunk
            if await scope.signal.acancel_called():
                cancelled = True
                break
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    if not cancelled:
        message = _finish(acc)
        return ModelCallResult(message, False, chunks, 0)
    await asyncio.to_thread(scope.signal.observe)
    requested = await asyncio.to_thread(_requested_epoch, scope)
    after = sum(n for (t, n) in arrivals if requested is not None and t >= requested)
    await asyncio.to_thread(scope.ledger.add_tokens_after_cancel, scope.run_id, after)
    return ModelCallResult(None, True, chunks, after)


def _finish(acc: AIMessageChunk | None) -> AIMessage:
    if acc is None:
        return AIMessage(content="")
    return AIMessage(
        content=acc.content,
        tool_calls=acc.tool_calls,
        invalid_tool_calls=acc.invalid_tool_calls,
        id=acc.id,
        usage_metadata=acc.usage_metadata,
        response_metadata=acc.response_metadata,
        additional_kwargs=acc.additional_kwargs,
    )


def call_model(
    model: LanguageModelLike,
    messages: Sequence[AnyMessage],
    config: RunnableConfig,
    *,
    scope: RunScope | None = None,
) -> ModelCallResult:
    """Sync ``acall_model``."""
    from langgraph_cancel.hooks import run_sync as _run_sync

    result: ModelCallResult = _run_sync(acall_model(model, messages, config, scope=scope))
    return result


class CancellableModelNode(RunnableCallable):
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
        super().__init__(self._call, self._acall, name=name)

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
        from langgraph_cancel.hooks import run_sync as _run_sync

        return _run_sync(self._acall(state, config))


__all__ = ["CancellableModelNode", "ModelCallResult", "acall_model", "call_model"]

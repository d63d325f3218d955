"""``ScriptedChatModel``: a real LangChain chat model that plays back a script.

It needs no API key and no network, yet goes through the whole
``BaseChatModel`` machinery (callbacks, ``invoke``/``stream``/``ainvoke``/
``astream``, ``bind_tools``), so LangGraph graphs, ``ToolNode`` and
``langchain.agents.create_agent`` treat it like a provider model.

A script is a list of turns. Each call to the model consumes the next turn:

* an ``AIMessage`` (possibly with ``tool_calls``), returned as a copy;
* a ``str``, shorthand for ``AIMessage(content=...)``;
* a callable ``(messages) -> AIMessage | str`` for reactive scripts that look
  at what the model was sent (for example the last ``ToolMessage``).

Streaming splits the content into whitespace-delimited tokens, one
``AIMessageChunk`` each, and delivers the tool calls as ``tool_call_chunks``
in the last chunk. ``delay_per_token`` makes every token take that long
(``time.sleep`` on the sync path, ``asyncio.sleep`` on the async path), so a
test can cancel in the middle of a generation and then check
``tokens_emitted`` to see that the token spend stopped.

Example::

    model = ScriptedChatModel(
        [
            AIMessage("", tool_calls=[tool_call("issue_refund", {"order_id": "o-88"})]),
            "The refund has been issued.",
        ]
    )
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolCall
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from pydantic import ConfigDict, Field, PrivateAttr, SkipValidation

ScriptedReply: TypeAlias = AIMessage | str
"""What a turn produces: a message, or a string standing for ``AIMessage(content=...)``."""

Turn: TypeAlias = AIMessage | str | Callable[[list[BaseMessage]], ScriptedReply]
"""One entry of a script: a reply, or a callable computing it from the input messages."""

OnExhausted: TypeAlias = Literal["error", "repeat_last"]

_TOKEN_RE = re.compile(r"\s*\S+\s*|\s+")


class ScriptExhaustedError(RuntimeError):
    """The model was called more times than its script has turns."""


def tool_call(name: str, args: Mapping[str, Any] | None = None, id: str | None = None) -> ToolCall:
    """Build one tool call for a scripted ``AIMessage``.

    Args:
        name: The tool's name, as the model would emit it.
        args: The tool's arguments.
        id: The tool-call id. Leave it ``None`` to have the model assign a fresh
            ``call_<12 hex>`` id each time the turn is played.

    Returns:
        A ``ToolCall`` dict suitable for ``AIMessage(tool_calls=[...])``.
    """
    return ToolCall(name=name, args=dict(args or {}), id=id, type="tool_call")


def tool_calls_turn(*calls: ToolCall, content: str = "") -> AIMessage:
    """Build an ``AIMessage`` turn that requests the given tool calls.

    Args:
        *calls: Tool calls built with :func:`tool_call`.
        content: Optional text the model says alongside the calls.

    Returns:
        The scripted message.
    """
    return AIMessage(content=content, tool_calls=list(calls))


def split_tokens(text: str) -> list[str]:
    """Split ``text`` into the tokens the model streams.

    Tokens are whitespace-delimited words that keep their surrounding
    whitespace, so ``"".join(split_tokens(text)) == text``.

    Args:
        text: The content to split.

    Returns:
        The tokens in order; empty for an empty string.
    """
    return _TOKEN_RE.findall(text)


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:12]}"


def _count_input_tokens(messages: Sequence[BaseMessage]) -> int:
    total = 0
    for message in messages:
        content = message.content
        if isinstance(content, str):
            total += len(content.split())
        else:
            total += len(json.dumps(content, default=str).split())
    return total


class ScriptedChatModel(BaseChatModel):
    """A chat model that replies with a fixed (or reactive) script of turns.

    Each call (``invoke``, ``stream``, ``ainvoke``, ``astream``, or a LangGraph
    node calling any of them) consumes exactly one turn. The state (position in
    the script, counters, ids handed out) belongs to the instance and is guarded
    by a lock, so two graphs share it only if they share the instance.

    Attributes:
        turns: The script.
        on_exhausted: ``"error"`` raises :class:`ScriptExhaustedError` once the
            script is used up; ``"repeat_last"`` plays the last turn again
            (with fresh tool-call ids).
        delay_per_token: Seconds each streamed (or generated) token takes.
        report_usage: Attach ``usage_metadata`` (whitespace token counts).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    turns: SkipValidation[list[Turn]] = Field(default_factory=list)
    on_exhausted: OnExhausted = "error"
    delay_per_token: float = Field(default=0.0, ge=0.0)
    report_usage: bool = False

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _position: int = PrivateAttr(default=0)
    _calls: int = PrivateAttr(default=0)
    _tokens_emitted: int = PrivateAttr(default=0)
    _emitted_ids: set[str] = PrivateAttr(default_factory=set)
    _inputs: list[list[BaseMessage]] = PrivateAttr(default_factory=list)
    _bound_tools: list[str] = PrivateAttr(default_factory=list)

    def __init__(self, turns: Sequence[Turn] = (), /, **kwargs: Any) -> None:
        """Create a model playing ``turns``.

        Args:
            turns: The script; may also be given as the ``turns`` keyword.
            **kwargs: ``on_exhausted``, ``delay_per_token``, ``report_usage`` and
                any ``BaseChatModel`` field.
        """
        if "turns" in kwargs:
            if turns:
                raise TypeError("give the turns positionally or as turns=..., not both")
            turns = kwargs.pop("turns")
        for position, turn in enumerate(turns):
            if not (isinstance(turn, AIMessage | str) or callable(turn)):
                raise TypeError(
                    f"turn {position} must be an AIMessage, a str or a callable "
                    f"(messages) -> AIMessage, got {type(turn).__name__}"
                )
        kwargs["turns"] = list(turns)
        super().__init__(**kwargs)

    # ------------------------------------------------------------------ state

    @property
    def calls(self) -> int:
        """How many times the model has been called (turns consumed)."""
        with self._lock:
            return self._calls

    @property
    def tokens_emitted(self) -> int:
        """How many content tokens the model has produced so far."""
        with self._lock:
            return self._tokens_emitted

    @property
    def remaining(self) -> int:
        """Turns not yet played (ignoring ``repeat_last``)."""
        with self._lock:
            return max(0, len(self.turns) - self._position)

    @property
    def inputs(self) -> list[list[BaseMessage]]:
        """The messages each call received, in call order (copies of the lists)."""
        with self._lock:
            return [list(batch) for batch in self._inputs]

    @property
    def bound_tools(self) -> list[str]:
        """Names of the tools given to the last ``bind_tools`` call."""
        with self._lock:
            return list(self._bound_tools)

    def reset(self) -> None:
        """Rewind the script and zero the counters."""
        with self._lock:
            self._position = 0
            self._calls = 0
            self._tokens_emitted = 0
            self._emitted_ids.clear()
            self._inputs.clear()

    # ------------------------------------------------------------ chat model

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": "scripted", "turns": len(self.turns)}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Accept tools and return this same model (the script decides the calls).

        Args:
            tools: The tools an agent offers the model; their names are recorded
                in :attr:`bound_tools`.
            tool_choice: Ignored.
            **kwargs: Ignored.

        Returns:
            ``self``.
        """
        names: list[str] = []
        for item in tools:
            name = getattr(item, "name", None)
            if name is None and isinstance(item, dict):
                function = item.get("function")
                name = function.get("name") if isinstance(function, dict) else item.get("name")
            if name is None:
                name = getattr(item, "__name__", repr(item))
            names.append(str(name))
        with self._lock:
            self._bound_tools = names
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        reply = self._next_reply(messages)
        for chunk in self._chunks(reply):
            tokens = _chunk_tokens(chunk)
            if tokens and self.delay_per_token:
                time.sleep(self.delay_per_token)
            self._count_tokens(tokens)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        reply = self._next_reply(messages)
        for chunk in self._chunks(reply):
            tokens = _chunk_tokens(chunk)
            if tokens and self.delay_per_token:
                await asyncio.sleep(self.delay_per_token)
            self._count_tokens(tokens)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        reply = self._next_reply(messages)
        for chunk in self._chunks(reply):
            tokens = _chunk_tokens(chunk)
            if tokens and self.delay_per_token:
                time.sleep(self.delay_per_token)
            self._count_tokens(tokens)
            if run_manager is not None:
                run_manager.on_llm_new_token(_text(chunk), chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        reply = self._next_reply(messages)
        for chunk in self._chunks(reply):
            tokens = _chunk_tokens(chunk)
            if tokens and self.delay_per_token:
                await asyncio.sleep(self.delay_per_token)
            self._count_tokens(tokens)
            if run_manager is not None:
                await run_manager.on_llm_new_token(_text(chunk), chunk=chunk)
            yield chunk

    # -------------------------------------------------------------- internals

    def _count_tokens(self, tokens: int) -> None:
        if tokens:
            with self._lock:
                self._tokens_emitted += tokens

    def _next_reply(self, messages: list[BaseMessage]) -> AIMessage:
        """Consume one turn and return a fresh ``AIMessage`` with unique call ids."""
        with self._lock:
            self._calls += 1
            self._inputs.append(list(messages))
            if self._position < len(self.turns):
                turn = self.turns[self._position]
                self._position += 1
            elif self.on_exhausted == "repeat_last" and self.turns:
                turn = self.turns[-1]
            else:
                raise ScriptExhaustedError(
                    f"ScriptedChatModel script exhausted: call #{self._calls} but the script "
                    f"has {len(self.turns)} turn(s); add turns or pass "
                    "on_exhausted='repeat_last'"
                )
        produced = turn(list(messages)) if callable(turn) else turn
        if isinstance(produced, str):
            produced = AIMessage(content=produced)
        if not isinstance(produced, AIMessage):
            raise TypeError(
                f"a scripted turn must produce an AIMessage or str, got {type(produced).__name__}"
            )
        reply = self._with_unique_ids(produced)
        if self.report_usage:
            output_tokens = sum(_chunk_tokens(chunk) for chunk in self._chunks(reply))
            input_tokens = _count_input_tokens(messages)
            reply.usage_metadata = UsageMetadata(
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                total_tokens=input_tokens + output_tokens,
            )
        return reply

    def _with_unique_ids(self, message: AIMessage) -> AIMessage:
        calls: list[ToolCall] = []
        with self._lock:
            for call in message.tool_calls:
                call_id = call.get("id")
                if not call_id or call_id in self._emitted_ids:
                    call_id = _new_call_id()
                    while call_id in self._emitted_ids:  # pragma: no cover - 48 bits
                        call_id = _new_call_id()
                self._emitted_ids.add(call_id)
                calls.append(
                    ToolCall(
                        name=call["name"],
                        args=json.loads(json.dumps(call["args"])),
                        id=call_id,
                        type="tool_call",
                    )
                )
        copy = message.model_copy(deep=True)
        copy.tool_calls = calls
        copy.response_metadata = {
            **copy.response_metadata,
            "model_name": "scripted",
            "finish_reason": "tool_calls" if calls else "stop",
        }
        return copy

    @staticmethod
    def _chunks(reply: AIMessage) -> list[ChatGenerationChunk]:
        """The streamed form of ``reply``.

        One chunk per content token; the tool calls travel as
        ``tool_call_chunks`` in a final chunk of their own (empty content), which
        also carries the usage and response metadata.
        """
        content = reply.content
        pieces: list[str | list[str | dict[str, Any]]]
        if isinstance(content, str):
            pieces = list(split_tokens(content))
        else:
            pieces = [[block] for block in content]
        if reply.tool_calls or not pieces:
            pieces.append("" if isinstance(content, str) else [])
        chunks: list[ChatGenerationChunk] = []
        last = len(pieces) - 1
        for index, piece in enumerate(pieces):
            is_last = index == last
            calls = (
                [
                    tool_call_chunk(
                        name=call["name"],
                        args=json.dumps(call["args"]),
                        id=call["id"],
                        index=position,
                    )
                    for position, call in enumerate(reply.tool_calls)
                ]
                if is_last
                else []
            )
            message = AIMessageChunk(
                content=piece,
                id=reply.id,
                tool_call_chunks=calls,
                usage_metadata=reply.usage_metadata if is_last else None,
                response_metadata=dict(reply.response_metadata) if is_last else {},
                chunk_position="last" if is_last else None,
            )
            chunks.append(ChatGenerationChunk(message=message))
        return chunks


def _chunk_tokens(chunk: ChatGenerationChunk) -> int:
    """Tokens a chunk costs: one for any content, one per tool call."""
    message = chunk.message
    calls = len(message.tool_call_chunks) if isinstance(message, AIMessageChunk) else 0
    return (1 if _text(chunk) else 0) + calls


def _text(chunk: ChatGenerationChunk) -> str:
    content = chunk.message.content
    if isinstance(content, str):
        return content
    return json.dumps(content, default=str) if content else ""


__all__ = [
    "OnExhausted",
    "ScriptExhaustedError",
    "ScriptedChatModel",
    "ScriptedReply",
    "Turn",
    "split_tokens",
    "tool_call",
    "tool_calls_turn",
]

"""Two stand-ins for a tool that ``ToolNode``'s own execution runs in its place.

``ToolNode`` injects state, store and runtime, validates, calls the tool and turns
its exceptions into messages as ``handle_tool_errors`` says. The protocol wants
that execution exactly, and two facts it hides:

- whether a call with arguments off the model's schema would be refused before
  the tool's body runs, and with which message (``with_argument_check``: a stand-in
  that validates as the tool does and stops there);
- which exception a tool raised when ``ToolNode`` answered it with an error
  message (``Capture``: a stand-in that notes the exception on its way), so that a
  transient fault on a side effect is reconciled instead of called a failure.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from pydantic import PrivateAttr


class ArgumentsAccepted(BaseException):
    """The tool accepts the arguments after all (its body did not run).

    A ``BaseException``, so that ``ToolNode``'s error handling lets it through.
    """


class _StandIn(BaseTool):
    """A tool that looks like ``_real`` to ``ToolNode`` (name, schema, description)."""

    _real: BaseTool | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, real: BaseTool) -> Any:
        stand_in = cls.model_construct(
            name=real.name,
            description=real.description,
            args_schema=real.args_schema,
            return_direct=real.return_direct,
            response_format=real.response_format,
        )
        stand_in._real = real
        return stand_in

    @property
    def real(self) -> BaseTool:
        assert self._real is not None
        return self._real

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise NotImplementedError


class _ArgumentCheck(_StandIn):
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Validate as the tool does (raising its ``ValidationError``), never run it."""
        self.real._parse_input(input.get("args", {}), input.get("id"))
        raise ArgumentsAccepted

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Async ``invoke``."""
        return self.invoke(input, config, **kwargs)


class _Observed(_StandIn):
    _capture: Capture | None = PrivateAttr(default=None)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """The tool's ``invoke``; an exception is noted, then raised on."""
        try:
            return self.real.invoke(input, config, **kwargs)
        except Exception as exc:
            assert self._capture is not None
            self._capture.error = exc
            raise

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """The tool's ``ainvoke``; an exception is noted, then raised on."""
        try:
            return await self.real.ainvoke(input, config, **kwargs)
        except Exception as exc:
            assert self._capture is not None
            self._capture.error = exc
            raise


class Capture:
    """The exception a tool raised in one attempt, if any."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: Exception | None = None

    def around(self, request: ToolCallRequest) -> ToolCallRequest:
        """``request`` with the tool in a stand-in that notes its exception here."""
        if request.tool is None:
            return request
        observed = _Observed.of(request.tool)
        observed._capture = self
        return request.override(tool=observed)


def with_argument_check(request: ToolCallRequest, tool: BaseTool) -> ToolCallRequest:
    """``request`` with ``tool`` in a stand-in that validates and stops there."""
    return request.override(tool=_ArgumentCheck.of(tool))


__all__ = ["ArgumentsAccepted", "Capture", "with_argument_check"]

"""Tools classified by name, and the effect interceptor as ``ToolNode``'s wrapper pair.

A tool a ``wrap_tool_call`` wrapper serves, or one that middleware adds to a model
request, reaches the effect protocol as the wrapper made it: no ``effect(...)``
decorated it. ``ServedEffects`` classifies such tools by name for
``EffectToolNode`` and ``CancellationMiddleware`` alike; ``effect_seam`` puts the
interceptor on the node's seam with each request's tool classified first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_cancel.effects import EFFECT_KIND_METADATA, effect
from langgraph_cancel.execution.interceptor import EffectInterceptor
from langgraph_cancel.types import EffectKind

#: How ``effects=`` classifies a tool by name: what ``effect(...)`` returns as a
#: decorator, or just the kind (``"read_only"``: ``effect("read_only")``).
Classification = EffectKind | str | Callable[[BaseTool], BaseTool]


class ServedEffects:
    """Classifications by tool name, for the tools no ``effect(...)`` decorated.

    A tool a ``wrap_tool_call`` wrapper serves (or that middleware adds to a model
    request) reaches the effect protocol as the wrapper made it: ``effects=``
    classifies it by its name, as ``effect(...)`` would have, so that it runs as
    ``ToolNode`` runs it instead of waiting for approval. A tool classified itself
    keeps its own classification; a name the mapping does not give stays
    unclassified (irreversible, approval).

    Args:
        effects: Tool name to classification; any ``Mapping`` (its ``get`` is asked).
    """

    def __init__(self, effects: Mapping[str, Classification] | None = None) -> None:
        self.effects = effects

    def classify(self, tool: BaseTool) -> BaseTool:
        """``tool`` classified by its name, when it is not classified and the mapping
        gives its name; else ``tool`` itself."""
        if self.effects is None or (tool.metadata or {}).get(EFFECT_KIND_METADATA):
            return tool
        given = self.effects.get(tool.name)
        if given is None:
            return tool
        decorate = effect(given) if isinstance(given, EffectKind | str) else given
        classified: BaseTool = decorate(tool)
        return classified

    def request(self, request: ToolCallRequest) -> ToolCallRequest:
        """``request`` with its tool classified by name (see ``classify``)."""
        if request.tool is None:
            return request
        tool = self.classify(request.tool)
        return request if tool is request.tool else request.override(tool=tool)


def effect_seam(
    interceptor: EffectInterceptor, served: ServedEffects
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The interceptor as ``ToolNode``'s wrapper pair, each request's tool classified by
    name first (a tool your wrapper serves)."""

    def guarded(request: ToolCallRequest, execute: Callable[..., Any]) -> Any:
        return interceptor.wrap(served.request(request), execute)

    async def aguarded(request: ToolCallRequest, execute: Callable[..., Any]) -> Any:
        return await interceptor.awrap(served.request(request), execute)

    return guarded, aguarded


__all__ = ["Classification", "ServedEffects", "effect_seam"]

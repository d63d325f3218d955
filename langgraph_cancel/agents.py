"""The agent a command or the sweeper is given, compiled on a saver of its own.

``langgraph-cancel resume``, ``sweep --graph`` and ``Sweeper(graph=...)`` run an
agent on their own saver to continue or close its threads. Both kinds of agent the
package guards qualify: a graph prepared with ``add_cancellation`` (its builder, the
builder compiled, or a function returning either) and a ``create_agent`` agent with
``EffectMiddleware`` (the agent, or a function returning it). Any other graph does
not: run on, it would send its tool calls again with nothing to remember them.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from langgraph_cancel.nodes.settings import CancellationSettings

if TYPE_CHECKING:
    from langgraph_cancel.middleware import EffectMiddleware

#: How far into the closures of a tool node's wrapper a middleware is looked for:
#: ``create_agent`` chains each middleware's ``wrap_tool_call`` two closures deep
#: per middleware, behind a tracing wrapper.
_SEARCH_DEPTH = 24


@dataclass(frozen=True, slots=True)
class GuardedAgent:
    """An agent whose tool calls go through the ledger.

    Attributes:
        graph: The ``add_cancellation`` builder, or the compiled ``create_agent`` agent.
        settings: Its cancellation settings: the state keys of its messages and
            report, ``compensate_on_cancel``, its tools.
        middleware: The ``EffectMiddleware`` of a ``create_agent`` agent; None for
            an ``add_cancellation`` graph.
    """

    graph: Any
    settings: CancellationSettings
    middleware: EffectMiddleware | None = None

    def compile_on(self, saver: Any) -> Any:
        """The agent compiled on ``saver``, everything else as it was given."""
        if self.middleware is None:
            return self.graph.compile(checkpointer=saver)
        return self.graph.copy(update={"checkpointer": saver})


def guarded_agent(value: Any) -> GuardedAgent | None:
    """What ``value`` names, when it is an agent the package guards; else None.

    Args:
        value: A ``StateGraph`` prepared with ``add_cancellation``, a compiled
            graph (of such a builder, or from ``create_agent`` with
            ``EffectMiddleware``), or a function returning one of these.
    """
    from langchain_core.runnables import Runnable
    from langgraph.graph import StateGraph
    from langgraph.graph.state import CompiledStateGraph

    if callable(value) and not isinstance(value, StateGraph | Runnable):
        value = value()
    if isinstance(value, StateGraph):
        settings = getattr(value, "cancellation", None)
        return None if settings is None else GuardedAgent(value, settings)
    if not isinstance(value, CompiledStateGraph):
        return None
    settings = getattr(value.builder, "cancellation", None)
    if settings is not None:
        return GuardedAgent(value.builder, settings)
    middleware = effect_middleware_of(value)
    if middleware is None:
        return None
    # The middleware learns its tools as they are called; the agent's tool node
    # has them all, with their reconcile and compensate hooks.
    tools = {**_tool_node_tools(value), **middleware.settings.tools}
    return GuardedAgent(value, replace(middleware.settings, tools=tools), middleware)


def _tool_node_tools(graph: Any) -> dict[str, Any]:
    from langgraph.prebuilt import ToolNode

    tools: dict[str, Any] = {}
    for node in graph.builder.nodes.values():
        if isinstance(node.runnable, ToolNode):
            tools.update(node.runnable.tools_by_name)
    return tools


def effect_middleware_of(graph: Any) -> EffectMiddleware | None:
    """The ``EffectMiddleware`` a ``create_agent`` agent's tool node calls through.

    ``create_agent`` keeps no list of its middleware; each one's ``wrap_tool_call``
    is chained into the ``ToolNode``'s wrapper, so the middleware is found there.
    """
    try:
        from langgraph_cancel.middleware import EffectMiddleware
    except ImportError:  # no LangChain: no create_agent agent either
        return None
    from langgraph.prebuilt import ToolNode

    for node in graph.builder.nodes.values():
        if not isinstance(node.runnable, ToolNode):
            continue
        wrappers = (node.runnable._wrap_tool_call, node.runnable._awrap_tool_call)
        for found in _reachable(wrappers, _SEARCH_DEPTH):
            if isinstance(found, EffectMiddleware):
                return found
    return None


def _reachable(roots: tuple[Any, ...], depth: int) -> Iterator[Any]:
    """What ``roots`` reach through closures, wrapped functions and bound methods."""
    seen: set[int] = set()
    frontier = [root for root in roots if root is not None]
    for _ in range(depth):
        reached: list[Any] = []
        for item in frontier:
            if id(item) in seen:
                continue
            seen.add(id(item))
            yield item
            if inspect.ismethod(item):
                reached += [item.__self__, item.__func__]
            elif inspect.isfunction(item):
                reached += _closure_values(item)
                wrapped = getattr(item, "__wrapped__", None)
                if wrapped is not None:
                    reached.append(wrapped)
            elif isinstance(item, list | tuple):
                reached += list(item)
        if not reached:
            return
        frontier = reached


def _closure_values(function: Any) -> list[Any]:
    values: list[Any] = []
    for cell in function.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            continue
    return values


__all__ = ["GuardedAgent", "effect_middleware_of", "guarded_agent"]

"""``add_cancellation``: wiring the cancel protocol into a graph builder.

``add_cancellation(builder)`` returns the same builder, now:

- every node is wrapped by a guard that, once the run is cancel-requested,
  routes to the cancel node instead of running the node (a signal nobody
  reads is not cancellation);
- new input passes through the ``reconcile`` subgraph (``nodes.entry``) first
  whenever the thread has something to settle (in flight, unknown,
  compensating), a tool call nobody answered, or a stop to divert to, so that
  nothing is dispatched again before it is settled; otherwise START goes
  straight on;
- a ``cancel`` node runs the cancel protocol (``nodes.cancel``): it drains what
  never ran, answers every dangling tool call, waits for (or reconciles) what
  is in flight, optionally compensates, makes the run's one ``cancelled``
  transition, stores the report in the ledger and the graph state, and streams
  it;
- compiled, it is a ``CancellableGraph`` (``lifecycle``): each invocation holds
  a lease on the thread and closes the run (``completed`` / ``cancelled``) when
  it ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, TypedDict, cast

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph._internal._runnable import RunnableCallable
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command

from langgraph_cancel.errors import ConfigurationError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.lifecycle import CONFIG_KEY_WORKER, CancellableGraph
from langgraph_cancel.limits import Limits, tokens_of
from langgraph_cancel.nodes.cancel import (
    DRAIN_REASON,
    answer_dangling,
    drop_send_payload,
    finalize_cancel,
    make_cancel_node,
)
from langgraph_cancel.nodes.entry import make_reconcile_subgraph, needs_reconcile
from langgraph_cancel.nodes.names import CANCEL_NODE, RECONCILE_NODE
from langgraph_cancel.nodes.reconcile import reconcile_now, reconcile_thread, spec_of_unknown
from langgraph_cancel.nodes.settings import REPORT_KEY, CancellationSettings
from langgraph_cancel.nodes.tool_node import EffectToolNode
from langgraph_cancel.runtime import invocation_scope, resolve_ledger, scope_for, thread_id_of


# -------------------------------------------------------------- the guard
def _guard(name: str, inner: Any, settings: CancellationSettings) -> RunnableCallable:
    """Wrap a node: check the cancel signal before it runs; divert to the cancel node."""

    def diverted(state: Any, config: RunnableConfig) -> bool:
        scope = scope_for(config, ledger=settings.ledger, new_run=False)
        if scope.run.terminal or scope.cancel_called():
            scope.signal.observe()
            drop_send_payload(state, scope, settings)
            return True
        return False

    def func(state: Any, config: RunnableConfig) -> Any:
        if diverted(state, config):
            return Command(goto=CANCEL_NODE)
        out = inner.invoke(state, config)
        if settings.limits is not None and (tokens := _model_tokens(out, settings)):
            scope_for(config, ledger=settings.ledger, new_run=False).count_tokens(tokens)
        return out

    async def afunc(state: Any, config: RunnableConfig) -> Any:
        scope = invocation_scope(config, settings.ledger)
        # Known to go on without ledger I/O, or decided off the loop.
        undecided = scope is None or scope.run.terminal or await scope.signal.acancel_called()
        if undecided and await asyncio.to_thread(diverted, state, config):
            return Command(goto=CANCEL_NODE)
        out = await inner.ainvoke(state, config)
        if settings.limits is not None and (tokens := _model_tokens(out, settings)):
            await asyncio.to_thread(_count_tokens, config, settings, tokens)
        return out

    return RunnableCallable(func, afunc, name=name, trace=False)


def _model_tokens(update: Any, settings: CancellationSettings) -> int:
    """Model tokens of the messages a node's update adds (for the token budget)."""
    if isinstance(update, Command):
        update = update.update
    if not isinstance(update, dict):
        return 0
    added = update.get(settings.messages_key)
    if added is None:
        return 0
    return tokens_of(added if isinstance(added, list) else [added])


def _count_tokens(config: RunnableConfig, settings: CancellationSettings, tokens: int) -> None:
    scope_for(config, ledger=settings.ledger, new_run=False).count_tokens(tokens)


def _make_entry(settings: CancellationSettings, targets: list[str]) -> RunnableCallable:
    """START's router: the reconcile subgraph when needed, else where START led."""

    def route(state: Any, config: RunnableConfig) -> str | list[str]:
        return RECONCILE_NODE if needs_reconcile(state, config, settings) else targets

    async def aroute(state: Any, config: RunnableConfig) -> str | list[str]:
        # Ledger I/O off the loop.
        needed = await asyncio.to_thread(needs_reconcile, state, config, settings)
        return RECONCILE_NODE if needed else targets

    return RunnableCallable(route, aroute, name="reconcile_if_needed", trace=False)


def _with_cancel(ends: tuple[str, ...] | dict[str, str] | None) -> tuple[str, ...] | dict[str, str]:
    """A node's declared ``Command`` destinations plus the cancel node.

    Every guarded node may divert to the cancel node; declared, the graph view
    (Studio, ``get_graph()``) draws where a stop goes. Destinations only draw:
    what a node may go to at run time is unchanged.
    """
    if isinstance(ends, dict):
        return {**ends, CANCEL_NODE: CANCEL_NODE}
    return (*(ends or ()), CANCEL_NODE)


def _collect_tools(builder: StateGraph[Any, Any, Any, Any]) -> dict[str, BaseTool]:
    tools: dict[str, BaseTool] = {}
    for spec in builder.nodes.values():
        runnable = spec.runnable
        if isinstance(runnable, EffectToolNode):
            tools.update(runnable.tools_by_name)
    return tools


def add_cancellation(
    builder: StateGraph[Any, Any, Any, Any],
    *,
    ledger: Ledger | str | None = None,
    compensate_on_cancel: bool = False,
    cancel_timeout: float = 30.0,
    messages_key: str = "messages",
    report_key: str = REPORT_KEY,
    reconcile_interactive: bool = True,
    limits: Limits | None = None,
) -> CancellableStateGraph:
    """Make a graph builder safe to stop and safe to resume.

    Call it after adding your nodes and edges and before ``compile()``.

    Args:
        builder: A ``StateGraph`` whose state has a messages list.
        ledger: Where effects live when the graph is compiled without one of
            our savers (e.g. served by ``langgraph dev``): a ``Ledger`` or a URL.
            Default: the checkpointer's ledger, else ``$LANGGRAPH_CANCEL_DB``,
            else the embedded SQLite file.
        compensate_on_cancel: Undo committed reversible effects when cancelled.
        cancel_timeout: Seconds the cancel node waits for in-flight calls.
        messages_key: State key of the messages.
        report_key: State key the cancellation report is written to.
        reconcile_interactive: Ask a person (``interrupt()``) about outcomes
            reconciliation cannot settle.
        limits: A run's budget and deadline (``Limits``): a breach stops the run
            as a cancel request would, naming the limit in the report.

    Returns:
        The same builder (now a ``CancellableStateGraph``); compile it as usual.

    Raises:
        ConfigurationError: If the builder already has nodes with our names, or
            was already given to ``add_cancellation``.
    """
    _check_builder(builder)
    settings = CancellationSettings(
        ledger=ledger,
        compensate_on_cancel=compensate_on_cancel,
        cancel_timeout=cancel_timeout,
        messages_key=messages_key,
        report_key=report_key,
        reconcile_interactive=reconcile_interactive,
        tools=_collect_tools(builder),
        limits=limits,
        places_answers=_merges_with_add_messages(builder, messages_key),
    )
    for name, spec in list(builder.nodes.items()):
        builder.nodes[name] = dataclasses.replace(
            spec, runnable=_guard(name, spec.runnable, settings), ends=_with_cancel(spec.ends)
        )
    _add_report_channel(builder, report_key)
    _enter_through_reconcile(builder, settings)
    builder.add_node(CANCEL_NODE, make_cancel_node(settings))
    builder.add_edge(CANCEL_NODE, END)
    # No public seam makes a builder compile to a subclass: the builder becomes one.
    builder.__class__ = CancellableStateGraph
    cast(CancellableStateGraph, builder).cancellation = settings
    return cast(CancellableStateGraph, builder)


def _merges_with_add_messages(builder: StateGraph[Any, Any, Any, Any], key: str) -> bool:
    """Whether the state's ``key`` channel merges with ``add_messages`` (which takes
    ``RemoveMessage``, so a history can be rewritten in order)."""
    return getattr(builder.channels.get(key), "operator", None) is add_messages


def _check_builder(builder: StateGraph[Any, Any, Any, Any]) -> None:
    if isinstance(builder, CancellableStateGraph):
        raise ConfigurationError("add_cancellation() was already applied to this builder")
    for reserved in (CANCEL_NODE, RECONCILE_NODE):
        if reserved in builder.nodes:
            raise ConfigurationError(f"the builder already has a node named {reserved!r}")


def _add_report_channel(builder: StateGraph[Any, Any, Any, Any], report_key: str) -> None:
    """Give the state a channel for the report, and make it part of the output."""
    if report_key not in builder.channels:
        make_typed_dict: Any = TypedDict  # a field name known only at run time
        report_schema = make_typed_dict(
            "CancellationReportState", {report_key: dict[str, Any] | None}
        )
        # No public seam adds a channel to a builder but a node's input schema, which
        # would narrow what that node reads; the builder's own registration is used.
        builder._add_schema(report_schema)
    output_channels = builder.schemas.get(builder.output_schema)
    if output_channels is not None and "__root__" not in output_channels:
        # The report is part of what invoke() returns, not only of the saved state.
        output_channels.setdefault(report_key, builder.channels[report_key])


def _enter_through_reconcile(
    builder: StateGraph[Any, Any, Any, Any], settings: CancellationSettings
) -> None:
    """Put the reconcile node in START's place: START -> reconcile -> (what START led to).

    With plain entry edges, new input whose thread has nothing to reconcile goes
    straight on (one ledger read instead of a subgraph run).
    """
    start_edges = {(source, target) for (source, target) in builder.edges if source == START}
    for source, target in start_edges:
        builder.edges.discard((source, target))
        builder.edges.add((RECONCILE_NODE, target))
    builder.add_node(
        RECONCILE_NODE,
        make_reconcile_subgraph(settings, builder.state_schema),
        destinations=(CANCEL_NODE,),
    )
    if START in builder.branches:
        builder.branches[RECONCILE_NODE] = builder.branches.pop(START)
        builder.add_edge(START, RECONCILE_NODE)
    elif start_edges:
        targets = sorted(target for _, target in start_edges)
        builder.add_conditional_edges(
            START, _make_entry(settings, targets), [RECONCILE_NODE, *targets]
        )
    else:
        builder.add_edge(START, RECONCILE_NODE)


class CancellableStateGraph(StateGraph):  # type: ignore[type-arg]
    """A ``StateGraph`` that ``add_cancellation`` has prepared. Compile it as usual."""

    cancellation: CancellationSettings

    def compile(self, *args: Any, **kwargs: Any) -> CancellableGraph:
        """Compile, returning a graph that scopes each invocation to a run."""
        compiled = super().compile(*args, **kwargs)
        # ``StateGraph.compile`` builds a ``CompiledStateGraph`` with no seam for a
        # subclass: the compiled graph becomes one.
        compiled.__class__ = CancellableGraph
        graph = cast(CancellableGraph, compiled)
        graph.cancellation = self.cancellation
        return graph


__all__ = [
    "CANCEL_NODE",
    "CONFIG_KEY_WORKER",
    "DRAIN_REASON",
    "RECONCILE_NODE",
    "REPORT_KEY",
    "CancellableGraph",
    "CancellableStateGraph",
    "CancellationSettings",
    "add_cancellation",
    "answer_dangling",
    "finalize_cancel",
    "reconcile_now",
    "reconcile_thread",
    "resolve_ledger",
    "spec_of_unknown",
    "thread_id_of",
]

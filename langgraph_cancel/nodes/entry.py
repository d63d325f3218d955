"""The graph's entry: new input passes through the ``reconcile`` subgraph first.

Before anything of a thread is dispatched again, what the ledger does not know
is settled (``nodes.reconcile``), a person is asked about what stays unknown,
and the calls an earlier run left unanswered are recorded as never run and
answered (``nodes.cancel``). ``needs_reconcile`` is START's test: a thread with
nothing to settle, answer or stop goes straight on.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph._internal._runnable import RunnableCallable
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command

from langgraph_cancel.execution.answers import placed_answers
from langgraph_cancel.execution.identity import dangling_tool_calls
from langgraph_cancel.nodes.cancel import answer_dangling, drop_dangling
from langgraph_cancel.nodes.names import CANCEL_NODE, RECONCILE_NODE
from langgraph_cancel.nodes.reconcile import RECONCILABLE, ask_human_about, reconcile_thread
from langgraph_cancel.nodes.settings import CancellationSettings
from langgraph_cancel.runtime import scope_for
from langgraph_cancel.types import EffectStatus


def needs_reconcile(state: Any, config: RunnableConfig, settings: CancellationSettings) -> bool:
    """Whether new input must pass through the reconcile subgraph before anything runs.

    It must when the run is stopping, when the state has tool calls nobody
    answered, or when the ledger holds an outcome to settle (in flight, unknown,
    compensating): exactly the cases the subgraph's steps act on.
    """
    scope = scope_for(config, ledger=settings.ledger, new_run=False)
    if scope.run.terminal or scope.cancel_called():
        return True
    if dangling_tool_calls(settings.messages(state)):
        return True
    unsettled = scope.take_unsettled_at_start()
    if unsettled is None:
        unsettled = scope.ledger.unsettled(scope.thread_id)
    return any(rec.status in RECONCILABLE for rec in unsettled)


def _settle_step(settings: CancellationSettings) -> RunnableCallable:
    """``settle``: reconcile through the hooks; go on only when there is more to do."""

    def settle(state: Any, config: RunnableConfig) -> Any:
        scope = scope_for(config, ledger=settings.ledger, new_run=False)
        left = reconcile_thread(scope, settings, interactive=False)
        # The common case, nothing to settle, answer or stop, ends here: one step.
        if left and settings.reconcile_interactive:
            return Command(goto="ask_human")
        if (
            scope.run.terminal
            or scope.cancel_called()
            or dangling_tool_calls(settings.messages(state))
        ):
            return Command(goto="answer_dangling")
        return Command(goto=END)

    async def asettle(state: Any, config: RunnableConfig) -> Any:
        return await asyncio.to_thread(settle, state, config)  # ledger I/O off the loop

    return RunnableCallable(settle, asettle, name="settle")


def _ask_human_step(settings: CancellationSettings) -> Any:
    """``ask_human``: one interrupt about every outcome still unknown."""

    def ask_human(state: Any, config: RunnableConfig) -> Any:
        if not settings.reconcile_interactive:
            return None
        scope = scope_for(config, ledger=settings.ledger, new_run=False)
        left = [
            rec
            for rec in scope.ledger.unsettled(scope.thread_id)
            if rec.status is EffectStatus.UNKNOWN
        ]
        if left:
            ask_human_about(scope, left)
        return None

    return ask_human


def _answer_step(settings: CancellationSettings) -> Any:
    """``answer_dangling``: answer the calls nobody will run; divert to a stop."""

    def answer_unanswered(state: Any, config: RunnableConfig) -> Any:
        scope = scope_for(config, ledger=settings.ledger, new_run=False)
        update: dict[str, Any] = {}
        dangling = dangling_tool_calls(settings.messages(state))
        if dangling:
            # New input: LangGraph drops whatever was still queued, so the calls an
            # earlier cancelled, interrupted or crashed run left unanswered will never
            # run. Record them so and answer each (invariant I5).
            for call in dangling:
                drop_dangling(scope, settings, call)
            answers = answer_dangling(scope, dangling)
            update[settings.messages_key] = (
                placed_answers(settings.messages(state), answers)
                if settings.places_answers
                else answers
            )
        if scope.run.terminal or scope.cancel_called():
            return Command(graph=Command.PARENT, goto=CANCEL_NODE, update=update or None)
        if update:
            return Command(graph=Command.PARENT, update=update)
        return None

    return answer_unanswered


class _NoOutput(TypedDict):
    """The reconcile subgraph's output: nothing."""


def make_reconcile_subgraph(
    settings: CancellationSettings, state_schema: Any
) -> CompiledStateGraph:  # type: ignore[type-arg]
    """The reconciliation subgraph: settle -> [ask_human] -> [answer_dangling].

    ``settle`` goes on only when there is something to do: an unknown outcome to
    ask a person about, a dangling call to answer, or a stop to divert to.

    It runs on every new input, before anything of the thread is dispatched
    again, and shows in Studio as the ``reconcile`` node with its own steps.
    """
    # It gives the graph nothing back as its output: a subgraph's output is its whole
    # state, which the graph's reducers would apply again (an ``operator.add`` channel
    # doubled). What it changes goes to the graph by ``Command(graph=Command.PARENT)``.
    sub = StateGraph(state_schema, output_schema=_NoOutput)
    sub.add_node(
        "settle", _settle_step(settings), destinations=("ask_human", "answer_dangling", END)
    )
    sub.add_node("ask_human", _ask_human_step(settings))
    sub.add_node("answer_dangling", _answer_step(settings))
    sub.add_edge(START, "settle")
    sub.add_edge("ask_human", "answer_dangling")
    sub.add_edge("answer_dangling", END)
    return sub.compile(name=RECONCILE_NODE)


__all__ = ["make_reconcile_subgraph", "needs_reconcile"]

"""A sweeper given one agent, on a database that another agent's threads share.

LangGraph's server runs several graphs against one PostgreSQL; so may a deployment of
the user's. A sweeper given one of them (``Sweeper(graph=...)``, ``sweep --graph``)
finishes every stop no live worker holds, and closes the threads of its own agent
only: run on another agent's thread, even one whose pending node has a name its own
graph shares (``tools``), its graph would write its channels into that thread's
checkpoint.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graphs import dangling_calls
from langgraph_cancel import (
    EffectKind,
    EffectToolNode,
    add_cancellation,
    effect,
    get_report,
    request_cancel,
)
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.middleware import EffectMiddleware
from langgraph_cancel.sweep_summary import SweepActionKind
from langgraph_cancel.sweeper import Sweeper
from langgraph_cancel.testing import ScriptedChatModel, tool_call
from langgraph_cancel.types import RunStatus


def _lookup() -> BaseTool:
    @effect(EffectKind.READ_ONLY, requires_approval=False)
    @tool
    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        return f"order {order_id}: paid"

    return lookup_order


def _model() -> ScriptedChatModel:
    call = tool_call("lookup_order", {"order_id": "o-1"}, id="c-look")
    return ScriptedChatModel([AIMessage("", tool_calls=[call]), "done"], on_exhausted="repeat_last")


def graph_builder() -> Any:
    """An ``add_cancellation`` agent whose tool node is named ``tools``."""
    model = _model()

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    builder: Any = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectToolNode([_lookup()]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    add_cancellation(builder)
    return builder


def made_agent(saver: Any = None) -> Any:
    """A ``create_agent`` agent, whose tool node is named ``tools`` too."""
    return create_agent(_model(), [_lookup()], middleware=[EffectMiddleware()], checkpointer=saver)


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[SqliteCancelSaver]:
    conn = sqlite3.connect(tmp_path / "shared.db", check_same_thread=False)
    shared = SqliteCancelSaver(conn)
    shared.setup()
    yield shared
    conn.close()


def _stopped_before_its_tools(graph: Any, saver: SqliteCancelSaver, thread_id: str) -> Any:
    """A thread whose model asked for a call, its worker gone before the tool node ran,
    and a stop asked for: the thread's run is left stopping, its tools pending."""
    cfg: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    graph.invoke({"messages": [HumanMessage("look o-1 up")]}, cfg, interrupt_before=["tools"])
    assert graph.get_state(cfg).next == ("tools",)
    assert request_cancel(saver, thread_id, reason="user", requested_by="test").accepted
    return saver.get_tuple(cfg)


@pytest.mark.parametrize("given", ["add_cancellation", "create_agent"])
def test_a_sweeper_closes_its_own_agents_stopped_thread_and_leaves_the_others(
    saver: SqliteCancelSaver, given: str
) -> None:
    graphs = {
        "add_cancellation": graph_builder().compile(checkpointer=saver),
        "create_agent": made_agent(saver),
    }
    before = {kind: _stopped_before_its_tools(graph, saver, kind) for kind, graph in graphs.items()}
    other = next(kind for kind in graphs if kind != given)
    sweeper_graph = graph_builder() if given == "add_cancellation" else made_agent()

    summary = Sweeper(saver, graph=sweeper_graph, cancel_grace=0).sweep_once()

    finished = {
        a.thread_id: a for a in summary.actions if a.kind is SweepActionKind.FINISHED_CANCEL
    }
    assert set(finished) == set(graphs), summary.actions
    for kind in graphs:
        assert saver.ledger.require_latest_run(kind).status is RunStatus.CANCELLED
    own: RunnableConfig = {"configurable": {"thread_id": given}}
    state = graphs[given].get_state(own)
    assert state.next == () and not dangling_calls(state.values["messages"]), state
    assert state.values["cancellation_report"] == get_report(saver, given).model_dump(mode="json")
    assert "closed its thread" in finished[given].detail

    # The other agent's checkpoint is as its worker left it, the step left named.
    foreign: RunnableConfig = {"configurable": {"thread_id": other}}
    after = saver.get_tuple(foreign)
    assert after is not None and after.checkpoint["id"] == before[other].checkpoint["id"]
    assert "closed its thread" not in finished[other].detail
    assert f"resume {other}" in (finished[other].next_action or ""), finished[other]
    # Its own agent closes it, as after any stop its worker did not see through.
    graphs[other].invoke(None, foreign)
    closed = graphs[other].get_state(foreign)
    assert closed.next == () and not dangling_calls(closed.values["messages"]), closed
    assert closed.values["cancellation_report"]["run_id"] == get_report(saver, other).run_id

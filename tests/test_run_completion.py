"""When an invocation ends, its run is completed only if the graph ran to its end.

A graph that pauses (``interrupt()`` in a node, ``interrupt_before``) leaves its
run ``running`` for the resume to finish; LangGraph's lifecycle event says so,
sync and async, and for a graph invoked from inside another graph's node.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from graphs import config_for, new_thread, open_saver
from langgraph_cancel import add_cancellation
from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.subagents import child_config
from langgraph_cancel.types import RunStatus


def _builder() -> StateGraph[Any, Any, Any, Any]:
    def ask(state: MessagesState) -> dict[str, Any]:
        answer = interrupt("proceed?")
        return {"messages": [AIMessage(f"asked: {answer}")]}

    def finish(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("finished")]}

    builder = StateGraph(MessagesState)
    builder.add_node("ask", ask)
    builder.add_node("finish", finish)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "finish")
    builder.add_edge("finish", END)
    return builder


def _run(graph: Any, inp: Any, cfg: Any, use_async: bool) -> Any:
    return asyncio.run(graph.ainvoke(inp, cfg)) if use_async else graph.invoke(inp, cfg)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_paused_run_stays_running_and_completes_on_resume(db_url: str, use_async: bool) -> None:
    with open_saver(db_url) as saver:
        graph = add_cancellation(_builder()).compile(checkpointer=saver)
        thread = new_thread()
        out = _run(graph, {"messages": [HumanMessage("go")]}, config_for(thread), use_async)
        assert out["__interrupt__"][0].value == "proceed?"
        run = saver.ledger.latest_run(thread)
        assert run.status is RunStatus.RUNNING
        out = _run(graph, Command(resume="yes"), config_for(thread), use_async)
        assert [m.content for m in out["messages"][1:]] == ["asked: yes", "finished"]
        again = saver.ledger.latest_run(thread)
        assert again.run_id == run.run_id and again.status is RunStatus.COMPLETED


def test_interrupt_before_leaves_the_run_running(db_url: str) -> None:
    with open_saver(db_url) as saver:
        graph = add_cancellation(_builder()).compile(
            checkpointer=saver, interrupt_before=["finish"]
        )
        thread = new_thread()
        graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread))
        graph.invoke(Command(resume="yes"), config_for(thread))
        assert graph.get_state(config_for(thread)).next == ("finish",)
        assert saver.ledger.latest_run(thread).status is RunStatus.RUNNING
        graph.invoke(None, config_for(thread))
        assert saver.ledger.latest_run(thread).status is RunStatus.COMPLETED


def test_a_child_graph_pausing_inside_a_parent_node_keeps_its_own_thread(db_url: str) -> None:
    # The child is invoked with its own thread from the parent's node: its run, its
    # checkpoints and its pause are its own; the parent's run is not paused by it.
    with open_saver(db_url) as saver:
        child = add_cancellation(_builder()).compile(checkpointer=saver)
        parent_thread, child_thread = new_thread(), new_thread()

        def delegate(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
            cfg = child_config(config, child_thread)
            out = child.invoke({"messages": [HumanMessage("child go")]}, cfg)
            return {"messages": [AIMessage(f"child paused: {'__interrupt__' in out}")]}

        builder = StateGraph(MessagesState)
        builder.add_node("delegate", delegate)
        builder.add_edge(START, "delegate")
        builder.add_edge("delegate", END)
        parent = add_cancellation(builder).compile(checkpointer=saver)
        out = parent.invoke({"messages": [HumanMessage("go")]}, config_for(parent_thread))
        assert out["messages"][-1].content == "child paused: True"
        assert saver.ledger.latest_run(parent_thread).status is RunStatus.COMPLETED
        child_run = saver.ledger.latest_run(child_thread)
        assert child_run.status is RunStatus.RUNNING
        state = child.get_state({"configurable": {"thread_id": child_thread}})
        assert state.next == ("ask",)


def test_a_child_graph_does_not_take_the_parents_run_id(db_url: str) -> None:
    # A LangGraph API server puts the run id in the parent's configurable; a child
    # graph invoked with its own thread from a parent node has a run of its own.
    with open_saver(db_url) as saver:
        child = add_cancellation(_builder()).compile(checkpointer=saver)
        parent_thread, child_thread = new_thread(), new_thread()
        parent_run_id = str(uuid.uuid4())

        def delegate(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
            child.invoke(
                {"messages": [HumanMessage("child go")]}, child_config(config, child_thread)
            )
            return {"messages": [AIMessage("delegated")]}

        builder = StateGraph(MessagesState)
        builder.add_node("delegate", delegate)
        builder.add_edge(START, "delegate")
        builder.add_edge("delegate", END)
        parent = add_cancellation(builder).compile(checkpointer=saver)
        cfg: RunnableConfig = {
            "configurable": {"thread_id": parent_thread, "run_id": parent_run_id}
        }
        parent.invoke({"messages": [HumanMessage("go")]}, cfg)
        parent_run = saver.ledger.latest_run(parent_thread)
        child_run = saver.ledger.latest_run(child_thread)
        assert parent_run.run_id == parent_run_id
        assert child_run.run_id != parent_run_id
        assert child_run.parent_run_id == parent_run_id
        assert child_run.status is RunStatus.RUNNING  # paused at its interrupt


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_the_run_holds_its_lease_while_it_runs_and_gives_it_back(
    db_url: str, use_async: bool
) -> None:
    # Taken with the run in one round trip, given back with its completion in another.
    seen: list[Any] = []
    with open_saver(db_url) as saver:
        ledger = saver.ledger

        def work(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
            thread = config["configurable"]["thread_id"]
            seen.append(ledger.lease(thread))
            with pytest.raises(ThreadBusyError):
                ledger.start_run(thread, owner="another-worker", lease_ttl=30)
            if len(seen) == 1:
                interrupt("pause")
            return {"messages": [AIMessage("worked")]}

        builder = StateGraph(MessagesState)
        builder.add_node("work", work)
        builder.add_edge(START, "work")
        builder.add_edge("work", END)
        graph = add_cancellation(builder).compile(checkpointer=saver)
        thread = new_thread()
        _run(graph, {"messages": [HumanMessage("go")]}, config_for(thread), use_async)
        assert seen[0] is not None and seen[0].owner != "another-worker"
        assert ledger.lease(thread) is None  # paused: given back, the run still running
        assert ledger.latest_run(thread).status is RunStatus.RUNNING
        _run(graph, Command(resume="go on"), config_for(thread), use_async)
        assert ledger.lease(thread) is None
        assert [r.status for r in ledger.runs(thread)] == [RunStatus.COMPLETED]


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_no_input_on_a_new_thread_leaves_no_live_run(db_url: str, use_async: bool) -> None:
    """``invoke(None)`` on a thread with no checkpoint: LangGraph refuses it
    (``EmptyInputError``) before any step. The run the invocation opened has
    nothing to resume: it is closed, its lease given back, and the thread's next
    message starts a run of its own (found by the stateful chaos machine)."""
    from langgraph.errors import EmptyInputError

    with open_saver(db_url) as saver:
        graph = add_cancellation(_builder()).compile(checkpointer=saver)
        thread = new_thread()
        with pytest.raises(EmptyInputError):
            _run(graph, None, config_for(thread), use_async)
        (run,) = saver.ledger.runs(thread)
        assert run.status is RunStatus.FAILED
        assert saver.ledger.lease(thread) is None
        with pytest.raises(EmptyInputError):  # again: still nothing to resume, no new run
            _run(graph, None, config_for(thread), use_async)
        assert [r.run_id for r in saver.ledger.runs(thread)] == [run.run_id]
        out = _run(graph, {"messages": [HumanMessage("go")]}, config_for(thread), use_async)
        assert out["__interrupt__"][0].value == "proceed?"
        latest = saver.ledger.latest_run(thread)
        assert latest.run_id != run.run_id and latest.status is RunStatus.RUNNING

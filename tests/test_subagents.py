"""The task tree: cancelling a parent run cancels its sub-agents, and nobody is orphaned."""

from __future__ import annotations

import threading
import time
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

from graphs import agent_builder, cancellable
from langgraph_cancel import EffectKind, EffectToolNode, add_cancellation, effect, get_report
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.subagents import child_config
from langgraph_cancel.testing.fake_model import ScriptedChatModel, tool_call


def _child_graph(saver: MemoryCancelSaver, executed: list[str], started: threading.Event) -> Any:
    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def post(text: str) -> str:
        """Post a message."""
        executed.append(text)
        started.set()
        time.sleep(0.2)
        return f"posted {text}"

    turns = [AIMessage("", tool_calls=[tool_call("post", {"text": f"m{i}"})]) for i in range(8)]
    model = ScriptedChatModel([*turns, AIMessage("child done")])

    return cancellable(agent_builder(model, EffectToolNode([post])), saver)


def test_cancelling_the_parent_cancels_the_child_and_leaves_no_orphan() -> None:
    saver = MemoryCancelSaver()
    executed: list[str] = []
    started = threading.Event()
    child = _child_graph(saver, executed, started)
    after_delegate: list[str] = []

    def delegate(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        cfg = child_config(config, "child-1")
        out = child.invoke({"messages": [HumanMessage("post eight messages")]}, cfg)
        return {"messages": [AIMessage(f"child said: {out['messages'][-1].content}")]}

    def summarize(state: MessagesState) -> dict[str, Any]:
        after_delegate.append("ran")
        return {"messages": [AIMessage("summary")]}

    builder = StateGraph(MessagesState)
    builder.add_node("delegate", delegate)
    builder.add_node("summarize", summarize)
    builder.add_edge(START, "delegate")
    builder.add_edge("delegate", "summarize")
    builder.add_edge("summarize", END)
    parent = add_cancellation(builder).compile(checkpointer=saver)

    def stop() -> None:
        assert started.wait(10)
        saver.ledger.request_cancel("parent-1", reason="user pressed stop", requested_by="t")

    stopper = threading.Thread(target=stop)
    stopper.start()
    parent.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "parent-1"}})
    stopper.join()

    child_run = saver.ledger.latest_run("child-1")
    parent_run = saver.ledger.latest_run("parent-1")
    assert child_run is not None and parent_run is not None
    assert child_run.parent_run_id == parent_run.run_id
    assert child_run.status.value == "cancelled"
    assert child_run.observed_at is not None
    # The child stopped at its next check: at most the in-flight post completed.
    assert 1 <= len(executed) <= 2
    assert after_delegate == []  # the parent's next node never ran
    report = get_report(saver, "parent-1")
    assert report.status == "cancelled"
    assert report.orphans == 0
    # What survived in the child is what survived of the parent's run: the user is told.
    assert [e.tool for e in report.permanent] == ["post"] * len(executed)
    assert {e.child_run_id for e in report.permanent} == {child_run.run_id}
    assert {e.child_thread_id for e in report.permanent} == {"child-1"}
    assert "permanent" in report.summary and "nothing permanent" not in report.summary
    child_report = get_report(saver, "child-1")
    assert child_report.dispatched_after_cancel == 0
    assert len(child_report.permanent) == len(executed)


def test_child_registered_after_the_cancel_starts_cancelled() -> None:
    saver = MemoryCancelSaver()
    run = saver.ledger.start_run("p2")
    saver.ledger.request_cancel("p2", reason="stop", requested_by="t")
    cfg = child_config(
        {"configurable": {"thread_id": "p2", "langgraph_cancel_ledger": saver.ledger}}, "c2"
    )
    assert cfg["configurable"]["thread_id"] == "c2"
    child = saver.ledger.latest_run("c2")
    assert child is not None and child.parent_run_id == run.run_id
    assert child.status.value == "cancel_requested"

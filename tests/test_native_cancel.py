"""Native cancellation: the run's asyncio task is cancelled (runs.cancel, disconnect, Ctrl-C)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph

from graphs import agent_builder, cancellable
from langgraph_cancel import EffectKind, EffectToolNode, add_cancellation, effect, get_report
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.testing.fake_model import ScriptedChatModel, tool_call


def _agent(
    saver: MemoryCancelSaver,
    seconds: float,
    started: asyncio.Event,
    done: list[str],
    *,
    cancel_timeout: float,
) -> Any:
    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    async def charge(amount: int) -> str:
        """Charge a card."""
        started.set()
        await asyncio.sleep(seconds)
        done.append(f"charged {amount}")
        return f"charged {amount}"

    model = ScriptedChatModel(
        [
            AIMessage(
                "",
                tool_calls=[tool_call("charge", {"amount": 5}), tool_call("charge", {"amount": 7})],
            ),
            AIMessage("after cancel"),
        ],
    )

    node = EffectToolNode([charge], cancel_timeout=cancel_timeout)
    return cancellable(agent_builder(model, node, use_async=True), saver)


async def _run_and_cancel(graph: Any, thread: str, started: asyncio.Event) -> None:
    task = asyncio.create_task(
        graph.ainvoke(
            {"messages": [HumanMessage("charge")]}, {"configurable": {"thread_id": thread}}
        )
    )
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_in_flight_call_is_awaited_and_recorded_then_the_run_is_cancelled() -> None:
    saver = MemoryCancelSaver()
    started, done = asyncio.Event(), list[str]()
    graph = _agent(saver, 0.3, started, done, cancel_timeout=5)
    await _run_and_cancel(graph, "n1", started)
    # The in-flight charge finished and was recorded; the second one never ran.
    assert done == ["charged 5"]
    effects = {e.args["amount"]: e for e in saver.ledger.effects("n1")}
    assert effects[5].status.value == "committed"
    assert 7 not in effects or effects[7].status.value == "dropped"
    report = get_report(saver, "n1")
    assert report.status == "cancelled"
    assert [e.args for e in report.permanent] == [{"amount": 5}]
    assert report.unknown == []
    # The next input on the thread works: every call gets an answer first.
    out = await graph.ainvoke(
        {"messages": [HumanMessage("and now?")]}, {"configurable": {"thread_id": "n1"}}
    )
    answered = {m.tool_call_id for m in out["messages"] if isinstance(m, ToolMessage)}
    asked = {c["id"] for m in out["messages"] if isinstance(m, AIMessage) for c in m.tool_calls}
    assert asked <= answered
    assert out["messages"][-1].content == "after cancel"
    assert done == ["charged 5"]


async def test_call_outliving_the_timeout_is_recorded_unknown_with_an_owner() -> None:
    saver = MemoryCancelSaver()
    started, done = asyncio.Event(), list[str]()
    graph = _agent(saver, 2.0, started, done, cancel_timeout=0.2)
    await _run_and_cancel(graph, "n2", started)
    rec = next(e for e in saver.ledger.effects("n2") if e.args["amount"] == 5)
    assert rec.status.value == "unknown"
    assert rec.owner and rec.next_action
    report = get_report(saver, "n2")
    assert report.status == "cancelled"
    assert [e.effect_id for e in report.unknown] == [rec.effect_id]


async def test_a_cancelled_run_stops_waiting_after_the_tools_timeout_then_settles_late() -> None:
    saver = MemoryCancelSaver()
    started, done = asyncio.Event(), list[str]()
    graph = _agent(saver, 1.5, started, done, cancel_timeout=0.2)
    thread = "n3"

    async def stop() -> None:
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.to_thread(
            saver.ledger.request_cancel, thread, reason="stop", requested_by="test"
        )

    stopper = asyncio.create_task(stop())
    await graph.ainvoke(
        {"messages": [HumanMessage("charge")]}, {"configurable": {"thread_id": thread}}
    )
    await stopper
    assert done == [], "the cancel waited for the tool past its cancel_timeout"
    rec = next(e for e in saver.ledger.effects(thread) if e.args["amount"] == 5)
    assert rec.status.value == "unknown" and rec.owner and rec.next_action
    report = get_report(saver, thread)
    assert [e.effect_id for e in report.unknown] == [rec.effect_id]
    # The call was never abandoned: when it finishes, its outcome is recorded.
    for _ in range(100):
        if saver.ledger.get_effect(rec.effect_id).status.value == "committed":
            break
        await asyncio.sleep(0.05)
    assert saver.ledger.get_effect(rec.effect_id).status.value == "committed"
    assert done == ["charged 5"]


async def test_a_task_cancel_swallowed_inside_the_run_still_stops_it() -> None:
    """A client library that swallows the task cancel lets the graph run on to its end:
    the run is still recorded stopped, never ``completed``."""
    saver = MemoryCancelSaver()
    started = asyncio.Event()

    async def stubborn(state: MessagesState) -> dict[str, Any]:
        started.set()
        # What a library that swallows the cancel does.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(5)
        return {"messages": [AIMessage("finished anyway")]}

    builder = StateGraph(MessagesState)
    builder.add_node("stubborn", stubborn)
    builder.add_edge(START, "stubborn")
    graph = add_cancellation(builder).compile(checkpointer=saver)
    task = asyncio.create_task(
        graph.ainvoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "n4"}})
    )
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    run = saver.ledger.latest_run("n4")
    assert run is not None
    assert run.status.value == "cancelled", run
    assert get_report(saver, "n4").status == "cancelled"

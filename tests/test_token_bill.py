"""Stopping the token bill: the real ChatOpenAI client against a loopback streaming server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from langgraph_cancel import add_cancellation, get_report, request_cancel
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.nodes.model import CancellableModelNode
from langgraph_cancel.types import RunStatus
from openai_stub import OpenAIStub

langchain_openai = pytest.importorskip("langchain_openai")


def _graph(base_url: str, saver: MemoryCancelSaver):  # type: ignore[no-untyped-def]
    model = langchain_openai.ChatOpenAI(
        base_url=base_url, api_key="test-key", model="stub-model", streaming=True, max_retries=0
    )
    builder = StateGraph(MessagesState)
    builder.add_node("agent", CancellableModelNode(model))
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return add_cancellation(builder).compile(checkpointer=saver)


def test_stream_completes_when_not_cancelled() -> None:
    saver = MemoryCancelSaver()
    with OpenAIStub(tokens=5, delay=0.0) as stub:
        graph = _graph(stub.base_url, saver)
        out = graph.invoke(
            {"messages": [HumanMessage("hi")]}, {"configurable": {"thread_id": "ok"}}
        )
        assert out["messages"][-1].content.split() == [f"tok{i}" for i in range(5)]
        assert stub.state.finished.wait(5)
    run = saver.ledger.latest_run("ok")
    assert run is not None and run.status.value == "completed"


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_cancel_closes_the_connection_and_counts_tokens_after(mode: str) -> None:
    saver = MemoryCancelSaver()
    thread = f"bill-{mode}"
    with OpenAIStub(tokens=400, delay=0.01) as stub:
        graph = _graph(stub.base_url, saver)

        def stop() -> None:
            deadline = time.monotonic() + 10
            while stub.state.sent < 20 and time.monotonic() < deadline:
                time.sleep(0.005)
            request_cancel(saver, thread, reason="user pressed stop", requested_by="test")

        stopper = threading.Thread(target=stop)
        stopper.start()
        config = {"configurable": {"thread_id": thread}}
        if mode == "sync":
            out = graph.invoke({"messages": [HumanMessage("write a lot")]}, config)
        else:
            out = await graph.ainvoke({"messages": [HumanMessage("write a lot")]}, config)
        stopper.join()
        # The server saw the client hang up and stopped generating.
        assert stub.state.disconnected.wait(5), "server never saw the connection close"
        assert not stub.state.finished.is_set()
        assert stub.state.sent < 400
        sent_at_close = stub.state.sent
        time.sleep(0.1)
        assert stub.state.sent == sent_at_close
    report = get_report(saver, thread)
    assert report.status == "cancelled"
    assert report.tokens_after_cancel is not None
    # Checked between every chunk: at most a couple of tokens slip in after the request.
    assert 0 <= report.tokens_after_cancel <= 3
    # No partial answer was written to the thread.
    assert all(m.type != "ai" for m in out["messages"])
    assert out["cancellation_report"]["tokens_after_cancel"] == report.tokens_after_cancel


async def test_a_cancelled_run_task_closes_the_stream_itself_every_time() -> None:
    """A LangGraph server's ``runs.cancel`` cancels the run's asyncio task: each of 20 such
    stops closes the stream (the server sees the hang-up), counts exactly the tokens the
    server sent after the stop, and leaves the run stopped, never completed."""
    saver = MemoryCancelSaver()
    tokens_before_stop = 4
    # Slow tokens: the client reads each one long before the next is sent, so "after
    # the stop" means the same tokens to the server and to the client.
    with OpenAIStub(tokens=200, delay=0.05) as stub:
        graph = _graph(stub.base_url, saver)
        for attempt in range(20):
            thread = f"task-cancel-{attempt}"
            task = asyncio.create_task(
                graph.ainvoke(
                    {"messages": [HumanMessage("write a lot")]},
                    {"configurable": {"thread_id": thread}},
                )
            )
            while len(stub.state.streams) <= attempt or (
                stub.state.streams[attempt].sent < tokens_before_stop
            ):
                await asyncio.sleep(0.002)
            log = stub.state.streams[attempt]
            await asyncio.sleep(stub.state.delay / 2)  # the client has read what was sent
            sent_at_stop = log.sent
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await asyncio.to_thread(log.disconnected.wait, 5), (
                f"stop {attempt}: the server never saw the stream closed"
            )
            assert not log.finished.is_set()
            run = saver.ledger.latest_run(thread)
            assert run is not None
            assert run.status is RunStatus.CANCELLED, (attempt, run)
            report = get_report(saver, thread)
            assert report.status == "cancelled"
            assert report.tokens_after_cancel == log.sent - sent_at_stop, (
                attempt,
                report.tokens_after_cancel,
                log.sent,
                sent_at_stop,
            )
    runs = [r for t in range(20) for r in saver.ledger.runs(f"task-cancel-{t}")]
    assert len(runs) == 20
    assert all(r.status is not RunStatus.COMPLETED for r in runs)

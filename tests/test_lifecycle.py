"""How an invocation ended (``RunEnding``) and what its end does to the run.

The sync and async streams share one classification of what ended them; these
tests hold it to the enum, and a real graph to the run each ending leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator
from typing import Any, cast, get_args

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.errors import EmptyInputError, GraphDrained
from langgraph.graph import END, START, MessagesState, StateGraph

from graphs import config_for, new_thread, open_saver
from langgraph_cancel import add_cancellation
from langgraph_cancel.lifecycle import (
    ASYNC_STOPS,
    SYNC_STOPS,
    RunEnding,
    RunEndingLiteral,
    ending_of,
)
from langgraph_cancel.nodes.cancel import DRAIN_REASON
from langgraph_cancel.types import RunStatus


def test_the_literal_names_every_ending() -> None:
    assert set(get_args(RunEndingLiteral)) == {ending.value for ending in RunEnding}


@pytest.mark.parametrize(
    ("raised", "sync", "asynchronous"),
    [
        (GraphDrained(DRAIN_REASON), RunEnding.CANCELLED, RunEnding.CANCELLED),
        (GraphDrained("shutdown"), RunEnding.FAILED, RunEnding.FAILED),
        (KeyboardInterrupt(), RunEnding.INTERRUPTED, RunEnding.INTERRUPTED),
        (asyncio.CancelledError(), RunEnding.FAILED, RunEnding.INTERRUPTED),
        (EmptyInputError(), RunEnding.EMPTY, RunEnding.EMPTY),
        (ValueError("boom"), RunEnding.FAILED, RunEnding.FAILED),
        (GeneratorExit(), RunEnding.FAILED, RunEnding.FAILED),
    ],
    ids=["our-drain", "other-drain", "ctrl-c", "task-cancel", "empty", "error", "closed"],
)
def test_what_ended_an_invocation(
    raised: BaseException, sync: RunEnding, asynchronous: RunEnding
) -> None:
    assert ending_of(raised, SYNC_STOPS) is sync
    assert ending_of(raised, ASYNC_STOPS) is asynchronous


def _failing_builder() -> StateGraph[Any, Any, Any, Any]:
    def fail(state: MessagesState) -> dict[str, Any]:
        raise ValueError("the node broke")

    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("done")]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_node("fail", fail)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", "fail")
    builder.add_edge("fail", END)
    return builder


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_failed_invocation_leaves_its_run_to_resume(db_url: str, use_async: bool) -> None:
    """``FAILED``: the run stays live, as after a crash, and its lease is given back."""
    with open_saver(db_url) as saver:
        graph = add_cancellation(_failing_builder()).compile(checkpointer=saver)
        thread = new_thread()
        inp = {"messages": [HumanMessage("go")]}
        with pytest.raises(ValueError, match="the node broke"):
            if use_async:
                asyncio.run(graph.ainvoke(inp, config_for(thread)))
            else:
                graph.invoke(inp, config_for(thread))
        run = saver.ledger.latest_run(thread)
        assert run.status is RunStatus.RUNNING
        assert saver.ledger.lease(thread) is None


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_stream_closed_early_leaves_its_run_live(db_url: str, use_async: bool) -> None:
    """A consumer that stops reading ends the invocation as ``FAILED``, never completed."""
    with open_saver(db_url) as saver:
        graph = add_cancellation(_failing_builder()).compile(checkpointer=saver)
        thread = new_thread()
        inp = {"messages": [HumanMessage("go")]}

        async def first_chunk() -> None:
            stream = cast(AsyncGenerator[Any, None], graph.astream(inp, config_for(thread)))
            await anext(stream)
            await stream.aclose()

        if use_async:
            asyncio.run(first_chunk())
        else:
            stream = cast(Generator[Any, None, None], graph.stream(inp, config_for(thread)))
            next(stream)
            stream.close()
        run = saver.ledger.latest_run(thread)
        assert run.status is RunStatus.RUNNING
        assert saver.ledger.lease(thread) is None

"""ScriptedChatModel: a real BaseChatModel that plays back a script."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langgraph_cancel.testing import (
    ScriptedChatModel,
    ScriptExhaustedError,
    split_tokens,
    tool_call,
    tool_calls_turn,
)


@tool
def lookup_order(order_id: str) -> str:
    """Look up an order by id."""
    return f'{{"order_id": "{order_id}", "status": "paid"}}'


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_is_a_real_chat_model() -> None:
    model = ScriptedChatModel(["hi"])
    assert isinstance(model, BaseChatModel)
    assert model._llm_type == "scripted"


def test_invoke_plays_turns_in_order_and_counts_calls() -> None:
    model = ScriptedChatModel(["first answer", AIMessage(content="second answer")])
    assert model.calls == 0
    first = model.invoke("hello")
    second = model.invoke([HumanMessage("again")])
    assert isinstance(first, AIMessage)
    assert first.content == "first answer"
    assert second.content == "second answer"
    assert model.calls == 2
    assert model.remaining == 0
    assert model.tokens_emitted == 4


def test_turns_keyword_and_bad_turn() -> None:
    assert ScriptedChatModel(turns=["x"]).invoke("q").content == "x"
    with pytest.raises(TypeError, match="turn 0"):
        ScriptedChatModel([42])  # type: ignore[list-item]


def test_tool_calls_get_unique_ids() -> None:
    turn = tool_calls_turn(tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 3, "b": 4}))
    model = ScriptedChatModel([turn], on_exhausted="repeat_last")
    ids: list[str] = []
    for _ in range(5):
        message = model.invoke("go")
        assert isinstance(message, AIMessage)
        assert [c["args"] for c in message.tool_calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
        ids.extend(str(c["id"]) for c in message.tool_calls)
    assert len(ids) == 10
    assert len(set(ids)) == 10
    assert all(i.startswith("call_") and len(i) == len("call_") + 12 for i in ids)
    # The script itself is not mutated.
    assert turn.tool_calls[0]["id"] is None


def test_explicit_ids_are_kept_once_then_replaced_on_repeat() -> None:
    model = ScriptedChatModel(
        [tool_calls_turn(tool_call("add", {"a": 1, "b": 1}, id="call-fixed"))],
        on_exhausted="repeat_last",
    )
    first = model.invoke("go")
    second = model.invoke("go")
    assert isinstance(first, AIMessage) and isinstance(second, AIMessage)
    assert first.tool_calls[0]["id"] == "call-fixed"
    assert second.tool_calls[0]["id"] not in (None, "call-fixed")


def test_exhaustion_raises_by_default() -> None:
    model = ScriptedChatModel(["only turn"])
    model.invoke("one")
    with pytest.raises(ScriptExhaustedError, match="exhausted"):
        model.invoke("two")
    assert model.calls == 2


def test_exhaustion_repeat_last() -> None:
    model = ScriptedChatModel(["working", "done"], on_exhausted="repeat_last")
    contents = [model.invoke("x").content for _ in range(4)]
    assert contents == ["working", "done", "done", "done"]


def test_empty_script_errors_even_with_repeat_last() -> None:
    with pytest.raises(ScriptExhaustedError):
        ScriptedChatModel([], on_exhausted="repeat_last").invoke("x")


def test_reactive_turn_sees_messages() -> None:
    seen: list[list[BaseMessage]] = []

    def react(messages: list[BaseMessage]) -> AIMessage:
        seen.append(messages)
        return AIMessage(content=f"you said {messages[-1].content}")

    model = ScriptedChatModel([react, lambda messages: f"{len(messages)} messages"])
    assert model.invoke("ping").content == "you said ping"
    assert model.invoke([HumanMessage("a"), HumanMessage("b")]).content == "2 messages"
    assert seen[0][-1].content == "ping"
    assert [len(batch) for batch in model.inputs] == [1, 2]


def test_stream_token_by_token_with_tool_calls_last() -> None:
    turn = AIMessage(
        content="Let me look that up",
        tool_calls=[tool_call("lookup_order", {"order_id": "o-88"})],
    )
    model = ScriptedChatModel([turn], report_usage=True)
    chunks = list(model.stream("where is o-88?"))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    texts = [c.content for c in chunks]
    assert texts[:-1] == ["Let ", "me ", "look ", "that ", "up"]
    assert not any(c.tool_call_chunks for c in chunks[:-1])
    last = chunks[-1]
    assert isinstance(last, AIMessageChunk)
    assert last.tool_call_chunks[0]["name"] == "lookup_order"
    assert last.chunk_position == "last"
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert isinstance(merged, AIMessageChunk)
    assert merged.content == "Let me look that up"
    assert merged.tool_calls[0]["args"] == {"order_id": "o-88"}
    assert str(merged.tool_calls[0]["id"]).startswith("call_")
    assert merged.usage_metadata is not None
    assert merged.usage_metadata["output_tokens"] == 6  # 5 words + 1 tool call
    assert model.tokens_emitted == 6


def test_split_tokens_round_trips() -> None:
    text = "  The refund  r-4471\nwas issued. "
    assert "".join(split_tokens(text)) == text
    assert split_tokens("") == []


def test_stream_and_invoke_agree() -> None:
    script = ["one two three"]
    invoked = ScriptedChatModel(script).invoke("x")
    streamed = list(ScriptedChatModel(script).stream("x"))
    assert "".join(str(c.content) for c in streamed) == invoked.content


def test_delay_per_token_sync() -> None:
    model = ScriptedChatModel(["a b c d"], delay_per_token=0.02)
    started = time.monotonic()
    model.invoke("x")
    assert time.monotonic() - started >= 0.07


async def test_astream_and_ainvoke() -> None:
    model = ScriptedChatModel(["hello async world", "bye"])
    chunks = [c async for c in model.astream("x")]
    assert [c.content for c in chunks] == ["hello ", "async ", "world"]
    assert (await model.ainvoke("y")).content == "bye"
    assert model.calls == 2


async def _until_tokens_flow(model: ScriptedChatModel) -> None:
    """Wait for the first tokens, however slow the machine is to start the call."""
    deadline = time.monotonic() + 10
    while model.tokens_emitted < 3:
        assert time.monotonic() < deadline, "the model emitted no tokens in 10 s"
        await asyncio.sleep(0.005)


async def test_cancel_mid_stream_stops_tokens() -> None:
    words = " ".join(f"w{i}" for i in range(50))
    model = ScriptedChatModel([words], delay_per_token=0.01)
    received: list[str] = []

    async def consume() -> None:
        async for chunk in model.astream("go"):
            received.append(str(chunk.content))

    task = asyncio.create_task(consume())
    await _until_tokens_flow(model)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    emitted = model.tokens_emitted
    assert 0 < emitted < 50
    await asyncio.sleep(0.1)
    assert model.tokens_emitted == emitted  # the token spend stopped
    assert len(received) <= emitted


async def test_cancel_mid_ainvoke_stops_tokens() -> None:
    model = ScriptedChatModel([" ".join(["tok"] * 100)], delay_per_token=0.01)
    task = asyncio.create_task(model.ainvoke("go"))
    await _until_tokens_flow(model)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    emitted = model.tokens_emitted
    await asyncio.sleep(0.05)
    assert 0 < model.tokens_emitted == emitted < 100


def test_bind_tools_returns_same_model() -> None:
    model = ScriptedChatModel(["x"])
    bound = model.bind_tools([lookup_order, add], tool_choice="auto", parallel_tool_calls=True)
    assert bound is model
    assert model.bound_tools == ["lookup_order", "add"]
    assert bound.invoke("q").content == "x"


def test_instances_do_not_share_state() -> None:
    first_model = ScriptedChatModel(["a1", "a2"])
    second_model = ScriptedChatModel(["b1", "b2"])
    assert first_model.invoke("x").content == "a1"
    assert second_model.invoke("x").content == "b1"
    assert first_model.invoke("x").content == "a2"
    assert (first_model.calls, second_model.calls) == (2, 1)


def test_threads_consume_each_turn_once() -> None:
    turns: list[Any] = [f"turn-{i}" for i in range(200)]
    model = ScriptedChatModel(turns)
    results: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(25):
            content = str(model.invoke("x").content)
            with lock:
                results.append(content)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == sorted(turns)
    assert model.calls == 200


def test_reset_rewinds() -> None:
    model = ScriptedChatModel(["a", "b"])
    model.invoke("x")
    model.reset()
    assert model.calls == 0 and model.tokens_emitted == 0
    assert model.invoke("x").content == "a"


def _agent_graph(model: ScriptedChatModel) -> Any:
    tools = [add, lookup_order]
    bound = model.bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile()


def _answer_from_tool(messages: list[BaseMessage]) -> AIMessage:
    last = messages[-1]
    assert isinstance(last, ToolMessage)
    return AIMessage(content=f"The sum is {last.content}.")


def test_two_turn_agent_loop_with_toolnode() -> None:
    model = ScriptedChatModel(
        [tool_calls_turn(tool_call("add", {"a": 2, "b": 40})), _answer_from_tool]
    )
    graph = _agent_graph(model)
    result = graph.invoke({"messages": [HumanMessage("what is 2 + 40?")]})
    messages = result["messages"]
    assert [type(m).__name__ for m in messages] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    call = messages[1].tool_calls[0]
    assert messages[2].tool_call_id == call["id"]
    assert messages[2].content == "42"
    assert messages[3].content == "The sum is 42."
    assert model.calls == 2


async def test_agent_loop_streams_tokens_through_langgraph() -> None:
    model = ScriptedChatModel(
        [
            tool_calls_turn(
                tool_call("lookup_order", {"order_id": "o-88"}),
                tool_call("add", {"a": 1, "b": 1}),
                content="Checking now",
            ),
            "Order o-88 is paid",
        ]
    )
    graph = _agent_graph(model)
    tokens: list[str] = []
    async for message, _meta in graph.astream(
        {"messages": [HumanMessage("status of o-88?")]}, stream_mode="messages"
    ):
        if isinstance(message, AIMessageChunk) and message.content:
            tokens.append(str(message.content))
    assert tokens == ["Checking ", "now", "Order ", "o-88 ", "is ", "paid"]
    assert model.calls == 2


def test_works_with_create_agent() -> None:
    agents = pytest.importorskip("langchain.agents")
    model = ScriptedChatModel(
        [tool_calls_turn(tool_call("add", {"a": 20, "b": 22})), _answer_from_tool]
    )
    agent = agents.create_agent(model, tools=[add])
    result = agent.invoke({"messages": [HumanMessage("20 + 22?")]})
    assert result["messages"][-1].content == "The sum is 42."
    assert model.bound_tools == ["add"]

"""A call's turn (how many earlier model messages asked for its id) is counted from one
pass over the history per batch, and agrees with the definition call by call."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from benchmarks.agent import READ_ONLY, SIDE_EFFECT, build_graph, make_tool, scripted_model
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.execution import identity
from langgraph_cancel.execution.identity import CallTurns, call_turn
from langgraph_cancel.testing import tool_call

IDS = st.sampled_from(["a", "b", "c", "None"])


def _defined_turn(messages: Sequence[Any], call_id: str) -> int:
    """The definition: model messages asking for ``call_id``, less the one asking now."""
    asking = [
        message
        for message in messages
        if isinstance(message, AIMessage)
        and any(call.get("id") == call_id for call in message.tool_calls)
    ]
    return max(len(asking) - 1, 0)


@st.composite
def histories(draw: st.DrawFn) -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["human", "ai", "tool"]))
        if kind == "human":
            messages.append(HumanMessage("go"))
        elif kind == "tool":
            messages.append(ToolMessage("ok", tool_call_id=draw(IDS)))
        else:
            # Ids may repeat inside one message; a message asking twice counts once.
            calls = [
                tool_call("work", {"i": 0}, id=draw(IDS)) for _ in range(draw(st.integers(0, 3)))
            ]
            messages.append(AIMessage("", tool_calls=calls))
    return messages


@given(histories(), IDS)
def test_one_pass_agrees_with_the_definition(messages: list[BaseMessage], call_id: str) -> None:
    assert CallTurns(messages).of(call_id) == _defined_turn(messages, call_id)
    assert call_turn(messages, call_id) == _defined_turn(messages, call_id)


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many times a history is counted (``CallTurns`` built), as the run goes."""
    counted = [0]
    built = identity.CallTurns.__init__

    def counting(self: CallTurns, messages: Sequence[Any]) -> None:
        counted[0] += 1
        built(self, messages)

    monkeypatch.setattr(identity.CallTurns, "__init__", counting)
    yield counted


@pytest.mark.parametrize("effect_concurrency", [1, 3])
@pytest.mark.parametrize("kind", [READ_ONLY, SIDE_EFFECT])
def test_a_batch_counts_its_history_a_fixed_number_of_times(
    passes: list[int], kind: str, effect_concurrency: int
) -> None:
    def counted_for(calls: int) -> int:
        graph = build_graph(
            [make_tool(kind, 0)],
            scripted_model(calls),
            MemoryCancelSaver(),
            effectful=True,
            effect_concurrency=effect_concurrency,
        )
        passes[0] = 0
        out = graph.invoke(
            {"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": uuid.uuid4().hex}}
        )
        assert len(out["messages"]) == calls + 3
        return passes[0]

    # The batch's schedule and its calls share one count: forty calls count the
    # history as often as two do, not once a call.
    assert counted_for(40) == counted_for(2) <= 2

"""The reconciliation subgraph: unknown outcomes are settled before anything runs again."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from graphs import agent_builder, calls, cancellable, scripted
from langgraph_cancel import EffectKind, EffectToolNode, Outcome, effect
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.errors import InvalidDecisionError
from langgraph_cancel.execution.answers import NOT_RUN_CANCELLED
from langgraph_cancel.testing.fake_model import ScriptedChatModel


def _graph(saver: MemoryCancelSaver, outcomes: dict[str, Outcome]) -> Any:
    def ask_provider(key: str, args: dict[str, Any]) -> Outcome:
        return outcomes.get(args["order_id"], Outcome.unknown("provider has no answer"))

    @effect(EffectKind.IRREVERSIBLE, requires_approval=False, reconcile=ask_provider)
    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    model = ScriptedChatModel([AIMessage("resumed")], on_exhausted="repeat_last")

    return cancellable(agent_builder(model, EffectToolNode([refund])), saver)


def _left_in_flight(saver: MemoryCancelSaver, thread: str, order_id: str) -> str:
    """What a worker killed between its intent write and the answer leaves behind."""
    run = saver.ledger.start_run(thread)
    rec, _ = saver.ledger.plan(
        thread_id=thread,
        run_id=run.run_id,
        tool_call_id=f"c-{order_id}",
        tool="refund",
        kind="irreversible",
        args={"order_id": order_id},
    )
    saver.ledger.transition(rec.effect_id, "dispatched", owner="dead-worker")
    return rec.effect_id


def test_the_subgraph_is_visible_in_the_drawn_graph() -> None:
    graph = _graph(MemoryCancelSaver(), {})
    nodes = set(graph.get_graph(xray=True).nodes)
    assert {"reconcile:settle", "reconcile:ask_human", "reconcile:answer_dangling"} <= nodes
    assert "cancel" in nodes


def test_new_input_settles_in_flight_effects_through_the_hook_first() -> None:
    saver = MemoryCancelSaver()
    graph = _graph(saver, {"o1": Outcome.committed("refund r-1"), "o2": Outcome.not_applied()})
    e1 = _left_in_flight(saver, "r1", "o1")
    e2 = _left_in_flight(saver, "r1", "o2")
    out = graph.invoke(
        {"messages": [HumanMessage("continue")]}, {"configurable": {"thread_id": "r1"}}
    )
    assert out["messages"][-1].content == "resumed"
    assert saver.ledger.get_effect(e1).status.value == "committed"
    assert saver.ledger.get_effect(e1).result["content"] == "refund r-1"
    assert saver.ledger.get_effect(e2).status.value == "not_applied"
    audit = saver.ledger.history(e1)
    assert audit[-1].actor == "reconciler"


def test_what_stays_unknown_goes_to_a_human_and_the_decision_is_recorded() -> None:
    saver = MemoryCancelSaver()
    graph = _graph(saver, {})
    effect_id = _left_in_flight(saver, "r2", "o9")
    config = {"configurable": {"thread_id": "r2"}}
    out = graph.invoke({"messages": [HumanMessage("continue")]}, config)
    rec = saver.ledger.get_effect(effect_id)
    assert rec.status.value == "unknown" and rec.owner and rec.next_action
    interrupts = out["__interrupt__"]
    payload = interrupts[0].value
    assert payload["type"] == "langgraph_cancel.reconcile"
    assert [e["effect_id"] for e in payload["effects"]] == [effect_id]
    # A malformed answer is refused with a clear error and the question asked again.
    out = graph.invoke(Command(resume=[{"effect_id": effect_id, "decision": "maybe"}]), config)
    again = out["__interrupt__"][0].value
    assert "decision must be one of" in again["error"]
    assert saver.ledger.get_effect(effect_id).status.value == "unknown"
    with pytest.raises(InvalidDecisionError):
        from langgraph_cancel.nodes.reconcile import parse_decisions

        parse_decisions({"decisions": "nope"}, [saver.ledger.get_effect(effect_id)])
    out = graph.invoke(
        Command(
            resume=[
                {
                    "effect_id": effect_id,
                    "decision": "committed",
                    "result": "provider shows r-77",
                    "reviewer": "ops@shop",
                }
            ]
        ),
        config,
    )
    rec = saver.ledger.get_effect(effect_id)
    assert rec.status.value == "committed"
    assert saver.ledger.history(effect_id)[-1].actor == "ops@shop"
    assert out["messages"][-1].content == "resumed"


def test_hooks_that_raise_hang_or_return_garbage_leave_unknown_not_a_crash() -> None:
    import time

    from langgraph_cancel.effects import spec_of
    from langgraph_cancel.hooks import call_reconcile

    def boom(key: str, args: dict[str, Any]) -> Outcome:
        raise RuntimeError("provider down")

    def hang(key: str, args: dict[str, Any]) -> Outcome:
        time.sleep(2)
        return Outcome.committed()

    def garbage(key: str, args: dict[str, Any]) -> Any:
        return {"status": "committed"}

    import asyncio

    for hook, words in ((boom, "raised"), (hang, "timed out"), (garbage, "not an Outcome")):

        @effect(EffectKind.IRREVERSIBLE, reconcile=hook, hook_timeout=0.2)
        @tool
        def pay(order_id: str) -> str:
            """Pay."""
            return "paid"

        outcome = asyncio.run(call_reconcile(spec_of(pay), "k", {"order_id": "x"}))
        assert outcome.status == "unknown"
        assert words in (outcome.reason or "")


def test_starts_router_decides_from_the_read_made_with_the_run_start() -> None:
    # New input: the run's start reads the thread's unsettled effects in its round trip,
    # and START's router decides from that read, not from one more query. The read
    # serves that one decision: the reconcile subgraph reads afresh.
    saver = MemoryCancelSaver()
    graph = _graph(saver, {"o1": Outcome.committed("refund r-1")})
    reads: list[str] = []
    unsettled = saver.ledger.unsettled

    def counted(thread_id: str) -> Any:
        reads.append(thread_id)
        return unsettled(thread_id)

    saver.ledger.unsettled = counted  # type: ignore[method-assign]
    out = graph.invoke({"messages": [HumanMessage("hi")]}, {"configurable": {"thread_id": "p0"}})
    assert out["messages"][-1].content == "resumed" and reads == []

    effect_id = _left_in_flight(saver, "p1", "o1")
    graph.invoke({"messages": [HumanMessage("continue")]}, {"configurable": {"thread_id": "p1"}})
    assert saver.ledger.get_effect(effect_id).status.value == "committed"
    assert reads.count("p1") >= 1  # the subgraph's own read


def _approval_graph(saver: MemoryCancelSaver, builder: Any, **options: Any) -> Any:
    """``builder``'s agent with a refund that waits for approval, prepared (with
    ``options``) and compiled."""

    @effect(EffectKind.IRREVERSIBLE)
    @tool
    def refund(item: str) -> str:
        """Refund an order."""
        return f"refunded {item}"

    builder.add_node("tools", EffectToolNode([refund]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return cancellable(builder, saver, **options)


def test_new_input_over_a_pending_approval_answers_the_calls_before_it() -> None:
    """A Studio user types again instead of deciding: the calls asked about will never
    run, and their answers go right after them, ahead of the new message, where chat
    APIs require them (the strict scripted model refuses any other order)."""
    saver = MemoryCancelSaver()
    model = scripted(calls(("refund", "o1", "c-1"), ("refund", "o2", "c-2")), AIMessage("ok"))
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph = _approval_graph(saver, builder)
    config: Any = {"configurable": {"thread_id": "a1"}}
    first = graph.invoke({"messages": [HumanMessage("refund both")]}, config)
    assert first["__interrupt__"]

    out = graph.invoke({"messages": [HumanMessage("actually, where is my order?")]}, config)

    kinds = [type(m).__name__ for m in out["messages"]]
    assert kinds == [
        "HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "HumanMessage", "AIMessage"
    ], kinds  # fmt: skip
    assert [m.tool_call_id for m in out["messages"][2:4]] == ["c-1", "c-2"]
    assert all(m.content == NOT_RUN_CANCELLED for m in out["messages"][2:4])
    assert out["messages"][-1].content == "ok"
    assert [e.status.value for e in saver.ledger.effects("a1")] == ["dropped", "dropped"]


def test_answers_are_appended_where_the_messages_channel_only_appends() -> None:
    """A state whose messages merge with ``operator.add`` cannot have its history
    rewritten: the answers are appended, and no removal marker enters the list."""

    class AppendedState(TypedDict):
        messages: Annotated[list[AnyMessage], operator.add]

    saver = MemoryCancelSaver()
    model = scripted(calls(("refund", "o1", "c-1")), AIMessage("ok"), strict=False)
    builder = StateGraph(AppendedState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph = _approval_graph(saver, builder)
    config: Any = {"configurable": {"thread_id": "a2"}}
    assert graph.invoke({"messages": [HumanMessage("refund")]}, config)["__interrupt__"]

    out = graph.invoke({"messages": [HumanMessage("never mind")]}, config)

    kinds = [type(m).__name__ for m in out["messages"]]
    assert kinds == ["HumanMessage", "AIMessage", "HumanMessage", "ToolMessage", "AIMessage"]
    assert out["messages"][3].tool_call_id == "c-1"


def test_a_reconcile_pass_applies_no_reducer_twice() -> None:
    """New input passing through the reconcile subgraph (here to settle a call a dead
    worker left in flight) gives the graph only what the subgraph changed: keys whose
    reducers accumulate (a turn counter, messages merged with ``operator.add``) are not
    applied a second time."""

    class CountedState(TypedDict):
        messages: Annotated[list[AnyMessage], operator.add]
        turns: Annotated[int, operator.add]

    saver = MemoryCancelSaver()
    model = scripted(AIMessage("first"), AIMessage("second"), strict=False)
    builder = StateGraph(CountedState)
    builder.add_node(
        "agent", lambda state: {"messages": [model.invoke(state["messages"])], "turns": 1}
    )
    graph = _approval_graph(saver, builder, reconcile_interactive=False)
    config: Any = {"configurable": {"thread_id": "a3"}}
    graph.invoke({"messages": [HumanMessage("hi")]}, config)
    effect_id = _left_in_flight(saver, "a3", "o1")

    out = graph.invoke({"messages": [HumanMessage("and now?")]}, config)

    assert saver.ledger.get_effect(effect_id).status.value == "unknown"  # it went through
    assert [m.content for m in out["messages"]] == ["hi", "first", "and now?", "second"]
    assert out["turns"] == 2

"""Approval without an ApprovalGate: EffectToolNode asks about each call itself.

A call that needs approval interrupts in the tool node, in
HumanInTheLoopMiddleware's per-call shape, where it stands in plan order; each
decision, an invalid answer and an edit to another key are handled there too.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from approval_helpers import (
    BIG_REFUND,
    REFUND_PERMANENCE,
    SMALL_REFUND,
    World,
    assert_every_call_answered_once,
    build_graph,
    cfg,
    interrupt_value,
    open_saver,
    statuses,
    tool_messages,
)
from langgraph_cancel import (
    EffectKind,
    EffectStatus,
    EffectToolNode,
    RunStatus,
    add_cancellation,
    effect,
    get_report,
    idempotency_key,
    request_cancel,
)
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.testing import ScriptedChatModel, tool_call, tool_calls_turn


# ------------------------------------------------- the tool node's own refusal
def test_a_call_without_a_gate_is_asked_about_where_it_stands(db_url: str) -> None:
    # No ApprovalGate: the call that needs approval interrupts in the tool node, in
    # HumanInTheLoopMiddleware's per-call shape, where it stands in plan order (so the
    # small refund behind it waits too); nothing is dispatched before the answer.
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND, SMALL_REFUND), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver, with_gate=False)
        out = graph.invoke({"messages": [HumanMessage("go")]}, cfg("t-nogate"))
        value = interrupt_value(out)
        assert value["type"] == "tool_approval"
        assert value["tool_call_id"] == "c-refund" and value["name"] == "issue_refund"
        assert value["args"] == {"order_id": "o-1", "amount": 150.0}
        assert value["effect_kind"] == "irreversible"
        assert value["why_permanent"] == REFUND_PERMANENCE
        assert value["idempotency_key"] == "refund:o-1"
        assert world.executions == []
        assert statuses(saver.ledger, "t-nogate")["c-refund"] == "pending_approval"
        out = graph.invoke(Command(resume={"type": "approve"}), cfg("t-nogate"))
        assert world.executions == [
            ("issue_refund", {"order_id": "o-1", "amount": 150.0}, "refund:o-1"),
            ("issue_refund", {"order_id": "o-2", "amount": 20.0}, "refund:o-2"),
        ]
        assert statuses(saver.ledger, "t-nogate") == {
            "c-refund": "committed",
            "c-small": "committed",
        }
        assert_every_call_answered_once(out["messages"])
        assert out["messages"][-1].content == "done"


@pytest.mark.parametrize("decision", ["edit", "reject", "respond"])
def test_per_call_decisions(decision: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND), "done"])
    saver = MemoryCancelSaver()
    graph = build_graph(world, model, saver, with_gate=False)
    graph.invoke({"messages": [HumanMessage("go")]}, cfg("t-decide"))
    answers: dict[str, dict[str, Any]] = {
        "edit": {
            "type": "edit",
            "edited_action": {"name": "issue_refund", "args": {"order_id": "o-1", "amount": 120.0}},
        },
        "reject": {"type": "reject", "message": "too much"},
        "respond": {"type": "respond", "message": "The customer was refunded by phone."},
    }
    answer = answers[decision]
    out = graph.invoke(Command(resume={**answer, "reviewer": "dana"}), cfg("t-decide"))
    rec = saver.ledger.find_effect("t-decide", "c-refund")
    assert rec is not None and rec.approval is not None
    assert rec.approval["reviewer"] == "dana" and rec.approval["decision"] == decision
    answered = tool_messages(out["messages"])["c-refund"]
    if decision == "edit":
        assert world.executions == [
            ("issue_refund", {"order_id": "o-1", "amount": 120.0}, "refund:o-1")
        ]
        assert rec.status is EffectStatus.COMMITTED and rec.args["amount"] == 120.0
    else:
        assert world.executions == []
        assert rec.status is EffectStatus.REJECTED
        if decision == "reject":
            assert answered.status == "error" and "too much" in str(answered.content)
        else:
            assert answered.status == "success"
            assert answered.content == "The customer was refunded by phone."


def test_an_invalid_per_call_answer_is_asked_again_with_its_reason() -> None:
    # An invalid answer is not an error of the run: the same question comes back, saying
    # what was wrong, nothing is dispatched, and a valid answer goes through.
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND), "done"])
    saver = MemoryCancelSaver()
    graph = build_graph(world, model, saver, with_gate=False)
    graph.invoke({"messages": [HumanMessage("go")]}, cfg("t-invalid"))
    for bad, says in (
        ({"type": "maybe"}, "unknown decision type"),
        ({"type": "edit", "edited_action": {"name": "send_email", "args": {}}}, "cannot change"),
        (
            {"type": "edit", "edited_action": {"name": "issue_refund", "args": {"amount": "x"}}},
            "order_id",
        ),
        ({"type": "respond"}, "needs the message"),
        ("yes", "must be an object"),
    ):
        out = graph.invoke(Command(resume=bad), cfg("t-invalid"))
        (asked,) = out["__interrupt__"]
        assert says in asked.value["error"], (bad, asked.value)
        assert asked.value["tool_call_id"] == "c-refund"
        assert world.executions == []
        assert statuses(saver.ledger, "t-invalid") == {"c-refund": "pending_approval"}
    out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg("t-invalid"))
    assert world.count("issue_refund") == 1
    assert out["messages"][-1].content == "done"


def test_an_edit_that_changes_the_key_is_a_new_effect_under_the_new_key() -> None:
    # The natural edit (another order, so another key): the edited call runs as a new
    # effect; the original is recorded rejected, replaced by it; the report shows what ran.
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND), "done"])
    saver = MemoryCancelSaver()
    graph = build_graph(world, model, saver, with_gate=False)
    graph.invoke({"messages": [HumanMessage("go")]}, cfg("t-rekey"))
    edit = {
        "type": "edit",
        "edited_action": {"name": "issue_refund", "args": {"order_id": "o-7", "amount": 120.0}},
    }
    out = graph.invoke(Command(resume=edit), cfg("t-rekey"))
    assert world.executions == [
        ("issue_refund", {"order_id": "o-7", "amount": 120.0}, "refund:o-7")
    ]
    assert out["messages"][-1].content == "done"
    records = {e.tool_call_id: e for e in saver.ledger.effects("t-rekey")}
    original = records["c-refund"]
    (edited_id,) = [i for i in records if i != "c-refund"]
    new = records[edited_id]
    assert original.status is EffectStatus.REJECTED and original.idempotency_key == "refund:o-1"
    assert (original.approval or {})["replaced_by"] == new.effect_id
    assert new.status is EffectStatus.COMMITTED and new.idempotency_key == "refund:o-7"
    assert (new.approval or {})["original_args"] == {"order_id": "o-1", "amount": 150.0}
    report = get_report(saver, "t-rekey")
    assert [e.idempotency_key for e in report.permanent] == ["refund:o-7"]
    assert [e.idempotency_key for e in report.rejected] == ["refund:o-1"]
    # The call's answer is the new effect's, on a re-run too.
    assert tool_messages(out["messages"])["c-refund"].content == "refunded 120.00 on o-7"
    graph.invoke(None, cfg("t-rekey"))
    assert world.count("issue_refund") == 1


def test_a_rejected_call_carries_the_mark_langchain_sets() -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND), "done"])
    saver = MemoryCancelSaver()
    graph = build_graph(world, model, saver, with_gate=False)
    graph.invoke({"messages": [HumanMessage("go")]}, cfg("t-mark"))
    out = graph.invoke(Command(resume={"type": "reject", "message": "no"}), cfg("t-mark"))
    answer = tool_messages(out["messages"])["c-refund"]
    assert answer.additional_kwargs["lc_source"] == "hitl_interrupt_decision"
    assert answer.additional_kwargs["lc_data"] == {"decision": "reject"}


# ------------------------------------------------------- a stop before the question
def test_a_stopped_run_asks_nobody_and_drops_the_call(db_url: str) -> None:
    # The run is asked to stop while the batch's first call runs; the call behind it
    # needs approval. A stopped run asks no one: the call is dropped, as a queued one
    # is, and the run ends cancelled instead of waiting on a question.
    world = World()
    stops: list[RunStatus | None] = []

    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def notify(to: str) -> str:
        """Notify someone (and, here, press stop meanwhile)."""
        world.executions.append(("notify", {"to": to}, idempotency_key()))
        stops.append(
            request_cancel(
                ledger, "t-stop-review", reason="stop pressed", requested_by="user"
            ).status
        )
        return f"notified {to}"

    first = tool_call("notify", {"to": "ops"}, id="c-notify")
    model = ScriptedChatModel([tool_calls_turn(first, BIG_REFUND), "done"])
    with open_saver(db_url) as saver:
        ledger = saver.ledger
        builder = StateGraph(MessagesState)
        builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        builder.add_node("tools", EffectToolNode([*world.tools(), notify]))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
        builder.add_edge("tools", "agent")
        graph: Any = add_cancellation(builder).compile(checkpointer=saver)

        out = graph.invoke({"messages": [HumanMessage("go")]}, cfg("t-stop-review"))

        assert "__interrupt__" not in out
        assert stops == [RunStatus.CANCEL_REQUESTED]
        assert world.executions == [("notify", {"to": "ops"}, world.executions[0][2])]
        assert statuses(ledger, "t-stop-review") == {
            "c-notify": "committed",
            "c-refund": "dropped",
        }
        run = ledger.latest_run("t-stop-review")
        assert run is not None and run.status is RunStatus.CANCELLED
        assert_every_call_answered_once(out["messages"])
        report = get_report(saver, "t-stop-review")
        assert [entry.tool_call_id for entry in report.not_run] == ["c-refund"]
    assert report.dispatched_after_cancel == 0

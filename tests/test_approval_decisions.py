"""ApprovalGate: the interrupt it raises, the decisions it takes, and who took them.

One interrupt asks about every call of the batch that needs approval, in
HumanInTheLoopMiddleware's shape; approve, edit, reject and respond each end in the
ledger with the reviewer's name, and the model sees one answer per call.
"""

from __future__ import annotations

import asyncio

import pytest
from langchain.agents.middleware.human_in_the_loop import HITLRequest, HITLResponse
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.types import Command
from pydantic import TypeAdapter

from approval_helpers import (
    BIG_REFUND,
    EMAIL,
    LOOKUP,
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
from langgraph_cancel import ApprovalGate, EffectKind, EffectStatus, EffectToolNode, get_report
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.ledger import derive_idempotency_key
from langgraph_cancel.nodes.approval import ApprovalRequest, ApprovalResponse
from langgraph_cancel.testing import ScriptedChatModel, tool_call, tool_calls_turn
from langgraph_cancel.types import utcnow


# --------------------------------------------------------------------- shape
def test_interrupt_payload_is_a_hitl_request(db_url: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(LOOKUP, BIG_REFUND, EMAIL, SMALL_REFUND), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        out = graph.invoke({"messages": [HumanMessage("refund o-1")]}, cfg("t-shape"))
        value = interrupt_value(out)

        # LangChain's own TypedDicts accept it: HITL interfaces render it.
        TypeAdapter(HITLRequest).validate_python(value, strict=True)
        TypeAdapter(ApprovalRequest).validate_python(value, strict=True)
        actions, configs = value["action_requests"], value["review_configs"]
        # Only the calls that need approval, in the model's order.
        assert [a["tool_call_id"] for a in actions] == ["c-refund", "c-email"]
        assert [a["name"] for a in actions] == ["issue_refund", "send_email"]
        assert actions[0]["args"] == {"order_id": "o-1", "amount": 150.0}
        assert [c["action_name"] for c in configs] == ["issue_refund", "send_email"]
        for config in configs:
            assert config["allowed_decisions"] == ["approve", "edit", "reject", "respond"]
            assert set(config["args_schema"]["required"]) <= {"order_id", "amount", "to", "body"}
        refund, email = actions
        assert refund["effect_kind"] == email["effect_kind"] == "irreversible"
        assert refund["why_permanent"] == REFUND_PERMANENCE
        assert REFUND_PERMANENCE in refund["description"]
        assert refund["description"].startswith("Tool execution requires approval")
        assert "cannot undo" in email["why_permanent"]
        # The keys are exactly the ones the tool node dispatches with.
        assert refund["idempotency_key"] == "refund:o-1"
        assert email["idempotency_key"] == derive_idempotency_key("t-shape", "c-email")
        # The resume value is published as a schema, HITLResponse-compatible.
        schema = out["__interrupt__"][0].response_schema
        assert schema is not None and "decisions" in schema["properties"]

        # Recorded pending_approval with the same keys; nothing ran, not even the read.
        recs = {e.tool_call_id: e for e in saver.ledger.effects("t-shape")}
        assert {k: r.status for k, r in recs.items()} == {
            "c-refund": EffectStatus.PENDING_APPROVAL,
            "c-email": EffectStatus.PENDING_APPROVAL,
        }
        assert recs["c-refund"].idempotency_key == "refund:o-1"
        assert recs["c-email"].idempotency_key == email["idempotency_key"]
        assert recs["c-refund"].kind is EffectKind.IRREVERSIBLE
        assert world.executions == []

        # LangChain's HITLResponse is a valid answer.
        answer = TypeAdapter(HITLResponse).validate_python(
            {"decisions": [{"type": "approve"}, {"type": "reject", "message": "no"}]}
        )
        TypeAdapter(ApprovalResponse).validate_python(answer)
        out = graph.invoke(Command(resume=answer), cfg("t-shape"))
        assert "__interrupt__" not in out
        assert world.count("issue_refund") == 2 and world.count("send_email") == 0


# ------------------------------------------------------------------ decisions
def test_approve(db_url: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        out = graph.invoke({"messages": [HumanMessage("refund")]}, cfg("t-approve"))
        interrupt_value(out)
        assert world.executions == []
        before = utcnow()

        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg("t-approve"))

        assert world.executions == [
            ("issue_refund", {"order_id": "o-1", "amount": 150.0}, "refund:o-1")
        ]
        rec = saver.ledger.find_effect("t-approve", "c-refund")
        assert rec is not None and rec.status is EffectStatus.COMMITTED
        assert rec.approval is not None
        assert rec.approval["decision"] == "approve"
        assert rec.approval["reviewer"] == "human"
        assert rec.approval["at"] >= before.isoformat()
        trail = [t.to_status for t in saver.ledger.history(rec.effect_id)]
        assert trail == [
            EffectStatus.PENDING_APPROVAL,
            EffectStatus.APPROVED,
            EffectStatus.DISPATCHED,
            EffectStatus.COMMITTED,
        ]
        approved = saver.ledger.history(rec.effect_id)[1]
        assert approved.actor == "human" and approved.detail["decision"] == "approve"
        assert out["messages"][-1].content == "done"
        assert tool_messages(out["messages"])["c-refund"].content == "refunded 150.00 on o-1"
        assert saver.ledger.latest_run("t-approve").status.value == "completed"


def test_edit(db_url: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND, content="refunding"), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        out = graph.invoke({"messages": [HumanMessage("refund")]}, cfg("t-edit"))
        interrupt_value(out)
        ai_before = next(m for m in out["messages"] if isinstance(m, AIMessage))

        edit = {
            "type": "edit",
            "edited_action": {"name": "issue_refund", "args": {"order_id": "o-1", "amount": 120.0}},
        }
        out = graph.invoke(
            Command(resume={"decisions": [edit], "reviewer": "alice"}), cfg("t-edit")
        )

        assert world.executions == [
            ("issue_refund", {"order_id": "o-1", "amount": 120.0}, "refund:o-1")
        ]
        rec = saver.ledger.find_effect("t-edit", "c-refund")
        assert rec is not None and rec.status is EffectStatus.COMMITTED
        assert rec.args == {"order_id": "o-1", "amount": 120.0}
        assert rec.approval is not None
        assert rec.approval["decision"] == "edit" and rec.approval["reviewer"] == "alice"
        assert rec.approval["original_args"] == {"order_id": "o-1", "amount": 150.0}
        # The AIMessage was replaced in place (same id): the model's history shows what ran.
        ais = [m for m in out["messages"] if isinstance(m, AIMessage)]
        assert len(ais) == 2
        assert ais[0].id == ai_before.id and ais[0].content == "refunding"
        assert ais[0].tool_calls[0]["args"] == {"order_id": "o-1", "amount": 120.0}
        assert ais[0].tool_calls[0]["id"] == "c-refund"
        assert_every_call_answered_once(out["messages"])
        assert tool_messages(out["messages"])["c-refund"].content == "refunded 120.00 on o-1"


def test_the_gates_edit_to_another_key_is_a_new_effect(db_url: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        graph.invoke({"messages": [HumanMessage("refund")]}, cfg("t-gate-rekey"))
        moved = {
            "type": "edit",
            "edited_action": {"name": "issue_refund", "args": {"order_id": "o-5", "amount": 109.0}},
        }
        out = graph.invoke(Command(resume={"decisions": [moved]}), cfg("t-gate-rekey"))
        assert "__interrupt__" not in out
        assert world.executions == [
            ("issue_refund", {"order_id": "o-5", "amount": 109.0}, "refund:o-5")
        ]
        report = get_report(saver, "t-gate-rekey")
        assert [e.idempotency_key for e in report.permanent] == ["refund:o-5"]
        assert [e.idempotency_key for e in report.rejected] == ["refund:o-1"]
        assert_every_call_answered_once(out["messages"])
        graph.invoke(None, cfg("t-gate-rekey"))
        assert world.count("issue_refund") == 1


def test_the_gate_takes_respond(db_url: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND, EMAIL), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        graph.invoke({"messages": [HumanMessage("refund")]}, cfg("t-respond"))
        answer = {
            "decisions": [
                {"type": "respond", "message": "Refunded by phone already."},
                {"type": "approve"},
            ]
        }
        out = graph.invoke(Command(resume=answer), cfg("t-respond"))
        assert world.count("issue_refund") == 0 and world.count("send_email") == 1
        refund = tool_messages(out["messages"])["c-refund"]
        assert refund.status == "success" and refund.content == "Refunded by phone already."
        assert refund.additional_kwargs["lc_data"] == {"decision": "respond"}
        assert statuses(saver.ledger, "t-respond")["c-refund"] == "rejected"


def test_reject(db_url: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND), "understood"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        graph.invoke({"messages": [HumanMessage("refund")]}, cfg("t-reject"))

        answer = {
            "decisions": [{"type": "reject", "message": "over the limit for this customer"}],
            "reviewer": "bob@shop",
        }
        out = graph.invoke(Command(resume=answer), cfg("t-reject"))

        assert world.executions == []
        rec = saver.ledger.find_effect("t-reject", "c-refund")
        assert rec is not None and rec.status is EffectStatus.REJECTED
        assert rec.approval is not None
        assert rec.approval["decision"] == "reject"
        assert rec.approval["reviewer"] == "bob@shop"
        assert rec.approval["message"] == "over the limit for this customer"
        assert rec.approval["at"]
        assert saver.ledger.history(rec.effect_id)[-1].actor == "bob@shop"
        # Exactly one answer for the call, and the model saw it.
        assert_every_call_answered_once(out["messages"])
        answer_msg = tool_messages(out["messages"])["c-refund"]
        assert answer_msg.status == "error"
        assert answer_msg.content == "Rejected by reviewer: over the limit for this customer"
        seen = model.inputs[-1]
        assert any(isinstance(m, ToolMessage) and m.content == answer_msg.content for m in seen)
        assert out["messages"][-1].content == "understood"
        report = get_report(saver, "t-reject")
        assert [e.tool_call_id for e in report.rejected] == ["c-refund"]
        assert report.permanent == []


def test_mixed_decisions_in_one_batch(db_url: str) -> None:
    world = World()
    third = tool_call("send_email", {"to": "finance@example.com", "body": "fyi"}, id="c-email-2")
    model = ScriptedChatModel(
        [tool_calls_turn(LOOKUP, BIG_REFUND, SMALL_REFUND, EMAIL, third), "done"]
    )
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        out = graph.invoke({"messages": [HumanMessage("go")]}, cfg("t-mixed"))
        value = interrupt_value(out)
        assert [a["tool_call_id"] for a in value["action_requests"]] == [
            "c-refund",
            "c-email",
            "c-email-2",
        ]
        assert world.executions == []

        decisions = [
            {"type": "approve"},
            {
                "type": "edit",
                "edited_action": {
                    "name": "send_email",
                    "args": {"to": "dana@example.com", "body": "refunded 150 USD"},
                },
            },
            {"type": "reject", "message": "finance already knows"},
        ]
        out = graph.invoke(Command(resume=decisions), cfg("t-mixed"))  # a bare list works too

        assert sorted(world.executions, key=lambda e: e[0]) == sorted(
            [
                ("lookup_order", {"order_id": "o-1"}, "-"),
                ("issue_refund", {"order_id": "o-1", "amount": 150.0}, "refund:o-1"),
                ("issue_refund", {"order_id": "o-2", "amount": 20.0}, "refund:o-2"),
                (
                    "send_email",
                    {"to": "dana@example.com", "body": "refunded 150 USD"},
                    derive_idempotency_key("t-mixed", "c-email"),
                ),
            ],
            key=lambda e: e[0],
        )
        recs = {e.tool_call_id: e for e in saver.ledger.effects("t-mixed")}
        assert {k: r.status.value for k, r in recs.items()} == {
            "c-lookup": "committed",
            "c-refund": "committed",
            "c-small": "committed",
            "c-email": "committed",
            "c-email-2": "rejected",
        }
        assert recs["c-refund"].approval is not None
        assert recs["c-refund"].approval["decision"] == "approve"
        assert recs["c-email"].approval is not None
        assert recs["c-email"].approval["decision"] == "edit"
        assert recs["c-email-2"].approval is not None
        assert recs["c-email-2"].approval["message"] == "finance already knows"
        # Calls that needed no approval passed through untouched: no approval recorded.
        assert recs["c-small"].approval is None and recs["c-lookup"].approval is None
        ai = next(m for m in out["messages"] if isinstance(m, AIMessage))
        assert [c["args"] for c in ai.tool_calls] == [
            {"order_id": "o-1"},
            {"order_id": "o-1", "amount": 150.0},
            {"order_id": "o-2", "amount": 20.0},
            {"to": "dana@example.com", "body": "refunded 150 USD"},
            {"to": "finance@example.com", "body": "fyi"},
        ]
        assert_every_call_answered_once(out["messages"])
        answers = tool_messages(out["messages"])
        assert answers["c-email-2"].content == "Rejected by reviewer: finance already knows"


async def test_mixed_decisions_async(db_url: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND, EMAIL), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        out = await graph.ainvoke({"messages": [HumanMessage("go")]}, cfg("t-async"))
        assert len(interrupt_value(out)["action_requests"]) == 2
        bad = {"type": "edit", "edited_action": {"name": "send_email", "args": {"to": 3}}}
        out = await graph.ainvoke(
            Command(resume={"decisions": [{"type": "approve"}, bad]}), cfg("t-async")
        )
        assert "to" in interrupt_value(out)["action_requests"][1]["error"]
        out = await graph.ainvoke(Command(resume={"decisions": [{"type": "ok"}]}), cfg("t-async"))
        assert "decision" in interrupt_value(out)["error"]  # asked again, with the reason
        out = await graph.ainvoke(
            Command(
                resume={"decisions": [{"type": "approve"}, {"type": "reject"}], "reviewer": "eve"}
            ),
            cfg("t-async"),
        )
        assert world.count("issue_refund") == 1 and world.count("send_email") == 0
        recs = {e.tool_call_id: e for e in await saver.ledger.aeffects("t-async")}
        assert recs["c-refund"].status is EffectStatus.COMMITTED
        assert recs["c-email"].status is EffectStatus.REJECTED
        assert recs["c-email"].approval is not None
        assert recs["c-email"].approval["reviewer"] == "eve"
        assert tool_messages(out["messages"])["c-email"].content == "Rejected by reviewer."
        assert_every_call_answered_once(out["messages"])


def test_a_call_whose_key_a_rejected_call_held_is_asked_about_on_its_own(db_url: str) -> None:
    # The model asks twice for the same refund: one key for both. The gate asks about
    # the first only (the second can never run while the first holds the key); the
    # reviewer rejects it, which frees the key, so the tool node asks about the
    # second in LangChain's per-call shape before anything is sent.
    world = World()
    again = tool_call("issue_refund", {"order_id": "o-1", "amount": 150.0}, id="c-refund-again")
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND, again), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        out = graph.invoke({"messages": [HumanMessage("refund o-1")]}, cfg("t-twice"))
        first = interrupt_value(out)
        assert [a["tool_call_id"] for a in first["action_requests"]] == ["c-refund"]

        out = graph.invoke(
            Command(resume={"decisions": [{"type": "reject", "message": "not yet"}]}),
            cfg("t-twice"),
        )

        second = interrupt_value(out)
        assert second["type"] == "tool_approval"
        assert second["tool_call_id"] == "c-refund-again"
        assert second["idempotency_key"] == "refund:o-1"
        assert world.executions == []
        assert statuses(saver.ledger, "t-twice")["c-refund"] == "rejected"

        out = graph.invoke(Command(resume={"type": "approve", "reviewer": "dana"}), cfg("t-twice"))

        assert "__interrupt__" not in out
        assert world.executions == [
            ("issue_refund", {"order_id": "o-1", "amount": 150.0}, "refund:o-1")
        ]
        recs = {e.tool_call_id: e for e in saver.ledger.effects("t-twice")}
        assert {k: r.status.value for k, r in recs.items()} == {
            "c-refund": "rejected",
            "c-refund-again": "committed",
        }
        assert recs["c-refund-again"].idempotency_key == "refund:o-1"
        assert recs["c-refund-again"].approval is not None
        assert recs["c-refund-again"].approval["reviewer"] == "dana"
        assert_every_call_answered_once(out["messages"])
        assert tool_messages(out["messages"])["c-refund"].content == "Rejected by reviewer: not yet"


# -------------------------------------------------------------------- reviewer
def test_reviewer_from_the_server_identity() -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND), "done"])
    saver = MemoryCancelSaver()
    graph = build_graph(world, model, saver)
    config = cfg("t-who", langgraph_auth_user_id="user-42")
    graph.invoke({"messages": [HumanMessage("go")]}, config)
    graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    rec = saver.ledger.find_effect("t-who", "c-refund")
    assert rec is not None and rec.approval is not None
    assert rec.approval["reviewer"] == "user-42"

    # A reviewer named in the answer wins over the server's user.
    model2 = ScriptedChatModel([tool_calls_turn(BIG_REFUND), "done"])
    saver2 = MemoryCancelSaver()
    graph2 = build_graph(World(), model2, saver2)
    config2 = cfg("t-who-2", langgraph_auth_user_id="user-42")
    graph2.invoke({"messages": [HumanMessage("go")]}, config2)
    graph2.invoke(
        Command(resume={"decisions": [{"type": "approve"}], "reviewer": "ops-lead"}), config2
    )
    rec2 = saver2.ledger.find_effect("t-who-2", "c-refund")
    assert rec2 is not None and rec2.approval is not None
    assert rec2.approval["reviewer"] == "ops-lead"


# ------------------------------------------------------------------ its tools
def test_gate_accepts_the_tool_node_and_callables() -> None:
    tools = World().tools()

    def plain(value: int) -> int:
        """A plain function."""
        return value

    gate = ApprovalGate(EffectToolNode(tools))
    assert set(gate.tools_by_name) == {"issue_refund", "send_email", "lookup_order", "read_card"}
    with pytest.warns(UserWarning, match="no effect"):
        gate2 = ApprovalGate([plain], name="review")
    assert gate2.name == "review"
    assert gate2.specs["plain"].kind is EffectKind.IRREVERSIBLE
    assert asyncio.iscoroutinefunction(gate2.afunc)

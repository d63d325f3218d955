"""ApprovalGate: a human decides before any call that needs approval, on every backend.

Every test builds a real compiled graph, as a user would:

    START -> reconcile -> agent (ScriptedChatModel) -> tools_condition -> approval
          -> tools (EffectToolNode) -> agent ...

wrapped by ``add_cancellation`` and compiled with the cancel-aware saver of the
backend under test (``db_url``: memory, SQLite, PostgreSQL). The tools append
every execution to a list, so the tests can prove that nothing is dispatched
before a decision, and nothing twice across interrupts and resumes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from langchain.agents.middleware.human_in_the_loop import HITLRequest, HITLResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command
from pydantic import TypeAdapter

from langgraph_cancel import (
    ApprovalGate,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    add_cancellation,
    effect,
    get_report,
    idempotency_key,
    request_cancel,
)
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.ledger import Ledger, derive_idempotency_key
from langgraph_cancel.nodes.approval import ApprovalRequest, ApprovalResponse
from langgraph_cancel.testing import ScriptedChatModel, tool_call, tool_calls_turn
from langgraph_cancel.types import utcnow

REFUND_PERMANENCE = "Money leaves the shop's account; a refund cannot be recalled."


# ------------------------------------------------------------------ fixtures
@contextmanager
def open_saver(db_url: str) -> Iterator[Any]:
    """The cancel-aware saver for a backend URL, set up."""
    if db_url == "memory://":
        saver = MemoryCancelSaver()
        saver.setup()
        yield saver
    elif db_url.startswith("sqlite:///"):
        with SqliteCancelSaver.from_conn_string(db_url[len("sqlite:///") :]) as sqlite_saver:
            sqlite_saver.setup()
            yield sqlite_saver
    else:
        with PostgresCancelSaver.from_conn_string(db_url) as pg_saver:
            pg_saver.setup()
            yield pg_saver


@dataclass
class World:
    """The external systems: every tool execution lands here."""

    executions: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    gate_passes: int = 0

    def count(self, tool_name: str | None = None) -> int:
        return sum(1 for name, _, _ in self.executions if tool_name in (None, name))

    def tools(self) -> list[BaseTool]:
        world = self

        @effect(
            EffectKind.IRREVERSIBLE,
            idempotency_key=lambda a: f"refund:{a['order_id']}",
            requires_approval=lambda a: float(a["amount"]) > 100,
            permanence=REFUND_PERMANENCE,
        )
        @tool
        def issue_refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            world.executions.append(
                ("issue_refund", {"order_id": order_id, "amount": amount}, idempotency_key())
            )
            return f"refunded {amount:.2f} on {order_id}"

        @effect(EffectKind.IRREVERSIBLE)
        @tool
        def send_email(to: str, body: str) -> str:
            """Send an email."""
            world.executions.append(("send_email", {"to": to, "body": body}, idempotency_key()))
            return f"sent to {to}"

        @effect(EffectKind.READ_ONLY)
        @tool
        def lookup_order(order_id: str) -> str:
            """Look an order up."""
            world.executions.append(("lookup_order", {"order_id": order_id}, "-"))
            return f"order {order_id}: 2 items"

        return [issue_refund, send_email, lookup_order]


def build_graph(
    world: World, model: ScriptedChatModel, saver: Any, *, with_gate: bool = True
) -> Any:
    """agent -> tools_condition -> approval -> tools -> agent, with add_cancellation."""
    tools = world.tools()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectToolNode(tools))
    builder.add_edge(START, "agent")
    if with_gate:
        gate = ApprovalGate(tools)
        prepare = gate._prepare

        def counting_prepare(*args: Any) -> Any:
            world.gate_passes += 1
            return prepare(*args)

        setattr(gate, "_prepare", counting_prepare)  # noqa: B010 - count the passes
        builder.add_node("approval", gate)
        builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
        builder.add_edge("approval", "tools")
    else:
        builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return add_cancellation(builder).compile(checkpointer=saver)


def cfg(thread_id: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, **extra}}


def interrupt_value(out: dict[str, Any]) -> dict[str, Any]:
    interrupts: tuple[Any, ...] | list[Any] = out.get("__interrupt__") or ()
    assert len(interrupts) == 1, f"expected one interrupt, got {interrupts!r}"
    value: dict[str, Any] = interrupts[0].value
    return value


def statuses(ledger: Ledger, thread_id: str) -> dict[str, str]:
    return {e.tool_call_id: e.status.value for e in ledger.effects(thread_id)}


def tool_messages(messages: list[BaseMessage]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


def assert_every_call_answered_once(messages: list[BaseMessage]) -> None:
    calls = [str(c["id"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    answers = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    assert sorted(calls) == sorted(answers), (calls, answers)


BIG_REFUND = tool_call("issue_refund", {"order_id": "o-1", "amount": 150.0}, id="c-refund")
EMAIL = tool_call("send_email", {"to": "dana@example.com", "body": "refunded"}, id="c-email")
SMALL_REFUND = tool_call("issue_refund", {"order_id": "o-2", "amount": 20.0}, id="c-small")
LOOKUP = tool_call("lookup_order", {"order_id": "o-1"}, id="c-lookup")


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


def test_invalid_edit_is_asked_again(db_url: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND, EMAIL), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        out = graph.invoke({"messages": [HumanMessage("refund")]}, cfg("t-invalid"))
        first = interrupt_value(out)
        assert "errors" not in first

        bad = {
            "type": "edit",
            "edited_action": {
                "name": "issue_refund",
                "args": {"order_id": "o-1", "amount": "lots"},
            },
        }
        out = graph.invoke(
            Command(resume={"decisions": [bad, {"type": "approve"}]}), cfg("t-invalid")
        )

        again = interrupt_value(out)
        assert [a["tool_call_id"] for a in again["action_requests"]] == ["c-refund", "c-email"]
        assert "amount" in again["action_requests"][0]["error"]
        assert "error" not in again["action_requests"][1]
        assert again["action_requests"][0]["description"].startswith("The edit was invalid")
        assert again["errors"][0]["index"] == 0 and again["errors"][0]["tool_call_id"] == "c-refund"
        # Nothing approved (not even the valid decision of the batch), nothing dispatched.
        assert world.executions == []
        assert statuses(saver.ledger, "t-invalid") == {
            "c-refund": "pending_approval",
            "c-email": "pending_approval",
        }

        # A missing required argument is a schema error too.
        missing = {"type": "edit", "edited_action": {"name": "issue_refund", "args": {}}}
        out = graph.invoke(
            Command(resume={"decisions": [missing, {"type": "approve"}]}), cfg("t-invalid")
        )
        assert "order_id" in interrupt_value(out)["action_requests"][0]["error"]
        assert world.executions == []

        good = {
            "type": "edit",
            "edited_action": {"name": "issue_refund", "args": {"order_id": "o-1", "amount": 99.5}},
        }
        out = graph.invoke(
            Command(resume={"decisions": [good, {"type": "approve"}]}), cfg("t-invalid")
        )
        assert "__interrupt__" not in out
        assert world.executions == [
            ("issue_refund", {"order_id": "o-1", "amount": 99.5}, "refund:o-1"),
            (
                "send_email",
                {"to": "dana@example.com", "body": "refunded"},
                derive_idempotency_key("t-invalid", "c-email"),
            ),
        ]
        assert statuses(saver.ledger, "t-invalid") == {
            "c-refund": "committed",
            "c-email": "committed",
        }
        assert_every_call_answered_once(out["messages"])


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


# ------------------------------------------------------------------ predicates
def test_predicate_based_approval(db_url: str) -> None:
    world = World()
    model = ScriptedChatModel(
        [
            tool_calls_turn(SMALL_REFUND),  # 20 <= 100: no approval, no interrupt
            tool_calls_turn(
                tool_call("issue_refund", {"order_id": "o-3", "amount": 100.0}, id="c-100"),
                tool_call("issue_refund", {"order_id": "o-4", "amount": 100.01}, id="c-big"),
            ),
            "done",
        ]
    )
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        out = graph.invoke({"messages": [HumanMessage("refunds")]}, cfg("t-pred"))
        # The first turn ran without asking; the second stops at the gate, asking only
        # about the refund over 100, and holds its sibling too (the tools run after).
        value = interrupt_value(out)
        assert [a["tool_call_id"] for a in value["action_requests"]] == ["c-big"]
        assert world.executions == [
            ("issue_refund", {"order_id": "o-2", "amount": 20.0}, "refund:o-2")
        ]
        assert statuses(saver.ledger, "t-pred") == {
            "c-small": "committed",
            "c-big": "pending_approval",
        }

        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg("t-pred"))
        assert [e[1]["order_id"] for e in world.executions] == ["o-2", "o-3", "o-4"]
        assert statuses(saver.ledger, "t-pred") == {
            "c-small": "committed",
            "c-100": "committed",
            "c-big": "committed",
        }
        assert out["messages"][-1].content == "done"


def test_calls_not_needing_approval_pass_through(db_url: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(LOOKUP, SMALL_REFUND), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        out = graph.invoke({"messages": [HumanMessage("go")]}, cfg("t-pass"))
        assert "__interrupt__" not in out
        assert world.count() == 2 and world.gate_passes == 1
        for rec in saver.ledger.effects("t-pass"):
            assert rec.status is EffectStatus.COMMITTED and rec.approval is None
            assert EffectStatus.PENDING_APPROVAL not in {
                t.to_status for t in saver.ledger.history(rec.effect_id)
            }


# ---------------------------------------------------------------------- cancel
@pytest.mark.parametrize("resume_with", ["decisions", "none"])
def test_cancel_while_approval_pending(db_url: str, resume_with: str) -> None:
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND, EMAIL, SMALL_REFUND), "done"])
    thread = f"t-cancel-{resume_with}"
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        out = graph.invoke({"messages": [HumanMessage("go")]}, cfg(thread))
        interrupt_value(out)

        result = request_cancel(saver, thread, reason="customer withdrew", requested_by="ops")
        assert result.accepted

        resume: Any = (
            Command(resume={"decisions": [{"type": "approve"}, {"type": "approve"}]})
            if resume_with == "decisions"
            else None
        )
        out = graph.invoke(resume, cfg(thread))

        # Nothing irreversible happened: the approvals arriving after the stop count for nothing.
        assert world.executions == []
        assert statuses(saver.ledger, thread) == {
            "c-refund": "dropped",
            "c-email": "dropped",
            "c-small": "dropped",
        }
        report = get_report(saver, thread)
        assert report.status == "cancelled"
        assert report.reason == "customer withdrew"
        assert sorted(e.tool_call_id for e in report.not_run) == ["c-email", "c-refund", "c-small"]
        assert report.permanent == []
        assert report.dispatched_after_cancel == 0
        assert report.unknown == []
        messages = graph.get_state(cfg(thread)).values["messages"]
        assert_every_call_answered_once(messages)
        assert all(m.status == "error" for m in tool_messages(messages).values())
        assert saver.ledger.latest_run(thread).status.value == "cancelled"
        assert not graph.get_state(cfg(thread)).next


# ------------------------------------------------------------------ malformed
MALFORMED: list[tuple[str, Any]] = [
    ("wrong count", {"decisions": [{"type": "approve"}]}),
    ("too many", {"decisions": [{"type": "approve"}] * 3}),
    ("unknown type", {"decisions": [{"type": "approve"}, {"type": "maybe"}]}),
    ("respond without its text", {"decisions": [{"type": "approve"}, {"type": "respond"}]}),
    (
        "edit of another tool",
        {
            "decisions": [
                {"type": "edit", "edited_action": {"name": "send_email", "args": {}}},
                {"type": "approve"},
            ]
        },
    ),
    (
        "non-dict args",
        {
            "decisions": [
                {"type": "edit", "edited_action": {"name": "issue_refund", "args": "o-1"}},
                {"type": "approve"},
            ]
        },
    ),
    ("edit without action", {"decisions": [{"type": "edit"}, {"type": "approve"}]}),
    ("decision not an object", {"decisions": ["approve", "approve"]}),
    ("no decisions key", {"approve": True}),
    ("a string", "yes"),
    ("bad reviewer", {"decisions": [{"type": "approve"}] * 2, "reviewer": 7}),
    ("bad reject message", {"decisions": [{"type": "approve"}, {"type": "reject", "message": 1}]}),
]


def test_malformed_resume_values_are_asked_again_and_dispatch_nothing(db_url: str) -> None:
    # A malformed answer is not an error of the run: the same question comes back, its
    # payload saying what was wrong, and nothing is decided or dispatched meanwhile.
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND, EMAIL), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        graph.invoke({"messages": [HumanMessage("go")]}, cfg("t-bad"))
        for label, value in MALFORMED:
            again = interrupt_value(graph.invoke(Command(resume=value), cfg("t-bad")))
            assert again["error"], label
            assert [a["tool_call_id"] for a in again["action_requests"]] == ["c-refund", "c-email"]
            assert world.executions == [], label
            assert statuses(saver.ledger, "t-bad") == {
                "c-refund": "pending_approval",
                "c-email": "pending_approval",
            }, label
            for rec in saver.ledger.effects("t-bad"):
                assert rec.approval is None, label

        # The question is still open ...
        snapshot = graph.get_state(cfg("t-bad"))
        assert snapshot.next == ("approval",)
        assert len(snapshot.interrupts) == 1
        # ... and a well-formed answer goes through.
        out = graph.invoke(
            Command(resume={"decisions": [{"type": "approve"}, {"type": "reject"}]}),
            cfg("t-bad"),
        )
        assert world.count("issue_refund") == 1 and world.count("send_email") == 0
        assert_every_call_answered_once(out["messages"])


# -------------------------------------------------------- no double execution
def test_no_double_execution_across_interrupts_and_resumes(db_url: str) -> None:
    """LangGraph re-runs the whole gate on every resume; the tools still run once each."""
    world = World()
    model = ScriptedChatModel([tool_calls_turn(LOOKUP, BIG_REFUND, EMAIL), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        config = cfg("t-once")
        graph.invoke({"messages": [HumanMessage("go")]}, config)
        bad = {
            "type": "edit",
            "edited_action": {"name": "issue_refund", "args": {"order_id": 5, "amount": "x"}},
        }
        for _ in range(2):  # two invalid edits: asked again twice
            interrupt_value(
                graph.invoke(Command(resume={"decisions": [bad, {"type": "approve"}]}), config)
            )
        interrupt_value(graph.invoke(Command(resume=[{"type": "approve"}]), config))  # malformed
        assert world.executions == []
        out = graph.invoke(
            Command(resume={"decisions": [{"type": "approve"}, {"type": "approve"}]}), config
        )
        assert "__interrupt__" not in out

        assert world.gate_passes >= 5  # first pass, 2 re-asks, the malformed one, the last
        assert world.count("lookup_order") == 1
        assert world.count("issue_refund") == 1
        assert world.count("send_email") == 1
        keys = [k for _, _, k in world.executions if k != "-"]
        assert len(keys) == len(set(keys))
        for rec in saver.ledger.effects("t-once"):
            trail = [t.to_status for t in saver.ledger.history(rec.effect_id)]
            assert trail.count(EffectStatus.DISPATCHED) <= 1
            assert trail.count(EffectStatus.PENDING_APPROVAL) <= 1
            assert trail.count(EffectStatus.APPROVED) <= 1
        # Resuming the finished thread once more runs nothing again.
        graph.invoke(None, config)
        assert world.count() == 3


def test_decided_calls_are_not_asked_again(db_url: str) -> None:
    """A pass that finds its calls already decided (e.g. after a crash) does not ask again."""
    world = World()
    model = ScriptedChatModel([tool_calls_turn(BIG_REFUND, EMAIL), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world, model, saver)
        config = cfg("t-decided")
        graph.invoke({"messages": [HumanMessage("go")]}, config)
        # The refund's decision reached the ledger, the email's did not (crash in between).
        refund = saver.ledger.find_effect("t-decided", "c-refund")
        assert refund is not None
        saver.ledger.transition(
            refund.effect_id,
            EffectStatus.APPROVED,
            actor="carol",
            approval={
                "decision": "edit",
                "reviewer": "carol",
                "at": utcnow().isoformat(),
                "source": "approval_gate",
                "original_args": refund.args,
            },
            args={"order_id": "o-1", "amount": 110.0},
        )
        # The stored answer (same batch, same order) is replayed: the refund keeps
        # carol's earlier decision, the email gets this one.
        out = graph.invoke(
            Command(resume={"decisions": [{"type": "reject"}, {"type": "approve"}]}), config
        )
        assert "__interrupt__" not in out
        assert world.count("issue_refund") == 1 and world.count("send_email") == 1
        assert world.executions[0][1] == {"order_id": "o-1", "amount": 110.0}
        recs = {e.tool_call_id: e for e in saver.ledger.effects("t-decided")}
        assert recs["c-refund"].approval is not None
        assert recs["c-refund"].approval["reviewer"] == "carol"
        assert recs["c-email"].approval is not None
        assert recs["c-email"].approval["decision"] == "approve"
        # The message shows the edited args even though the edit was not this pass's.
        ai = next(m for m in out["messages"] if isinstance(m, AIMessage))
        assert ai.tool_calls[0]["args"] == {"order_id": "o-1", "amount": 110.0}

    world2 = World()
    other = tool_call("issue_refund", {"order_id": "o-9", "amount": 500.0}, id="c-refund")
    model2 = ScriptedChatModel([tool_calls_turn(other), "done"])
    with open_saver(db_url) as saver:
        graph = build_graph(world2, model2, saver)
        config = cfg("t-decided-all")
        graph.invoke({"messages": [HumanMessage("go")]}, config)
        rec = saver.ledger.find_effect("t-decided-all", "c-refund")
        assert rec is not None
        saver.ledger.transition(
            rec.effect_id,
            EffectStatus.REJECTED,
            actor="dave",
            approval={
                "decision": "reject",
                "reviewer": "dave",
                "message": "no",
                "at": utcnow().isoformat(),
            },
        )
        # Every call is decided: resuming without an answer does not interrupt again.
        out = graph.invoke(None, config)
        assert "__interrupt__" not in out
        assert world2.executions == []
        assert tool_messages(out["messages"])["c-refund"].content == "Rejected by reviewer: no"


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


def test_gate_accepts_the_tool_node_and_callables() -> None:
    tools = World().tools()

    def plain(value: int) -> int:
        """A plain function."""
        return value

    gate = ApprovalGate(EffectToolNode(tools))
    assert set(gate.tools_by_name) == {"issue_refund", "send_email", "lookup_order"}
    with pytest.warns(UserWarning, match="no effect"):
        gate2 = ApprovalGate([plain], name="review")
    assert gate2.name == "review"
    assert gate2.specs["plain"].kind is EffectKind.IRREVERSIBLE
    assert asyncio.iscoroutinefunction(gate2.afunc)

"""ApprovalGate: an invalid or malformed answer is asked again, and dispatches nothing.

The same question comes back, its payload saying what was wrong; nothing is decided
or dispatched meanwhile, and a well-formed answer then goes through.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.types import Command

from approval_helpers import (
    BIG_REFUND,
    EMAIL,
    World,
    assert_every_call_answered_once,
    build_graph,
    cfg,
    interrupt_value,
    open_saver,
    statuses,
)
from langgraph_cancel.ledger import derive_idempotency_key
from langgraph_cancel.testing import ScriptedChatModel, tool_calls_turn


# ---------------------------------------------------------------- invalid edit
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

"""ApprovalGate and dispatch: only the calls that need approval wait, none runs twice.

The ``requires_approval`` predicate decides which calls the gate holds; the others
pass through. LangGraph re-runs the gate on every resume, and a decided call is
neither asked about again nor dispatched a second time.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableLambda
from langgraph.types import Command

from approval_helpers import (
    BIG_REFUND,
    CARD,
    EMAIL,
    LOOKUP,
    SMALL_REFUND,
    World,
    build_graph,
    cfg,
    interrupt_value,
    open_saver,
    statuses,
    tool_messages,
)
from langgraph_cancel import EffectStatus
from langgraph_cancel.testing import ScriptedChatModel, tool_call, tool_calls_turn
from langgraph_cancel.types import utcnow


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


@pytest.mark.parametrize("with_gate", [True, False], ids=["gate", "tool_node_asks"])
@pytest.mark.parametrize(
    ("call", "answer"),
    [(BIG_REFUND, "refunded 150.00 on o-1"), (CARD, "order o-1: card ending 4242")],
    ids=["refund", "read"],
)
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_the_same_call_twice_approved_runs_once(
    db_url: str, with_gate: bool, call: ToolCall, answer: str, use_async: bool
) -> None:
    """A model that repeats a call (same id, same arguments) in one turn: approved, the
    call runs once and both copies get its answer. A read a reviewer must allow is
    dispatched like a side effect, and its copy once found it in flight as the batch
    had read it, after its twin had committed it."""
    world = World()

    def model(messages: list[BaseMessage]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            return AIMessage("done")
        return AIMessage("", tool_calls=[call, call])

    with open_saver(db_url) as saver:
        graph = build_graph(world, RunnableLambda(model), saver, with_gate=with_gate)
        config = cfg("t-twice")

        def run(given: Any) -> dict[str, Any]:
            if use_async:
                result: dict[str, Any] = asyncio.run(graph.ainvoke(given, config))
                return result
            return cast(dict[str, Any], graph.invoke(given, config))

        out = run({"messages": [HumanMessage("go")]})
        for _ in range(3):
            if "__interrupt__" not in out:
                break
            value = interrupt_value(out)
            asked = len(value.get("action_requests", [])) or 1
            out = run(Command(resume={"decisions": [{"type": "approve"}] * asked}))
        assert "__interrupt__" not in out and out["messages"][-1].content == "done"
        assert world.count(call["name"]) == 1
        answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
        assert [m.tool_call_id for m in answers] == [call["id"]] * 2
        assert answers[0].content == answers[1].content == answer
        assert statuses(saver.ledger, "t-twice") == {call["id"]: "committed"}

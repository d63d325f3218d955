"""ApprovalGate and cancellation: a cancel while approval is pending runs nothing.

Every held call is dropped, whatever answer arrives after the stop, and the report
says the run was cancelled with nothing permanent done.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.types import Command

from approval_helpers import (
    BIG_REFUND,
    EMAIL,
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
from langgraph_cancel import get_report, request_cancel
from langgraph_cancel.testing import ScriptedChatModel, tool_calls_turn


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

"""Provider-held delay windows on real graphs: a send-at email revoked by a stop inside its
window, made permanent after it, and never reported revoked once the provider delivered.

The provider is ``SendAtMail`` on its own SQLite file: its truth, not the ledger, says
whether an email was delivered.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from graphs import agent_builder, config_for, new_thread, scripted
from langgraph_cancel import ApprovalGate, EffectKind, EffectToolNode, add_cancellation, effect
from langgraph_cancel.api import request_cancel
from langgraph_cancel.demo.send_at import SendAtMail
from langgraph_cancel.effects import idempotency_key, spec_of
from langgraph_cancel.report import CancellationReport
from langgraph_cancel.testing import tool_call
from langgraph_cancel.types import EffectStatus
from module_fixtures import db_url_fixture, saver_fixture  # noqa: F401 (fixtures)


@pytest.fixture
def mail(tmp_path: Path) -> SendAtMail:
    return SendAtMail(tmp_path / "send-at.db")


def send_at_tool(
    mail: SendAtMail, window: timedelta, *, provider_window: timedelta | None = None
) -> BaseTool:
    """A send-at email tool whose provider holds the email for ``provider_window``
    (default: the declared ``window``); ``revoke`` asks the provider to withdraw it."""
    held_for = (provider_window or window).total_seconds()

    def notify(to: str, subject: str) -> str:
        handle = mail.schedule(to, subject, "body", held_for, idempotency_key())
        return str(handle["email_id"])

    def revoke(key: str, args: dict[str, Any], handle: Any) -> bool:
        return mail.revoke(key)

    return effect(
        EffectKind.IRREVERSIBLE,
        delay=window,
        revoke=revoke,
        requires_approval=False,
        retry_safe=True,
    )(StructuredTool.from_function(notify, name="notify", description="Send-at email."))


def _turns() -> list[AIMessage]:
    return [
        AIMessage("", tool_calls=[tool_call("notify", {"to": "a@x.io", "subject": "s"}, id="n1")]),
        AIMessage("", tool_calls=[tool_call("notify", {"to": "b@x.io", "subject": "t"}, id="n2")]),
    ]


def _run_to_second_turn(saver: Any, tool: BaseTool) -> tuple[Any, str]:
    """Run turn 1 (the first email goes out to its provider) and stop before turn 2's tools."""
    builder = agent_builder(scripted(*_turns()), EffectToolNode([tool]))
    graph = add_cancellation(builder).compile(checkpointer=saver, interrupt_before=["tools"])
    thread_id = new_thread()
    cfg = config_for(thread_id)
    graph.invoke({"messages": [HumanMessage("go")]}, cfg)
    graph.invoke(None, cfg)  # turn 1's call runs; the graph pauses before turn 2's
    assert graph.get_state(cfg).next == ("tools",)
    return graph, thread_id


def _stop(graph: Any, saver: Any, thread_id: str) -> CancellationReport:
    answer = request_cancel(saver, thread_id, reason="stop", requested_by="test")
    assert answer.accepted
    graph.invoke(None, config_for(thread_id))
    values = graph.get_state(config_for(thread_id)).values
    return CancellationReport.model_validate(values["cancellation_report"])


def test_a_stop_inside_the_window_revokes_the_email(saver: Any, mail: SendAtMail) -> None:
    graph, thread_id = _run_to_second_turn(saver, send_at_tool(mail, timedelta(minutes=5)))
    (first,) = [e for e in saver.ledger.effects(thread_id) if e.tool_call_id == "n1"]
    assert first.status is EffectStatus.SCHEDULED and first.release_at is not None
    assert mail.status(first.idempotency_key) == "scheduled"
    report = _stop(graph, saver, thread_id)
    assert [e.tool_call_id for e in report.revoked] == ["n1"]
    assert [e.tool_call_id for e in report.not_run] == ["n2"]
    assert report.permanent == [] and report.scheduled == []
    assert "revoked inside the delay window" in report.summary
    # The provider's truth: withdrawn, never delivered.
    truth = mail.truth()
    assert [e["key"] for e in truth["revoked"]] == [first.idempotency_key]
    assert truth["delivered"] == [] and truth["scheduled"] == []
    history = [h.to_status for h in saver.ledger.history(first.effect_id)]
    assert history[-3:] == [EffectStatus.DISPATCHED, EffectStatus.SCHEDULED, EffectStatus.REVOKED]


def test_after_the_window_the_email_is_permanent(saver: Any, mail: SendAtMail) -> None:
    window = timedelta(seconds=0.3)
    graph, thread_id = _run_to_second_turn(saver, send_at_tool(mail, window))
    time.sleep(0.5)
    report = _stop(graph, saver, thread_id)
    assert [e.tool_call_id for e in report.permanent] == ["n1"]
    assert report.revoked == []
    assert [e["key"] for e in mail.truth()["delivered"]] == [report.permanent[0].idempotency_key]


def test_an_email_the_provider_delivered_early_is_never_reported_revoked(
    saver: Any, mail: SendAtMail
) -> None:
    # The tool declares five minutes; its provider only holds the email for a moment.
    tool = send_at_tool(mail, timedelta(minutes=5), provider_window=timedelta(seconds=0.2))
    graph, thread_id = _run_to_second_turn(saver, tool)
    time.sleep(0.4)
    report = _stop(graph, saver, thread_id)
    assert report.revoked == []
    assert [e.tool_call_id for e in report.permanent] == ["n1"]
    (first,) = [e for e in saver.ledger.effects(thread_id) if e.tool_call_id == "n1"]
    assert first.status is EffectStatus.COMMITTED
    assert mail.status(first.idempotency_key) == "delivered"


def test_a_revoke_hook_that_cannot_answer_leaves_the_email_unknown(
    saver: Any, mail: SendAtMail
) -> None:
    tool = send_at_tool(mail, timedelta(minutes=5))

    def broken(key: str, args: dict[str, Any], handle: Any) -> bool:
        raise ConnectionError("provider unreachable")

    spec = spec_of(tool)
    object.__setattr__(tool, "_langgraph_cancel_spec", replace(spec, revoke=broken))
    graph, thread_id = _run_to_second_turn(saver, tool)
    report = _stop(graph, saver, thread_id)
    assert report.revoked == [] and report.permanent == []
    (unknown,) = report.unknown
    assert unknown.tool_call_id == "n1" and unknown.owner and unknown.next_action
    assert "provider unreachable" in (unknown.error or "")


def test_the_approval_gate_shows_the_window(saver: Any, mail: SendAtMail) -> None:
    tool = send_at_tool(mail, timedelta(minutes=5))
    spec = spec_of(tool)
    object.__setattr__(tool, "_langgraph_cancel_spec", replace(spec, requires_approval=True))
    graph = add_cancellation(agent_builder(scripted(*_turns()), EffectToolNode([tool]))).compile(
        checkpointer=saver
    )
    thread_id = new_thread()
    graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    (pending,) = graph.get_state(config_for(thread_id)).interrupts
    request = pending.value
    window = request["delay_window"]
    assert window == {
        "seconds": 300.0,
        "held_by": "provider",
        "text": window["text"],
    }
    assert "5 min" in window["text"] and "5 min" in request["why_permanent"]
    assert mail.truth() == {"scheduled": [], "revoked": [], "delivered": []}


def test_the_approval_gate_shows_the_window_then_a_stop_revokes_the_approved_email(
    saver: Any, mail: SendAtMail
) -> None:
    tool = send_at_tool(mail, timedelta(minutes=5))
    object.__setattr__(
        tool, "_langgraph_cancel_spec", replace(spec_of(tool), requires_approval=True)
    )
    builder = StateGraph(MessagesState)
    model = scripted(*_turns())
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("approval", ApprovalGate([tool]))
    builder.add_node("tools", EffectToolNode([tool]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
    builder.add_edge("approval", "tools")
    builder.add_edge("tools", "agent")
    graph = add_cancellation(builder).compile(checkpointer=saver)
    thread_id = new_thread()
    cfg = config_for(thread_id)
    graph.invoke({"messages": [HumanMessage("go")]}, cfg)
    (pending,) = graph.get_state(cfg).interrupts
    (action,) = pending.value["action_requests"]
    assert action["delay_window"]["seconds"] == 300.0
    assert action["delay_window"]["held_by"] == "provider"
    assert "5 min" in action["why_permanent"]
    # Approved: the email goes to its provider, held there; turn 2 asks again.
    graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg)
    (first,) = [e for e in saver.ledger.effects(thread_id) if e.tool_call_id == "n1"]
    assert first.status is EffectStatus.SCHEDULED
    report = _stop(graph, saver, thread_id)
    assert [e.tool_call_id for e in report.revoked] == ["n1"]
    assert mail.truth()["delivered"] == []


def test_an_async_run_schedules_and_a_stop_revokes(saver: Any, mail: SendAtMail) -> None:
    tool = send_at_tool(mail, timedelta(minutes=5))
    builder = agent_builder(scripted(*_turns()), EffectToolNode([tool]), use_async=True)
    graph = add_cancellation(builder).compile(checkpointer=saver, interrupt_before=["tools"])
    thread_id = new_thread()
    cfg = config_for(thread_id)

    async def run() -> None:
        await graph.ainvoke({"messages": [HumanMessage("go")]}, cfg)
        await graph.ainvoke(None, cfg)
        assert request_cancel(saver, thread_id, reason="stop", requested_by="test").accepted
        await graph.ainvoke(None, cfg)

    asyncio.run(run())
    report = CancellationReport.model_validate(graph.get_state(cfg).values["cancellation_report"])
    assert [e.tool_call_id for e in report.revoked] == ["n1"]
    assert [e["key"] for e in mail.truth()["revoked"]] == [report.revoked[0].idempotency_key]

"""``EffectMiddleware`` beside LangChain's ``HumanInTheLoopMiddleware``, and stopped mid-call.

A real ``create_agent`` agent on a real saver, driven as a user drives it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from pathlib import Path
from typing import Any, cast

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.types import Command

from langgraph_cancel import EffectKind, EffectStatus, effect, get_report, idempotency_key
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.effects import UnclassifiedToolWarning
from langgraph_cancel.middleware import EffectMiddleware
from langgraph_cancel.testing import ScriptedChatModel, tool_call

REFUND = tool_call("issue_refund", {"order_id": "o-88", "amount": 60.0}, id="c-refund")


def _refund_tool(
    applied: list[tuple[str, float, str]],
    delay: float = 0.0,
    started: threading.Event | None = None,
) -> BaseTool:
    @effect(EffectKind.IRREVERSIBLE, idempotency_key=lambda a: f"refund:{a['order_id']}")
    @tool
    def issue_refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        if started is not None:
            started.set()
        time.sleep(delay)
        applied.append((order_id, amount, idempotency_key()))
        return f"refunded {amount} on {order_id}"

    return issue_refund


def _saver(kind: str, tmp_path: Path) -> Any:
    if kind == "memory":
        return MemoryCancelSaver()
    import sqlite3

    saver = SqliteCancelSaver(sqlite3.connect(tmp_path / "agent.db", check_same_thread=False))
    saver.setup()
    return saver


def _assert_valid_history(messages: list[BaseMessage]) -> None:
    """Every tool call is answered, right after its message, before anything else."""
    at = 0
    while at < len(messages):
        message = messages[at]
        at += 1
        if isinstance(message, AIMessage) and message.tool_calls:
            wanted = {call["id"] for call in message.tool_calls}
            answered: set[str] = set()
            while at < len(messages) and isinstance(messages[at], ToolMessage):
                answered.add(messages[at].tool_call_id)  # type: ignore[attr-defined]
                at += 1
            assert answered == wanted, (wanted, answered, messages)


@pytest.mark.parametrize("order", ["hitl-first", "effect-first"])
@pytest.mark.parametrize("saver_kind", ["memory", "sqlite"])
def test_hitl_reviews_once_and_its_edit_runs_and_is_recorded(
    order: str, saver_kind: str, tmp_path: Path
) -> None:
    applied: list[tuple[str, float, str]] = []
    hitl = HumanInTheLoopMiddleware(interrupt_on={"issue_refund": True})
    effects = EffectMiddleware(approval=hitl)
    middleware: list[AgentMiddleware[Any, Any, Any]] = (
        [hitl, effects] if order == "hitl-first" else [effects, hitl]
    )
    saver = _saver(saver_kind, tmp_path)
    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[REFUND]), "done"], on_exhausted="repeat_last"
    )
    agent = create_agent(model, [_refund_tool(applied)], middleware=middleware, checkpointer=saver)
    cfg: RunnableConfig = {"configurable": {"thread_id": f"hitl-{order}"}}

    out = agent.invoke({"messages": [HumanMessage("refund o-88")]}, cfg)
    (question,) = out["__interrupt__"]
    assert [a["name"] for a in question.value["action_requests"]] == ["issue_refund"]
    edit = {
        "type": "edit",
        "edited_action": {"name": "issue_refund", "args": {"order_id": "o-88", "amount": 55.0}},
    }
    out = agent.invoke(Command(resume={"decisions": [edit]}), cfg)
    assert "__interrupt__" not in out, "asked twice"
    assert applied == [("o-88", 55.0, "refund:o-88")]
    rec = saver.ledger.find_effect(cfg["configurable"]["thread_id"], "c-refund")
    assert rec is not None and rec.status is EffectStatus.COMMITTED
    assert rec.args == {"order_id": "o-88", "amount": 55.0}
    assert out["messages"][-1].content == "done"
    _assert_valid_history(out["messages"])


def test_a_call_hitl_approved_runs_when_review_is_delegated() -> None:
    applied: list[tuple[str, float, str]] = []
    hitl = HumanInTheLoopMiddleware(interrupt_on={"issue_refund": True})
    saver = MemoryCancelSaver()
    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[REFUND]), "done"], on_exhausted="repeat_last"
    )
    agent = create_agent(
        model,
        [_refund_tool(applied)],
        middleware=[hitl, cast(AgentMiddleware[Any, Any, Any], EffectMiddleware(approval=False))],
        checkpointer=saver,
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": "delegated"}}
    agent.invoke({"messages": [HumanMessage("refund o-88")]}, cfg)
    out = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg)
    assert applied == [("o-88", 60.0, "refund:o-88")]
    assert out["messages"][-1].content == "done"


def test_without_hitl_the_middleware_asks_where_the_call_stands() -> None:
    applied: list[tuple[str, float, str]] = []
    saver = MemoryCancelSaver()
    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[REFUND]), "done"], on_exhausted="repeat_last"
    )
    agent = create_agent(
        model, [_refund_tool(applied)], middleware=[EffectMiddleware()], checkpointer=saver
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": "own-review"}}
    out = agent.invoke({"messages": [HumanMessage("refund o-88")]}, cfg)
    (question,) = out["__interrupt__"]
    assert question.value["type"] == "tool_approval"
    assert question.value["idempotency_key"] == "refund:o-88"
    out = agent.invoke(Command(resume={"type": "approve"}), cfg)
    assert applied == [("o-88", 60.0, "refund:o-88")]


def test_an_unclassified_tool_asks_whatever_ran_before_in_the_process() -> None:
    # Fail safe per tool, never by process history: the same tool name classified
    # elsewhere in the process changes nothing for this agent's unclassified tool.
    @effect(EffectKind.READ_ONLY)
    @tool
    def lookup(order_id: str) -> str:
        """A classified tool of another agent, with the same name."""
        return "classified"

    @tool("lookup")
    def plain_lookup(order_id: str) -> str:
        """This agent's unclassified tool."""
        return "plain"

    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[tool_call("lookup", {"order_id": "o1"}, id="c1")]), "done"],
        on_exhausted="repeat_last",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnclassifiedToolWarning)
        agent = create_agent(
            model, [plain_lookup], middleware=[EffectMiddleware()], checkpointer=MemoryCancelSaver()
        )
        out = agent.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "u"}})
    assert out["__interrupt__"][0].value["effect_kind"] == "irreversible"
    assert lookup.name == "lookup"


async def test_a_task_cancel_mid_call_leaves_a_valid_history_and_a_report() -> None:
    # What a LangGraph server's stop does: the run's task is cancelled while a call is in
    # flight. The call is waited for and recorded; the next turn closes the stopped run
    # (cancelled, once, with its report) and answers its calls before the new input.
    started = threading.Event()
    applied: list[tuple[str, float, str]] = []
    saver = MemoryCancelSaver()
    model = ScriptedChatModel(
        [
            AIMessage(
                "",
                tool_calls=[
                    REFUND,
                    tool_call("issue_refund", {"order_id": "o-91", "amount": 5.0}, id="c-2"),
                ],
            ),
            "how can I help?",
        ],
        on_exhausted="repeat_last",
    )
    agent = create_agent(
        model,
        [_refund_tool(applied, delay=0.6, started=started)],
        middleware=[EffectMiddleware(approval=False)],
        checkpointer=saver,
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": "stopped"}}
    task = asyncio.ensure_future(agent.ainvoke({"messages": [HumanMessage("refund")]}, cfg))
    # The stop comes while the first call is in the tool (for 0.6 s), however slow the
    # machine is.
    deadline = time.monotonic() + 30
    while not started.is_set():
        assert time.monotonic() < deadline and not task.done(), "no call was sent"
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    first_run = saver.ledger.latest_run("stopped")
    assert first_run is not None
    out = await agent.ainvoke({"messages": [HumanMessage("where are we?")]}, cfg)
    _assert_valid_history(out["messages"])
    assert isinstance(out["messages"][-2], HumanMessage)
    stopped = saver.ledger.get_run(first_run.run_id)
    assert stopped.status.value == "cancelled"
    report = get_report(saver, "stopped", run_id=first_run.run_id)
    permanent = {e.tool_call_id for e in report.permanent}
    assert permanent, "the call in flight was waited for and committed"
    # Every refund the provider applied is reported permanent; none ran twice.
    assert sorted(permanent) == sorted(
        rec.tool_call_id
        for rec in saver.ledger.effects("stopped")
        if rec.status is EffectStatus.COMMITTED
    )
    assert len(applied) == len({key for *_, key in applied}) == len(permanent)


def test_a_stop_ends_the_agent_beside_an_after_model_hook() -> None:
    # HumanInTheLoopMiddleware's after_model hook sits between the model and the route
    # after it, so the stop's jump to the end does not reach that route: the agent comes
    # back to the model once, and a closing reply ends it. The model is not called again.

    applied: list[tuple[str, float, str]] = []
    saver = MemoryCancelSaver()
    hitl = HumanInTheLoopMiddleware(interrupt_on={"something_else": True})
    model = ScriptedChatModel(
        [
            AIMessage(
                "", tool_calls=[tool_call("issue_refund", {"order_id": "o-1", "amount": 1.0})]
            ),
            AIMessage(
                "", tool_calls=[tool_call("issue_refund", {"order_id": "o-2", "amount": 2.0})]
            ),
            "never said",
        ]
    )

    def refund_then_wait() -> BaseTool:
        @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
        @tool
        def issue_refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            applied.append((order_id, amount, idempotency_key()))
            started.set()
            time.sleep(0.3)
            return f"refunded {amount} on {order_id}"

        return issue_refund

    started = threading.Event()
    agent = create_agent(
        model,
        [refund_then_wait()],
        middleware=[hitl, cast(AgentMiddleware[Any, Any, Any], EffectMiddleware(approval=hitl))],
        checkpointer=saver,
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": "stop-beside-hitl"}}

    def stop() -> None:
        started.wait(10)
        from langgraph_cancel import request_cancel

        request_cancel(saver, "stop-beside-hitl", reason="user pressed stop", requested_by="test")

    stopper = threading.Thread(target=stop)
    stopper.start()
    out = agent.invoke({"messages": [HumanMessage("refund")]}, {**cfg, "recursion_limit": 12})
    stopper.join()
    assert model.calls == 1
    assert [order for order, *_ in applied] == ["o-1"]
    assert out["cancellation_report"]["status"] == "cancelled"
    assert get_report(saver, "stop-beside-hitl").status == "cancelled"
    _assert_valid_history(out["messages"])
    assert not out["messages"][-1].tool_calls  # the closing reply

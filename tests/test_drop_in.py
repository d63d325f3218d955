"""``EffectToolNode`` in place of ``ToolNode``: what a user swapping one for the other sees.

Where the two must behave alike, each test runs the same graph with ``ToolNode``
and with ``EffectToolNode`` (tools classified so that nothing asks for approval)
and compares what comes out: answers, state updates, exceptions. Where they
differ on purpose (approval of irreversible calls, replay instead of a second
run), the test says why.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, InjectedStore, ToolNode, tools_condition
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolRuntime
from langgraph.types import Command, interrupt
from pydantic import BaseModel, ValidationError

from langgraph_cancel import (
    EffectKind,
    EffectStatus,
    EffectToolNode,
    Outcome,
    add_cancellation,
    effect,
    idempotency_key,
)
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.testing import ScriptedChatModel, tool_call

REPO = Path(__file__).resolve().parent.parent


class State(MessagesState):
    """Messages plus a field a tool's ``Command`` may set."""

    flag: str


def _graph(
    node: ToolNode, turns: list[AIMessage | str], *, checkpointer: Any = None, cancel: bool = False
) -> Any:
    model = ScriptedChatModel(list(turns), on_exhausted="repeat_last")

    def agent(state: State) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    if cancel:
        return add_cancellation(builder).compile(checkpointer=checkpointer)
    return builder.compile(checkpointer=checkpointer)


def _outcome(run: Callable[[], Any]) -> Any:
    """What a run gives: its messages' contents and the flag, or its exception."""
    try:
        out = run()
    except Exception as exc:
        return ("raised", type(exc).__name__)
    answers = [
        (m.tool_call_id, m.status, m.content) for m in out["messages"] if isinstance(m, ToolMessage)
    ]
    return answers, out.get("flag")


def _both(
    tools: list[BaseTool],
    turn: AIMessage,
    *,
    node_kwargs: dict[str, Any] | None = None,
    use_async: bool = False,
) -> tuple[Any, Any]:
    """The same graph with ToolNode and with EffectToolNode, and what each gave."""
    kwargs = node_kwargs or {}
    inp = {"messages": [HumanMessage("go")]}

    def run_with(node: ToolNode) -> Any:
        graph = _graph(node, [turn, "done"], checkpointer=InMemorySaver())
        cfg: RunnableConfig = {"configurable": {"thread_id": "t"}}
        if use_async:
            return _outcome(lambda: asyncio.run(graph.ainvoke(inp, cfg)))
        return _outcome(lambda: graph.invoke(inp, cfg))

    return run_with(ToolNode(tools, **kwargs)), run_with(EffectToolNode(tools, **kwargs))


def _unapproved(kind: EffectKind = EffectKind.IRREVERSIBLE) -> Callable[[Any], BaseTool]:
    return effect(kind, requires_approval=False)


# --------------------------------------------------------------- the same as ToolNode
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_the_default_error_handling_is_toolnodes(use_async: bool) -> None:
    # ToolNode's default: arguments off the schema become a message for the model, a
    # tool's own exception fails the run.
    @_unapproved()
    @tool
    def charge(amount: int) -> str:
        """Charge."""
        raise RuntimeError("card declined")

    bad_args = AIMessage("", tool_calls=[tool_call("charge", {"amount": "lots"}, id="c1")])
    theirs, ours = _both([charge], bad_args, use_async=use_async)
    assert theirs == ours and theirs[0][0][1] == "error"
    raising = AIMessage("", tool_calls=[tool_call("charge", {"amount": 3}, id="c1")])
    theirs, ours = _both([charge], raising, use_async=use_async)
    assert theirs == ours == ("raised", "RuntimeError")


@pytest.mark.parametrize("flag", [True, False, "failed", ValueError])
def test_handle_tool_errors_is_toolnodes(flag: Any) -> None:
    @_unapproved()
    @tool
    def charge(amount: int) -> str:
        """Charge."""
        raise ValueError("card declined")

    for args in ({"amount": "lots"}, {"amount": 3}):
        turn = AIMessage("", tool_calls=[tool_call("charge", args, id="c1")])
        theirs, ours = _both([charge], turn, node_kwargs={"handle_tool_errors": flag})
        assert theirs == ours, (args, theirs, ours)


def test_a_tools_command_comes_back_whole_on_a_replay() -> None:
    # A tool's Command (a state update beside its message) survives the batch being
    # run again: the ledger keeps the Command, not a placeholder.
    runs: list[str] = []

    @_unapproved(EffectKind.IRREVERSIBLE)
    @tool
    def set_flag(value: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Set the flag."""
        runs.append(value)
        return Command(
            update={
                "flag": value,
                "messages": [ToolMessage(f"flag is {value}", tool_call_id=tool_call_id)],
            }
        )

    @effect(EffectKind.IRREVERSIBLE)  # needs approval: the node stops, then runs again
    @tool
    def publish(text: str) -> str:
        """Publish."""
        return f"published {text}"

    set_flag_call = tool_call("set_flag", {"value": "on"}, id="c1")
    publish_call = tool_call("publish", {"text": "news"}, id="c2")
    graph = _graph(
        EffectToolNode([set_flag, publish]),
        [AIMessage("", tool_calls=[set_flag_call, publish_call]), "done"],
        checkpointer=InMemorySaver(),
        cancel=True,
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": "cmd"}}
    out = graph.invoke({"messages": [HumanMessage("go")]}, cfg)
    assert out["__interrupt__"][0].value["name"] == "publish"
    out = graph.invoke(Command(resume={"type": "approve"}), cfg)
    assert runs == ["on"]  # replayed, not run again
    assert out["flag"] == "on"
    answers = {m.tool_call_id: m.content for m in out["messages"] if isinstance(m, ToolMessage)}
    assert answers == {"c1": "flag is on", "c2": "published news"}


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_injection_by_annotation_and_by_name_is_toolnodes(use_async: bool) -> None:
    @_unapproved(EffectKind.READ_ONLY)
    @tool
    def count(state: Annotated[dict[str, Any], InjectedState]) -> str:
        """Count messages."""
        return str(len(state["messages"]))

    @_unapproved(EffectKind.READ_ONLY)
    @tool
    def whoami(runtime: ToolRuntime) -> str:
        """Say the call id."""
        return runtime.tool_call_id or ""

    turn = AIMessage(
        "", tool_calls=[tool_call("count", {}, id="c1"), tool_call("whoami", {}, id="c2")]
    )
    theirs, ours = _both([count, whoami], turn, use_async=use_async)
    assert theirs == ours
    assert [answer[2] for answer in ours[0]] == ["2", "c2"]


def test_wiring_errors_raise_as_they_do_in_toolnode() -> None:
    @_unapproved(EffectKind.READ_ONLY)
    @tool
    def needs_field(missing: Annotated[str, InjectedState("nowhere")]) -> str:
        """Read a state field that is not there."""
        return missing

    @_unapproved(EffectKind.IRREVERSIBLE)
    @tool
    def needs_store(item: str, store: Annotated[Any, InjectedStore()]) -> str:
        """Use the store the graph was not compiled with."""
        return item

    for name, args in (("needs_field", {}), ("needs_store", {"item": "x"})):
        turn = AIMessage("", tool_calls=[tool_call(name, args, id="c1")])
        theirs, ours = _both([needs_field, needs_store], turn)
        assert theirs == ours and theirs[0] == "raised", (name, theirs, ours)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_wrappers_are_toolnodes(use_async: bool) -> None:
    # A wrapper may serve a tool the node does not have, rewrite the state a tool sees,
    # and fail: ToolNode answers its error with a message.
    @_unapproved(EffectKind.IRREVERSIBLE)
    @tool
    def extra(item: str) -> str:
        """A tool only the wrapper knows."""
        return f"extra {item}"

    @_unapproved(EffectKind.READ_ONLY)
    @tool
    def seen(runtime: ToolRuntime) -> str:
        """What the tool sees of the state."""
        return str(runtime.state.get("flag"))

    def serve(request: ToolCallRequest, execute: Callable[[ToolCallRequest], Any]) -> Any:
        name = request.tool_call["name"]
        if name == "extra":
            return execute(request.override(tool=extra))
        if name == "seen":
            return execute(request.override(state={**request.state, "flag": "from wrapper"}))
        raise RuntimeError("the wrapper failed")

    async def aserve(request: ToolCallRequest, execute: Callable[[ToolCallRequest], Any]) -> Any:
        name = request.tool_call["name"]
        if name == "extra":
            return await execute(request.override(tool=extra))
        if name == "seen":
            return await execute(request.override(state={**request.state, "flag": "from wrapper"}))
        raise RuntimeError("the wrapper failed")

    turn = AIMessage(
        "",
        tool_calls=[
            tool_call("extra", {"item": "a"}, id="c1"),
            tool_call("seen", {}, id="c2"),
            tool_call("other", {}, id="c3"),
        ],
    )
    kwargs: dict[str, Any] = (
        {"awrap_tool_call": aserve, "handle_tool_errors": True}
        if use_async
        else {"wrap_tool_call": serve, "handle_tool_errors": True}
    )
    theirs, ours = _both([seen], turn, node_kwargs=kwargs, use_async=use_async)
    assert theirs == ours
    contents = [answer[2] for answer in ours[0]]
    assert contents[:2] == ["extra a", "from wrapper"] and "the wrapper failed" in contents[2]


def test_no_thread_and_no_checkpointer_work_as_in_toolnode() -> None:
    @_unapproved(EffectKind.IRREVERSIBLE)
    @tool
    def send(to: str) -> str:
        """Send."""
        return f"sent to {to}"

    turn = AIMessage("", tool_calls=[tool_call("send", {"to": "dana"}, id="c1")])
    for node in (ToolNode([send]), EffectToolNode([send])):
        out = _graph(node, [turn, "done"]).invoke({"messages": [HumanMessage("go")]})
        assert out["messages"][-2].content == "sent to dana"
    # Called as a runnable of its own inside a graph step: the same.
    assert (
        _graph(EffectToolNode([send]), [turn, "done"])
        .invoke({"messages": [HumanMessage("again")]})["messages"][-1]
        .content
        == "done"
    )


# ---------------------------------------------------- interrupts, approval, the ledger
def test_a_tool_that_interrupts_runs_again_on_resume_under_the_same_key(tmp_path: Path) -> None:
    # As in LangGraph, interrupt() re-runs the tool from its start on resume; the ledger's
    # trail shows each execution under the one key.
    starts: list[str] = []

    @_unapproved(EffectKind.IRREVERSIBLE)
    @tool
    def confirm_and_send(to: str) -> str:
        """Ask, then send."""
        starts.append(idempotency_key())
        answer = interrupt(f"send to {to}?")
        return f"sent to {to} ({answer})"

    saver = SqliteCancelSaver(sqlite3.connect(tmp_path / "t.db", check_same_thread=False))
    turn = AIMessage("", tool_calls=[tool_call("confirm_and_send", {"to": "dana"}, id="c1")])
    graph = _graph(
        EffectToolNode([confirm_and_send]), [turn, "done"], checkpointer=saver, cancel=True
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": "ask"}}
    out = graph.invoke({"messages": [HumanMessage("go")]}, cfg)
    assert out["__interrupt__"][0].value == "send to dana?"
    out = graph.invoke(Command(resume="yes"), cfg)
    assert out["messages"][-2].content == "sent to dana (yes)"
    assert len(starts) == 2 and starts[0] == starts[1]
    rec = saver.ledger.find_effect("ask", "c1")
    assert rec is not None and rec.status is EffectStatus.COMMITTED
    trail = [(t.from_status, t.to_status) for t in saver.ledger.history(rec.effect_id)]
    assert trail.count((EffectStatus.NOT_APPLIED, EffectStatus.DISPATCHED)) == 1
    assert (EffectStatus.DISPATCHED, EffectStatus.NOT_APPLIED) in trail


def test_an_invalid_answer_to_a_tools_own_interrupt_keeps_it_open() -> None:
    class Answer(BaseModel):
        ok: bool

    @_unapproved(EffectKind.IRREVERSIBLE)
    @tool
    def ask(question: str) -> str:
        """Ask a typed question."""
        answer = interrupt(question, response_schema=Answer)
        return f"ok={answer.ok}"

    turn = AIMessage("", tool_calls=[tool_call("ask", {"question": "go?"}, id="c1")])
    for node in (ToolNode([ask]), EffectToolNode([ask])):
        graph = _graph(node, [turn, "done"], checkpointer=InMemorySaver())
        cfg: RunnableConfig = {"configurable": {"thread_id": "typed"}}
        graph.invoke({"messages": [HumanMessage("go")]}, cfg)
        with pytest.raises(ValidationError):
            graph.invoke(Command(resume={"ok": "perhaps"}), cfg)
        assert graph.get_state(cfg).interrupts, type(node).__name__
        out = graph.invoke(Command(resume={"ok": True}), cfg)
        assert out["messages"][-2].content == "ok=True"


def test_the_quickstart_as_written_asks_before_it_refunds(tmp_path: Path) -> None:
    # The README's Quickstart, as a user types it: no ApprovalGate. The irreversible
    # refund is asked about where it stands, runs once when approved, and never again.
    refunds: list[tuple[str, float, str]] = []

    class Payments:
        def refund(self, order_id: str, amount: float, *, idempotency_key: str) -> str:
            if all(key != idempotency_key for *_, key in refunds):
                refunds.append((order_id, amount, idempotency_key))
            return f"refunded {amount} on {order_id}"

        def find(self, key: str) -> Outcome:
            found = any(k == key for *_, k in refunds)
            return Outcome.committed("refunded") if found else Outcome.not_applied()

    payments = Payments()

    @effect(
        EffectKind.IRREVERSIBLE,
        idempotency_key=lambda a: f"refund:{a['order_id']}",
        reconcile=lambda key, args: payments.find(key),
    )
    @tool
    def issue_refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        return payments.refund(order_id, amount, idempotency_key=idempotency_key())

    tools = [issue_refund]
    turn = AIMessage(
        "", tool_calls=[tool_call("issue_refund", {"order_id": "o-88", "amount": 40.0}, id="c1")]
    )
    model = ScriptedChatModel([turn, "done"], on_exhausted="repeat_last")
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", EffectToolNode(tools))  # was: ToolNode(tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    saver = SqliteCancelSaver(sqlite3.connect(tmp_path / "agent.db", check_same_thread=False))
    graph = add_cancellation(builder).compile(checkpointer=saver)

    cfg: RunnableConfig = {"configurable": {"thread_id": "quickstart"}}
    out = graph.invoke({"messages": [HumanMessage("refund o-88")]}, cfg)
    asked = out["__interrupt__"][0].value
    assert asked["type"] == "tool_approval" and asked["name"] == "issue_refund"
    assert refunds == []
    out = graph.invoke(Command(resume={"type": "approve"}), cfg)
    assert refunds == [("o-88", 40.0, "refund:o-88")]
    assert out["messages"][-1].content == "done"
    graph.invoke(None, cfg)
    assert len(refunds) == 1


_SECOND_PROCESS = textwrap.dedent(
    """
    import sys
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition
    from langgraph_cancel import EffectKind, EffectToolNode, add_cancellation, effect
    from langgraph_cancel.testing import ScriptedChatModel, tool_call

    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def send(to: str) -> str:
        \"\"\"Send.\"\"\"
        with open(sys.argv[1], "a") as log:
            log.write(to + "\\n")
        return "sent"

    turn = AIMessage("", tool_calls=[tool_call("send", {"to": "dana"}, id="c1")])
    model = ScriptedChatModel([turn, "done"], on_exhausted="repeat_last")
    b = StateGraph(MessagesState)
    b.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    b.add_node("tools", EffectToolNode([send]))
    b.add_edge(START, "agent")
    b.add_conditional_edges("agent", tools_condition)
    b.add_edge("tools", "agent")
    graph = add_cancellation(b).compile(checkpointer=InMemorySaver())
    out = graph.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "1"}})
    print(out["messages"][-2].content)
    """
)


def test_a_second_process_on_an_in_memory_saver_runs_its_tool(tmp_path: Path) -> None:
    # Nothing of an InMemorySaver outlives its process, so neither does its ledger: a
    # second process using thread "1" and call "c1" again runs its tool. Neither writes
    # a file in its working directory.
    script = tmp_path / "agent.py"
    script.write_text(_SECOND_PROCESS)
    sends = tmp_path / "sends.txt"
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "LANGGRAPH_CANCEL_DB"}
    env["PYTHONPATH"] = str(REPO)
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script), str(sends)],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "sent"
    assert sends.read_text().splitlines() == ["dana", "dana"]
    assert list(workdir.iterdir()) == []

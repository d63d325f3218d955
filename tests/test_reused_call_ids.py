"""A provider that repeats tool-call ids across turns cannot make a call replay another.

The ledger knows a call by (thread, tool-call id, the model turn that asked for
it). Some OpenAI-compatible servers number ids per message, so turn two's
``call_0`` is not turn one's: it is recorded under ``call_0~turn-1``, and runs,
is asked about, is dropped by a cancel, like any call; so does the same call
asked for again in a later turn (a new step, as in LangGraph). A re-run of the
same step (an interrupt, a crash) finds the same history, so the same record,
answered from the ledger. Before acting on a record it finds, the node still
checks it is this call (DBOS's "same step?"): same tool, same arguments (or the
ones an approved edit replaced); another call's record is never replayed as this
call's answer.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from graphs import ExecutionLog, cancellable, config_for, counting_tool, new_thread
from langgraph_cancel import (
    ApprovalGate,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    effect,
    get_report,
)
from langgraph_cancel.errors import EffectConflictError
from langgraph_cancel.execution.identity import (
    dangling_tool_calls,
    ensure_same_call,
    turn_call_id,
)
from langgraph_cancel.ledger import derive_idempotency_key
from langgraph_cancel.testing import tool_call
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)


def _provider(*turns: list[tuple[str, str]]) -> Any:
    """A model node whose every turn numbers its calls call_0, call_1, ... again."""

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        turn = sum(isinstance(m, AIMessage) for m in state["messages"])
        if turn >= len(turns):
            return {"messages": [AIMessage("fin")]}
        calls = [
            tool_call(name, {"item": item}, id=f"call_{i}")
            for i, (name, item) in enumerate(turns[turn])
        ]
        return {"messages": [AIMessage("", tool_calls=calls)]}

    return agent


def _graph(
    saver: Any,
    tools: list[Any],
    *turns: list[tuple[str, str]],
    gate: bool = False,
    agent: Any = None,
) -> Any:
    """agent (``_provider(*turns)`` unless given) -> [approval] -> tools, cancellable."""
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent or _provider(*turns))
    builder.add_node("tools", EffectToolNode(tools))
    builder.add_edge(START, "agent")
    if gate:
        builder.add_node("approval", ApprovalGate(tools))
        builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
        builder.add_edge("approval", "tools")
    else:
        builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return cancellable(builder, saver)


def _answers(out: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (m.tool_call_id, m.status, str(m.content))
        for m in out["messages"]
        if isinstance(m, ToolMessage)
    ]


def _own(name: str, item: str) -> str:
    """The ledger id of turn two's ``call_0`` (turn one's was another step)."""
    return turn_call_id("call_0", 1)


def test_a_reused_id_with_other_arguments_runs_under_an_id_of_its_own(
    saver: Any, log: ExecutionLog
) -> None:
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    graph = _graph(saver, [refund], [("refund", "o-1")], [("refund", "o-2")])
    thread = new_thread()
    out = graph.invoke({"messages": [HumanMessage("refund both")]}, config_for(thread))
    # Each turn's call_0 ran once and is answered under the id the model gave it.
    assert _answers(out) == [
        ("call_0", "success", "refund(o-1) ok"),
        ("call_0", "success", "refund(o-2) ok"),
    ]
    assert [r["item"] for r in log.rows("refund")] == ["o-1", "o-2"]
    first = saver.ledger.find_effect(thread, "call_0")
    assert first.args == {"item": "o-1"} and first.status is EffectStatus.COMMITTED
    assert len(saver.ledger.history(first.effect_id)) == 3  # planned, dispatched, committed
    second = saver.ledger.find_effect(thread, _own("refund", "o-2"))
    assert second.args == {"item": "o-2"} and second.status is EffectStatus.COMMITTED
    # Its key is derived from its own id: the external system sees two requests.
    assert second.idempotency_key == derive_idempotency_key(thread, second.tool_call_id)
    assert {r["key"] for r in log.rows("refund")} == {
        first.idempotency_key,
        second.idempotency_key,
    }
    assert saver.ledger.latest_run(thread).status.value == "completed"


def test_each_turn_asking_again_is_a_step_of_its_own(saver: Any, log: ExecutionLog) -> None:
    # Turn three repeats turn two's call under call_0 once more: a new model turn is a
    # new step (as in LangGraph), recorded under its own id with its own key.
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    turns = [("refund", "o-1")], [("refund", "o-2")], [("refund", "o-2")]
    graph = _graph(saver, [refund], *turns)
    thread = new_thread()
    out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread))
    assert [a[2] for a in _answers(out)] == ["refund(o-1) ok", "refund(o-2) ok", "refund(o-2) ok"]
    assert [r["item"] for r in log.rows("refund")] == ["o-1", "o-2", "o-2"]
    ids = [r.tool_call_id for r in saver.ledger.effects(thread)]
    assert sorted(ids) == ["call_0", turn_call_id("call_0", 1), turn_call_id("call_0", 2)]
    assert len({r["key"] for r in log.rows("refund")}) == 3


def test_a_reused_id_naming_another_tool_runs_under_its_own(saver: Any, log: ExecutionLog) -> None:
    lookup = counting_tool(log, "lookup", EffectKind.READ_ONLY)
    email = counting_tool(log, "email", EffectKind.IRREVERSIBLE)
    graph = _graph(saver, [lookup, email], [("lookup", "o-1")], [("email", "o-1")])
    thread = new_thread()
    out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread))
    assert _answers(out) == [
        ("call_0", "success", "lookup(o-1) ok"),
        ("call_0", "success", "email(o-1) ok"),
    ]
    assert log.applied("email") == 1
    assert saver.ledger.find_effect(thread, "call_0").tool == "lookup"
    assert saver.ledger.find_effect(thread, _own("email", "o-1")).tool == "email"


def test_a_reused_id_on_a_read_runs_under_its_own(saver: Any, log: ExecutionLog) -> None:
    lookup = counting_tool(log, "lookup", EffectKind.READ_ONLY)
    graph = _graph(saver, [lookup], [("lookup", "a")], [("lookup", "b")])
    thread = new_thread()
    out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread))
    assert [a[1:] for a in _answers(out)] == [
        ("success", "lookup(a) ok"),
        ("success", "lookup(b) ok"),
    ]
    assert [r["item"] for r in log.rows("lookup")] == ["a", "b"]
    own = saver.ledger.find_effect(thread, _own("lookup", "b"))
    assert own.status is EffectStatus.COMMITTED and own.kind is EffectKind.READ_ONLY


def test_a_malformed_call_under_a_reused_id_is_recorded_too(saver: Any, log: ExecutionLog) -> None:
    lookup = counting_tool(log, "lookup", EffectKind.READ_ONLY)
    bad = AIMessage("", tool_calls=[tool_call("lookup", {"wrong": 1}, id="call_0")])
    good = AIMessage("", tool_calls=[tool_call("lookup", {"item": "a"}, id="call_0")])

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        turn = sum(isinstance(m, AIMessage) for m in state["messages"])
        return {"messages": [[good, bad, AIMessage("fin")][min(turn, 2)]]}

    thread = new_thread()
    out = _graph(saver, [lookup], agent=agent).invoke(
        {"messages": [HumanMessage("go")]}, config_for(thread)
    )
    assert [a[1] for a in _answers(out)] == ["success", "error"]
    # No ledger row lost: turn one's read and turn two's refusal, each its own.
    recs = {r.tool_call_id: r for r in saver.ledger.effects(thread)}
    assert recs["call_0"].status is EffectStatus.COMMITTED
    (other,) = [r for c, r in recs.items() if c != "call_0"]
    assert other.tool_call_id.startswith("call_0~") and other.status is EffectStatus.FAILED


def test_the_same_call_in_a_later_turn_runs_again(saver: Any, log: ExecutionLog) -> None:
    # Same id, same tool, same arguments, asked by a later model message: a new step.
    # A key the tool declares still lets the provider apply it once.
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    graph = _graph(saver, [refund], [("refund", "o-1")], [("refund", "o-1")])
    out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(new_thread()))
    assert [a[1:] for a in _answers(out)] == [("success", "refund(o-1) ok")] * 2
    assert log.applied("refund") == 2


def test_ensure_same_call_accepts_an_approved_edit(saver: Any) -> None:
    ledger = saver.ledger
    thread = new_thread()
    run = ledger.start_run(thread)
    rec, _ = ledger.plan(
        thread_id=thread,
        run_id=run.run_id,
        tool_call_id="call_0",
        tool="refund",
        kind=EffectKind.IRREVERSIBLE,
        args={"item": "o-1", "amount": 150},
        status=EffectStatus.PENDING_APPROVAL,
    )
    edited = ledger.transition(
        rec.effect_id,
        EffectStatus.APPROVED,
        args={"item": "o-1", "amount": 100},
        approval={"decision": "edit", "original_args": {"item": "o-1", "amount": 150}},
    )
    ensure_same_call(edited, "refund", {"amount": 100, "item": "o-1"})  # key order is no matter
    ensure_same_call(edited, "refund", {"item": "o-1", "amount": 150})  # the edit was lost
    try:
        ensure_same_call(edited, "refund", {"item": "o-1", "amount": 999})
    except EffectConflictError as exc:
        assert exc.tool_call_id == "call_0" and "999" in str(exc)
    else:  # pragma: no cover - the assertion is the point
        raise AssertionError("a different call passed as the same")


def test_the_approval_gate_asks_about_a_reused_id_under_its_own(
    saver: Any, log: ExecutionLog
) -> None:
    refund = effect(EffectKind.IRREVERSIBLE, requires_approval=True)(
        counting_tool(log, "refund", None)
    )
    graph = _graph(saver, [refund], [("refund", "o-1")], [("refund", "o-2")], gate=True)
    thread = new_thread()
    out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread))
    (asked,) = out["__interrupt__"][0].value["action_requests"]
    assert asked["tool_call_id"] == "call_0" and asked["args"] == {"item": "o-1"}
    out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config_for(thread))
    # Turn two's call_0 is another refund: asked about under its own record, and an
    # edit rewrites turn two's message, the one the model sent.
    (asked,) = out["__interrupt__"][0].value["action_requests"]
    own = saver.ledger.find_effect(thread, _own("refund", "o-2"))
    assert asked["tool_call_id"] == "call_0" and asked["effect_id"] == own.effect_id
    assert own.status is EffectStatus.PENDING_APPROVAL
    edit = {"type": "edit", "edited_action": {"name": "refund", "args": {"item": "o-2b"}}}
    out = graph.invoke(Command(resume={"decisions": [edit]}), config_for(thread))
    assert "__interrupt__" not in out
    assert [a[2] for a in _answers(out)] == ["refund(o-1) ok", "refund(o-2b) ok"]
    assert [r["item"] for r in log.rows("refund")] == ["o-1", "o-2b"]
    turns = [m for m in out["messages"] if isinstance(m, AIMessage) and m.tool_calls]
    assert [t.tool_calls[0]["args"] for t in turns] == [{"item": "o-1"}, {"item": "o-2b"}]
    assert saver.ledger.get_effect(own.effect_id).status is EffectStatus.COMMITTED


def test_a_cancel_drops_a_reused_id_the_gate_asked_about(saver: Any, log: ExecutionLog) -> None:
    refund = effect(EffectKind.IRREVERSIBLE, requires_approval=True)(
        counting_tool(log, "refund", None)
    )
    graph = _graph(saver, [refund], [("refund", "o-1")], [("refund", "o-2")], gate=True)
    thread = new_thread()
    graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread))
    out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config_for(thread))
    assert out["__interrupt__"]  # turn two's refund waits for a person; the user stops
    saver.ledger.request_cancel(thread, reason="stop", requested_by="user")
    graph.invoke(None, config_for(thread))
    own = saver.ledger.find_effect(thread, _own("refund", "o-2"))
    assert own.status is EffectStatus.DROPPED
    (dropped,) = get_report(saver, thread).not_run
    assert dropped.effect_id == own.effect_id
    assert [r["item"] for r in log.rows("refund")] == ["o-1"]


def test_a_cancel_answers_a_reused_id_as_not_run(saver: Any, log: ExecutionLog) -> None:
    # The stop comes between the model's turn and the tool node: the dangling call_0
    # is answered "not run", not with turn one's result.
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    turns = [[("refund", "o-1")], [("refund", "o-2")]]
    model = _provider(*turns)
    thread = new_thread()

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        out: dict[str, list[BaseMessage]] = model(state)
        if sum(isinstance(m, AIMessage) for m in state["messages"]) == 1:
            saver.ledger.request_cancel(thread, reason="stop", requested_by="test")
        return out

    graph = _graph(saver, [refund], agent=agent)
    out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread))
    (first, second) = _answers(out)
    assert first == ("call_0", "success", "refund(o-1) ok")
    assert second[1] == "error" and "refund(o-1) ok" not in second[2]
    assert [r["item"] for r in log.rows("refund")] == ["o-1"]
    assert saver.ledger.latest_run(thread).status.value == "cancelled"
    # The report counts it as not run, under an id of its own; turn one's record stays.
    (dropped,) = get_report(saver, thread).not_run
    assert dropped.tool_call_id.startswith("call_0~") and dropped.args == {"item": "o-2"}
    assert saver.ledger.find_effect(thread, "call_0").status.value == "committed"


def test_dangling_calls_are_matched_in_order_not_by_id_alone() -> None:
    def turn(*ids: str) -> AIMessage:
        return AIMessage("", tool_calls=[tool_call("t", {"item": i}, id=i) for i in ids])

    def answer(call_id: str) -> ToolMessage:
        return ToolMessage("ok", tool_call_id=call_id)

    history = [
        HumanMessage("go"),
        turn("call_0", "call_1"),
        answer("call_1"),
        answer("call_0"),
        turn("call_0"),  # the same id again, next turn: not answered yet
    ]
    assert [c["args"] for c in dangling_tool_calls(history)] == [{"item": "call_0"}]
    assert dangling_tool_calls([*history, answer("call_0")]) == []
    # One message repeating an id needs one answer per call.
    twice = [turn("x", "x"), answer("x")]
    assert len(dangling_tool_calls(twice)) == 1
    assert dangling_tool_calls([*twice, answer("x")]) == []

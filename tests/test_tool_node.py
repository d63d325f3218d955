"""EffectToolNode: a drop-in ToolNode that never dispatches an effect twice.

Every test runs a real compiled graph with a scripted chat model on memory,
SQLite and PostgreSQL; tools count their real executions in a SQLite file
(``ExecutionLog`` and the refund agent's providers), so counts survive kill -9.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool, Tool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, RetryPolicy, Send, interrupt

from graphs import (
    ExecutionLog,
    agent_builder,
    backend_params,
    calls,
    cancellable,
    config_for,
    counting_tool,
    dangling_calls,
    kill_graph,
    module_database,
    new_thread,
    open_saver,
    scripted,
    send_agent_builder,
    wait_until,
    worker_command,
    worker_env,
)
from langgraph_cancel import (
    DurabilityError,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    effect,
    get_report,
    idempotency_key,
)
from langgraph_cancel.demo import tools as refund_tools
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.ledger import derive_idempotency_key
from langgraph_cancel.testing import tool_call
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)


def start(graph: Any, thread_id: str, text: str = "go", **kwargs: Any) -> dict[str, Any]:
    result: dict[str, Any] = graph.invoke(
        {"messages": [HumanMessage(text)]}, config_for(thread_id), **kwargs
    )
    return result


async def astart(graph: Any, thread_id: str, text: str = "go") -> dict[str, Any]:
    result: dict[str, Any] = await graph.ainvoke(
        {"messages": [HumanMessage(text)]}, config_for(thread_id)
    )
    return result


def tool_messages(messages: list[Any]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def effects_by_tool(saver: Any, thread_id: str) -> dict[str, Any]:
    return {e.tool: e for e in saver.ledger.effects(thread_id)}


def assert_no_duplicate_keys(saver: Any, thread_id: str) -> None:
    effects = saver.ledger.effects(thread_id)
    keys = [e.idempotency_key for e in effects]
    ids = [e.tool_call_id for e in effects]
    assert len(keys) == len(set(keys)), keys
    assert len(ids) == len(set(ids)), ids


# ----------------------------------------------------------------------------- drop-in


def _agent_suite(
    graph: Any, log: ExecutionLog, model: Any, thread_id: str, use_async: bool
) -> None:
    """The agent's own tests: results in call order, errors to the model, one run per call."""
    inp = {"messages": [HumanMessage("please handle o-1")]}
    cfg = config_for(thread_id)
    out = asyncio.run(graph.ainvoke(inp, cfg)) if use_async else graph.invoke(inp, cfg)
    messages = out["messages"]
    answers = tool_messages(messages)
    assert [m.tool_call_id for m in answers] == ["c1", "c2", "c3", "c4"]
    assert [m.content for m in answers[:3]] == ["write(w) ok", "read(r) ok", "undoable(u) ok"]
    assert [m.status for m in answers] == ["success", "success", "success", "error"]
    assert "ValueError('bad item')" in str(answers[3].content)
    assert answers[3].name == "boom"
    assert isinstance(messages[-1], AIMessage) and messages[-1].content == "fin"
    assert not dangling_calls(messages)
    # tools_condition routed to END after the final answer; each tool ran exactly once.
    assert model.calls == 2
    assert sorted(r["tool"] for r in log.rows()) == ["boom", "read", "undoable", "write"]
    # The model's second call saw every answer.
    assert len(tool_messages(model.inputs[-1])) == 4


@pytest.mark.parametrize("shape", ["batch", "send"])
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("node", ["ToolNode", "EffectToolNode", "EffectToolNode+cancellation"])
def test_drop_in_swap(
    saver: Any, log: ExecutionLog, node: str, use_async: bool, shape: str
) -> None:
    tools = [
        counting_tool(log, "write", EffectKind.IRREVERSIBLE),
        counting_tool(log, "read", EffectKind.READ_ONLY),
        counting_tool(log, "undoable", EffectKind.REVERSIBLE),
        counting_tool(log, "boom", EffectKind.IRREVERSIBLE, fail=[ValueError("bad item")]),
    ]
    model = scripted(
        calls(
            ("write", "w", "c1"), ("read", "r", "c2"), ("undoable", "u", "c3"), ("boom", "b", "c4")
        ),
        "fin",
    )
    # The one line that changes (errors go to the model in both: ToolNode's own default
    # re-raises tool errors, EffectToolNode's default sends them to the model):
    node_cls = ToolNode if node == "ToolNode" else EffectToolNode
    tool_node = node_cls(tools, handle_tool_errors=True)
    build = agent_builder if shape == "batch" else send_agent_builder
    builder = build(model, tool_node, use_async=use_async)
    if node.endswith("+cancellation"):
        graph = cancellable(builder, saver)
    else:
        graph = builder.compile(checkpointer=saver)
    thread_id = new_thread()
    _agent_suite(graph, log, model, thread_id, use_async)
    if node != "ToolNode":
        effects = effects_by_tool(saver, thread_id)
        assert {t: e.status for t, e in effects.items()} == {
            "write": EffectStatus.COMMITTED,
            "read": EffectStatus.COMMITTED,
            "undoable": EffectStatus.COMMITTED,
            "boom": EffectStatus.FAILED,
        }
        assert_no_duplicate_keys(saver, thread_id)
    if node.endswith("+cancellation"):
        run = saver.ledger.latest_run(thread_id)
        assert run.status.value == "completed"


# ----------------------------------------------------------------------------- malformed calls


def test_malformed_calls_are_answered_and_recorded(saver: Any, log: ExecutionLog) -> None:
    good = counting_tool(log, "good", EffectKind.IRREVERSIBLE)
    model = scripted(
        AIMessage(
            "",
            tool_calls=[
                tool_call("no_such_tool", {"item": "x"}, id="m1"),
                tool_call("good", {}, id="m2"),  # missing required argument
                tool_call("good", {"item": {"not": "a string"}}, id="m3"),  # wrong type
                tool_call("good", {"item": "fine"}, id="m4"),
            ],
        ),
        "fin",
    )
    graph = cancellable(agent_builder(model, EffectToolNode([good])), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    assert answers["m1"].status == "error" and "no_such_tool" in str(answers["m1"].content)
    assert "is not a valid tool" in str(answers["m1"].content)
    for bad in ("m2", "m3"):
        assert answers[bad].status == "error"
        assert "item" in str(answers[bad].content)
    assert answers["m4"].status == "success" and answers["m4"].content == "good(fine) ok"
    # The run went on: the model answered and the run completed.
    assert out["messages"][-1].content == "fin"
    assert saver.ledger.latest_run(thread_id).status.value == "completed"
    # Only the well-formed call executed.
    assert [r["item"] for r in log.rows("good")] == ["fine"]
    ledger = saver.ledger
    for call_id in ("m1", "m2", "m3"):
        rec = ledger.find_effect(thread_id, call_id)
        assert rec is not None and rec.status is EffectStatus.FAILED, call_id
        assert rec.dispatched_at is None
        assert rec.error
    assert ledger.find_effect(thread_id, "m4").status is EffectStatus.COMMITTED


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_tool_body_is_the_one_toolnode_would_call(saver: Any, use_async: bool) -> None:
    # A sync graph calls a tool's function (tool.invoke), an async graph its coroutine,
    # exactly as ToolNode does: the execution is ToolNode's own. So a coroutine-only
    # tool fails a sync graph as it fails ToolNode's.
    def read_sync(item: str) -> str:
        return f"sync:{item}"

    async def read_async(item: str) -> str:
        return f"async:{item}"

    async def write_async(item: str) -> str:
        return f"async-only:{item}"

    async def note_async(text: str) -> str:
        return f"noted:{text}"

    both = effect(EffectKind.READ_ONLY)(
        StructuredTool.from_function(
            func=read_sync, coroutine=read_async, name="look", description="Look up."
        )
    )
    only_async = effect(EffectKind.IRREVERSIBLE, requires_approval=False)(
        StructuredTool.from_function(coroutine=write_async, name="send", description="Send.")
    )
    # Single-input Tools (no args schema: the tool parses its input) run too.
    note = effect(EffectKind.READ_ONLY)(
        Tool(name="note", func=None, coroutine=note_async, description="Take a note.")
    )
    shout = effect(EffectKind.READ_ONLY)(
        Tool(name="shout", func=str.upper, description="Say it loud.")
    )
    script = calls(
        ("look", "a", "l1"),
        ("send", "b", "s1"),
        {"name": "note", "args": {"__arg1": "c"}, "id": "n1"},
        {"name": "shout", "args": {"__arg1": "hey"}, "id": "h1"},
    )

    def run(node: Any, checkpointer: Any) -> Any:
        builder = agent_builder(scripted(script, "fin"), node, use_async=use_async)
        graph = (
            cancellable(builder, checkpointer)
            if isinstance(node, EffectToolNode)
            else builder.compile(checkpointer=checkpointer)
        )
        cfg = config_for(new_thread())
        inp = {"messages": [HumanMessage("go")]}
        try:
            out = asyncio.run(graph.ainvoke(inp, cfg)) if use_async else graph.invoke(inp, cfg)
        except Exception as exc:
            return type(exc), str(exc)
        return {m.tool_call_id: m.content for m in tool_messages(out["messages"])}, cfg

    tools = [both, only_async, note, shout]
    theirs = run(ToolNode(tools), InMemorySaver())
    ours = run(EffectToolNode(tools), saver)
    if use_async:
        assert (
            theirs[0]
            == ours[0]
            == {
                "l1": "async:a",
                "s1": "async-only:b",
                "n1": "noted:c",
                "h1": "HEY",
            }
        )
        thread_id = ours[1]["configurable"]["thread_id"]
        assert saver.ledger.find_effect(thread_id, "s1").status is EffectStatus.COMMITTED
    else:
        # Both fail on a coroutine-only tool (which one first follows each node's order).
        assert theirs[0] is ours[0] is NotImplementedError
        assert "does not support sync invocation" in ours[1]


def test_reads_sharing_a_declared_key_are_all_recorded(saver: Any) -> None:
    # Two read-only calls whose key function maps them to one key: both run and are
    # answered, and the second outcome is kept under a key derived from its own call.
    # The first call finishes last: call order, not completion order, keeps the key.
    started = itertools.count()

    @effect(EffectKind.READ_ONLY, idempotency_key=lambda a: f"quote:{a['item']}")
    @tool
    def quote(item: str) -> str:
        """Look a price up."""
        if next(started) == 0:
            time.sleep(0.2)
        return f"{item}: 10"

    model = scripted(calls(("quote", "o-1", "q1"), ("quote", "o-1", "q2")), "fin")
    graph = cancellable(agent_builder(model, EffectToolNode([quote])), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    assert {k: (m.status, m.content) for k, m in answers.items()} == {
        "q1": ("success", "o-1: 10"),
        "q2": ("success", "o-1: 10"),
    }
    first = saver.ledger.find_effect(thread_id, "q1")
    second = saver.ledger.find_effect(thread_id, "q2")
    assert first.idempotency_key == "quote:o-1" and first.status is EffectStatus.COMMITTED
    assert second.status is EffectStatus.COMMITTED
    assert second.idempotency_key == f"quote:o-1#duplicate:{thread_id}:q2"
    assert saver.ledger.history(second.effect_id)[0].detail == {"duplicate_key": "quote:o-1"}


def test_non_dict_arguments_via_send(saver: Any, log: ExecutionLog) -> None:
    """A Send payload may carry anything: non-dict arguments are refused, not dispatched."""
    good = counting_tool(log, "good", EffectKind.IRREVERSIBLE)

    def planner(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("planning")]}

    def route(state: MessagesState) -> Any:
        if any(isinstance(m, ToolMessage) for m in state["messages"]):
            return END
        raw = [
            {"name": "good", "args": "item=oops", "id": "n1", "type": "tool_call"},
            {"name": "good", "args": ["x"], "id": "n2", "type": "tool_call"},
            {"name": "good", "args": {"item": "ok"}, "id": "n3", "type": "tool_call"},
        ]
        return [
            Send("tools", {"__type": "tool_call_with_context", "tool_call": c, "state": state})
            for c in raw
        ]

    builder = StateGraph(MessagesState)
    builder.add_node("planner", planner)
    builder.add_node("tools", EffectToolNode([good]))
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", route, ["tools", END])
    builder.add_edge("tools", "planner")
    graph = cancellable(builder, saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    assert answers["n1"].status == "error" and "object" in str(answers["n1"].content)
    assert answers["n2"].status == "error"
    assert answers["n3"].status == "success"
    assert [r["item"] for r in log.rows("good")] == ["ok"]
    for call_id in ("n1", "n2"):
        rec = saver.ledger.find_effect(thread_id, call_id)
        assert rec.status is EffectStatus.FAILED
        assert "__raw__" in rec.args
    assert saver.ledger.latest_run(thread_id).status.value == "completed"


# ----------------------------------------------------------------------------- batch order


def test_reads_run_concurrently_first_then_reversible_then_irreversible(
    saver: Any, log: ExecutionLog
) -> None:
    # Each read waits for the other: the batch only finishes if they really overlap.
    barrier = threading.Barrier(2, timeout=20)

    def meet(_item: str) -> None:
        barrier.wait()

    tools = [
        counting_tool(log, "r1", EffectKind.READ_ONLY, before=meet),
        counting_tool(log, "r2", EffectKind.READ_ONLY, before=meet),
        counting_tool(log, "u1", EffectKind.REVERSIBLE),
        counting_tool(log, "u2", EffectKind.REVERSIBLE),
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE),
        counting_tool(log, "w2", EffectKind.IRREVERSIBLE),
    ]
    # Plan order mixes kinds on purpose.
    model = scripted(
        calls(
            ("w1", "a", "o1"),
            ("u1", "b", "o2"),
            ("r1", "c", "o3"),
            ("w2", "d", "o4"),
            ("r2", "e", "o5"),
            ("u2", "f", "o6"),
        ),
        "fin",
    )
    graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    # Answers keep the model's order whatever the execution order was.
    assert [m.tool_call_id for m in tool_messages(out["messages"])] == [
        "o1",
        "o2",
        "o3",
        "o4",
        "o5",
        "o6",
    ]
    assert all(m.status == "success" for m in tool_messages(out["messages"]))
    order = log.order()
    assert sorted(order[:2]) == ["r1", "r2"]
    assert order[2:] == ["u1", "u2", "w1", "w2"]
    rows = {r["tool"]: r for r in log.rows()}
    # Both reads were in flight at once, and finished before any effect started.
    assert max(rows["r1"]["started"], rows["r2"]["started"]) < min(
        rows["r1"]["applied"], rows["r2"]["applied"]
    )
    assert max(rows["r1"]["applied"], rows["r2"]["applied"]) <= rows["u1"]["started"]
    # The ledger agrees: effects were dispatched one at a time in that order.
    eff = effects_by_tool(saver, thread_id)
    dispatched = [eff[t].dispatched_at for t in ("u1", "u2", "w1", "w2")]
    assert dispatched == sorted(dispatched)
    assert eff["u1"].settled_at <= eff["u2"].dispatched_at
    assert eff["w1"].settled_at <= eff["w2"].dispatched_at


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_concurrent_side_effects_share_their_ledger_writes(
    saver: Any, log: ExecutionLog, use_async: bool
) -> None:
    # effect_concurrency=6: the six refunds overlap (each waits for all others), every
    # one is dispatched once under its own intent, and the intents and outcomes travel
    # in a few shared writes instead of two each.
    barrier = threading.Barrier(6, timeout=20)

    def together(_item: str) -> None:
        barrier.wait()

    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE, before=together)
    model = scripted(calls(*((("refund", f"o{i}", f"c{i}")) for i in range(6))), "fin")
    node = EffectToolNode([refund], effect_concurrency=6)
    graph = cancellable(agent_builder(model, node, use_async=use_async), saver)
    writes: list[int] = []
    ledger = saver.ledger
    transition, transition_many = ledger.transition, ledger.transition_many

    def counted_one(*args: Any, **kwargs: Any) -> Any:
        writes.append(1)
        return transition(*args, **kwargs)

    def counted_many(requests: Any) -> Any:
        writes.append(len(requests))
        return transition_many(requests)

    atransition, atransition_many = ledger.atransition, ledger.atransition_many

    async def acounted_one(*args: Any, **kwargs: Any) -> Any:
        writes.append(1)
        return await atransition(*args, **kwargs)

    async def acounted_many(requests: Any) -> Any:
        writes.append(len(requests))
        return await atransition_many(requests)

    ledger.transition, ledger.transition_many = counted_one, counted_many
    ledger.atransition, ledger.atransition_many = acounted_one, acounted_many
    try:
        thread_id = new_thread()
        out = asyncio.run(astart(graph, thread_id)) if use_async else start(graph, thread_id)
    finally:
        del ledger.transition, ledger.transition_many, ledger.atransition, ledger.atransition_many
    assert [m.status for m in tool_messages(out["messages"])] == ["success"] * 6
    assert log.applied("refund") == 6 and len({r["key"] for r in log.rows("refund")}) == 6
    recs = saver.ledger.effects(thread_id)
    assert {r.status for r in recs} == {EffectStatus.COMMITTED}
    for record in recs:  # intent before the dispatch, outcome after: the full trail of each
        trail = [(t.from_status, t.to_status) for t in saver.ledger.history(record.effect_id)]
        assert trail == [
            (None, EffectStatus.PLANNED),
            (EffectStatus.PLANNED, EffectStatus.DISPATCHED),
            (EffectStatus.DISPATCHED, EffectStatus.COMMITTED),
        ]
    assert sum(writes) == 12  # six intents, six outcomes, each written once
    assert len(writes) < 12, writes  # ... in fewer round trips than one per write


def _count_outcome_writes(ledger: Any) -> tuple[list[int], Any]:
    """Spy on ``ledger.transition_many``: the number of outcomes in each write."""
    writes: list[int] = []
    transition_many = ledger.transition_many

    atransition_many = ledger.atransition_many

    def note(requests: Any) -> None:
        outcomes = [r for r in requests if r.to is not EffectStatus.DISPATCHED]
        if outcomes:
            writes.append(len(outcomes))

    def counted(requests: Any) -> Any:
        note(requests)
        return transition_many(requests)

    async def acounted(requests: Any) -> Any:
        note(requests)
        return await atransition_many(requests)

    ledger.transition_many, ledger.atransition_many = counted, acounted

    def restore() -> None:
        del ledger.transition_many, ledger.atransition_many

    return writes, restore


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_outcomes_of_calls_finishing_together_share_one_write(
    saver: Any, log: ExecutionLog, use_async: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Six refunds dispatched together return a few milliseconds apart: the first
    # outcome waits for the others still in flight, and all six go in one write
    # (without the wait, the first was written alone and the rest in a chain).
    from langgraph_cancel.execution import group

    monkeypatch.setattr(group, "OUTCOME_LINGER", 30.0)
    barrier = threading.Barrier(6, timeout=20)

    def spread(item: str) -> None:
        barrier.wait()
        time.sleep(0.003 * int(item[1:]))

    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE, after=spread)
    model = scripted(calls(*((("refund", f"o{i}", f"c{i}")) for i in range(6))), "fin")
    graph = cancellable(
        agent_builder(model, EffectToolNode([refund], effect_concurrency=6), use_async=use_async),
        saver,
    )
    writes, restore = _count_outcome_writes(saver.ledger)
    try:
        thread_id = new_thread()
        out = asyncio.run(astart(graph, thread_id)) if use_async else start(graph, thread_id)
    finally:
        restore()
    assert [m.status for m in tool_messages(out["messages"])] == ["success"] * 6
    assert writes == [6]
    assert {r.status for r in saver.ledger.effects(thread_id)} == {EffectStatus.COMMITTED}


def test_an_outcome_waits_for_a_slow_sibling_only_so_long(
    saver: Any, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The quick refund's outcome is on disk while its slow sibling is still running:
    # the slow call returns only once the quick one reads committed in the ledger.
    from langgraph_cancel.execution import group

    monkeypatch.setattr(group, "OUTCOME_LINGER", 0.05)
    release = threading.Event()

    def slow(item: str) -> None:
        if item == "slow":
            assert release.wait(20), "the quick call's outcome was never written"

    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE, before=slow)
    model = scripted(calls(("refund", "quick", "c1"), ("refund", "slow", "c2")), "fin")
    graph = cancellable(agent_builder(model, EffectToolNode([refund], effect_concurrency=2)), saver)
    thread_id = new_thread()
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(start(graph, thread_id)))
    runner.start()
    try:
        wait_until(
            lambda: any(
                r.tool_call_id == "c1" and r.status is EffectStatus.COMMITTED
                for r in saver.ledger.effects(thread_id)
            ),
            timeout=20,
            what="the quick call's outcome",
        )
    finally:
        release.set()
        runner.join(30)
    assert [m.status for m in tool_messages(result["messages"])] == ["success"] * 2


def test_a_call_waiting_for_a_slot_is_not_held_back_by_a_lingering_outcome(
    saver: Any, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two at a time, three calls: c1 returns at once while c2 runs on until c3 has
    # run. c3 needs c1's slot, so c1's outcome must not wait for c2's (it would
    # wait for good here: OUTCOME_LINGER is 30 s).
    from langgraph_cancel.execution import group

    monkeypatch.setattr(group, "OUTCOME_LINGER", 30.0)
    third_ran = threading.Event()

    def before(item: str) -> None:
        if item == "o3":
            third_ran.set()
        elif item == "o2":
            assert third_ran.wait(20), "the third call never got a slot"

    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE, before=before)
    model = scripted(calls(*((("refund", f"o{i}", f"c{i}")) for i in (1, 2, 3))), "fin")
    graph = cancellable(agent_builder(model, EffectToolNode([refund], effect_concurrency=2)), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    assert [m.status for m in tool_messages(out["messages"])] == ["success"] * 3
    assert log.applied("refund") == 3


@pytest.mark.parametrize("node", ["ToolNode", "EffectToolNode"])
@pytest.mark.parametrize("kind", [EffectKind.READ_ONLY, EffectKind.IRREVERSIBLE])
def test_max_concurrency_bounds_the_calls_running_at_once(
    saver: Any, log: ExecutionLog, node: str, kind: EffectKind
) -> None:
    # As ToolNode does, the run's max_concurrency bounds how many calls run at once
    # (for side effects: below effect_concurrency). Five calls of 30 ms each.
    running = [0, 0]  # now, peak
    lock = threading.Lock()

    def enter(_item: str) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        time.sleep(0.03)
        with lock:
            running[0] -= 1

    work = counting_tool(log, "work", kind, before=enter)
    model = scripted(calls(*(("work", f"x{i}", f"c{i}") for i in range(5))), "fin")
    if node == "ToolNode":
        graph = agent_builder(model, ToolNode([work])).compile(checkpointer=saver)
    else:
        graph = cancellable(
            agent_builder(model, EffectToolNode([work], effect_concurrency=5)), saver
        )
    out = graph.invoke(
        {"messages": [HumanMessage("go")]}, {**config_for(new_thread()), "max_concurrency": 2}
    )
    assert [m.status for m in tool_messages(out["messages"])] == ["success"] * 5
    assert log.applied("work") == 5
    assert 1 <= running[1] <= 2


def test_reads_held_for_a_failed_ledger_lookup_never_run(saver: Any, log: ExecutionLog) -> None:
    # A sync graph hands its reads to the pool before asking the ledger about them;
    # when that lookup fails, no read runs and the run fails with the ledger's error.
    # The next invoke runs each read once.
    from langgraph_cancel.errors import TransientDatabaseError

    reads = [counting_tool(log, f"r{i}", EffectKind.READ_ONLY) for i in range(3)]
    model = scripted(calls(*((f"r{i}", f"x{i}", f"c{i}") for i in range(3))), "fin")
    graph = cancellable(agent_builder(model, EffectToolNode(reads)), saver)
    thread_id = new_thread()
    ledger = saver.ledger

    def lost(*_a: Any, **_k: Any) -> Any:
        raise TransientDatabaseError("connection lost (test)")

    ledger.find_effects = lost
    try:
        with pytest.raises(TransientDatabaseError):
            start(graph, thread_id)
    finally:
        del ledger.find_effects
    time.sleep(0.1)  # a held read that ran anyway would be in the log by now
    assert [log.attempts(f"r{i}") for i in range(3)] == [0, 0, 0]
    out = graph.invoke(None, config_for(thread_id))
    assert [m.status for m in tool_messages(out["messages"])] == ["success"] * 3
    assert [log.attempts(f"r{i}") for i in range(3)] == [1, 1, 1]
    assert {e.status for e in ledger.effects(thread_id)} == {EffectStatus.COMMITTED}


def test_the_same_call_twice_in_a_concurrent_batch_runs_once(saver: Any, log: ExecutionLog) -> None:
    # The same call twice in one batch is one step: it runs once and both copies get
    # its answer (they once asked for the same intent in the same write, refused as a
    # whole, and later the copy answered "Call is dispatched." while its twin ran).
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    turn = AIMessage(
        "",
        tool_calls=[
            tool_call("refund", {"item": "o1"}, id="c1"),
            tool_call("refund", {"item": "o1"}, id="c1"),  # the fake model would renumber it
            tool_call("refund", {"item": "o2"}, id="c2"),
        ],
    )

    def agent(state: MessagesState) -> dict[str, Any]:
        done = any(isinstance(m, ToolMessage) for m in state["messages"])
        return {"messages": [AIMessage("fin") if done else turn]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectToolNode([refund], effect_concurrency=3))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges(
        "agent", lambda s: "tools" if s["messages"][-1].tool_calls else END
    )
    builder.add_edge("tools", "agent")
    out = start(cancellable(builder, saver), new_thread())
    answers = tool_messages(out["messages"])
    assert [m.tool_call_id for m in answers] == ["c1", "c1", "c2"]
    assert [answers[0].status, answers[2].status] == ["success", "success"]
    assert answers[1].content == answers[0].content == "refund(o1) ok"
    assert answers[1].status == "success" and answers[1] is not answers[0]
    assert [r["item"] for r in log.rows("refund") if r["applied"]] in (["o1", "o2"], ["o2", "o1"])


def test_a_cancel_during_concurrent_side_effects_dispatches_nothing_after_it(
    saver: Any, log: ExecutionLog
) -> None:
    # Two at a time; the first refund asks the run to stop. The call in flight beside
    # it holds until the stop is durable (on SQLite, the request waits for the write
    # lock, and a neighbour that kept dispatching could take every turn before it).
    # The calls already in flight finish and are recorded; none is dispatched after
    # the cancel was seen, and the rest are reported as never run.
    thread_id = new_thread()
    stop_recorded = threading.Event()

    def stop(item: str) -> None:
        if item == "o0":
            saver.ledger.request_cancel(thread_id, reason="stop", requested_by="test")
            stop_recorded.set()

    def hold_until_stopped(item: str) -> None:
        if item != "o0":
            stop_recorded.wait(timeout=30)

    refund = counting_tool(
        log, "refund", EffectKind.IRREVERSIBLE, before=hold_until_stopped, after=stop
    )
    model = scripted(calls(*((("refund", f"o{i}", f"c{i}")) for i in range(6))), "fin")
    node = EffectToolNode([refund], effect_concurrency=2)
    graph = cancellable(agent_builder(model, node), saver)
    start(graph, thread_id)
    run = saver.ledger.latest_run(thread_id)
    assert run.status.value == "cancelled" and run.observed_at is not None
    recs = saver.ledger.effects(thread_id)
    dispatched = [r for r in recs if r.dispatched_at is not None]
    assert len(dispatched) == 2 and log.applied("refund") == len(dispatched)
    assert all(r.dispatched_at <= run.observed_at for r in dispatched)  # I1
    assert {r.status for r in recs} - {EffectStatus.COMMITTED, EffectStatus.DROPPED} == set()
    report = get_report(saver, thread_id)
    assert len(report.not_run) == 6 - len(dispatched)


# ----------------------------------------------------------------------------- tool errors


def test_tool_exceptions_become_error_messages(saver: Any, log: ExecutionLog) -> None:
    tools = [
        counting_tool(log, "bad_write", EffectKind.IRREVERSIBLE, fail=[KeyError("nope")]),
        counting_tool(log, "bad_read", EffectKind.READ_ONLY, fail=[ValueError("no rows")]),
        counting_tool(log, "ok", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(calls(("bad_write", "a", "e1"), ("bad_read", "b", "e2"), ("ok", "c", "e3")))
    graph = cancellable(agent_builder(model, EffectToolNode(tools, handle_tool_errors=True)), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    assert answers["e1"].status == "error" and "KeyError('nope')" in str(answers["e1"].content)
    assert answers["e2"].status == "error" and "ValueError('no rows')" in str(answers["e2"].content)
    assert answers["e3"].status == "success"
    assert out["messages"][-1].content == "done"
    eff = effects_by_tool(saver, thread_id)
    assert eff["bad_write"].status is EffectStatus.FAILED
    assert "nope" in (eff["bad_write"].error or "")
    assert eff["bad_read"].status is EffectStatus.FAILED
    # Permanent (non-transient) failures are not retried.
    assert log.attempts("bad_write") == 1 and log.attempts("bad_read") == 1


@pytest.mark.parametrize("failing", ["write", "read"])
def test_tool_exceptions_propagate_without_handling(
    saver: Any, log: ExecutionLog, failing: str
) -> None:
    kind = EffectKind.IRREVERSIBLE if failing == "write" else EffectKind.READ_ONLY
    tools = [counting_tool(log, "bad", kind, reconcile=False, fail=[KeyError("nope")])]
    model = scripted(calls(("bad", "a", "p1")))
    graph = cancellable(
        agent_builder(model, EffectToolNode(tools, handle_tool_errors=False)), saver
    )
    thread_id = new_thread()
    with pytest.raises(KeyError, match="nope"):
        start(graph, thread_id)
    assert log.attempts("bad") == 1
    rec = saver.ledger.find_effect(thread_id, "p1")
    if failing == "write":
        # The call raised: nothing applied, and the ledger says so (not left "dispatched").
        assert rec is not None
        assert rec.status is EffectStatus.NOT_APPLIED
        assert "nope" in (rec.error or "")


def test_an_unhandled_read_error_keeps_its_siblings_outcomes(saver: Any, log: ExecutionLog) -> None:
    # One read raises what handle_tool_errors does not cover: the node raises it, and
    # the reads of the batch that did answer are still recorded.
    tools = [
        counting_tool(log, "bad_read", EffectKind.READ_ONLY, fail=[KeyError("nope")]),
        counting_tool(log, "good_read", EffectKind.READ_ONLY),
    ]
    model = scripted(calls(("bad_read", "a", "u1"), ("good_read", "b", "u2")))
    graph = cancellable(
        agent_builder(model, EffectToolNode(tools, handle_tool_errors=ValueError)), saver
    )
    thread_id = new_thread()
    with pytest.raises(KeyError, match="nope"):
        start(graph, thread_id)
    good = saver.ledger.find_effect(thread_id, "u2")
    assert good is not None and good.status is EffectStatus.COMMITTED
    assert saver.ledger.find_effect(thread_id, "u1") is None  # a re-run runs it again


# ----------------------------------------------------------------------------- transient faults


def test_transient_errors_retried_only_when_safe(saver: Any, log: ExecutionLog) -> None:
    tools = [
        counting_tool(
            log,
            "flaky_read",
            EffectKind.READ_ONLY,
            fail=[ConnectionError("reset"), TimeoutError("slow")],
        ),
        counting_tool(
            log,
            "safe_write",
            EffectKind.IRREVERSIBLE,
            retry_safe=True,
            fail=[ConnectionError("reset")],
        ),
        counting_tool(
            log,
            "unsafe_write",
            EffectKind.IRREVERSIBLE,
            fail=[ConnectionError("reset")],
        ),
        counting_tool(
            log,
            "hopeless_read",
            EffectKind.READ_ONLY,
            max_attempts=2,
            fail=[ConnectionError("a"), ConnectionError("b"), ConnectionError("c")],
        ),
        counting_tool(log, "broken_read", EffectKind.READ_ONLY, fail=[ValueError("bug")]),
    ]
    model = scripted(
        calls(
            ("flaky_read", "a", "f1"),
            ("safe_write", "b", "f2"),
            ("unsafe_write", "c", "f3"),
            ("hopeless_read", "d", "f4"),
            ("broken_read", "e", "f5"),
        )
    )
    graph = cancellable(agent_builder(model, EffectToolNode(tools, handle_tool_errors=True)), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    # read-only: retried with backoff until it works
    assert log.attempts("flaky_read") == 3 and answers["f1"].status == "success"
    # retry-safe side effect: retried with the same key
    assert log.attempts("safe_write") == 2 and answers["f2"].status == "success"
    keys = {r["key"] for r in log.rows("safe_write")}
    assert len(keys) == 1
    # not retry-safe: one attempt only; reconcile finds nothing applied
    assert log.attempts("unsafe_write") == 1 and answers["f3"].status == "error"
    # max_attempts bounds the retries; permanent errors are never retried
    assert log.attempts("hopeless_read") == 2 and answers["f4"].status == "error"
    assert log.attempts("broken_read") == 1 and answers["f5"].status == "error"
    eff = effects_by_tool(saver, thread_id)
    assert eff["safe_write"].status is EffectStatus.COMMITTED
    assert eff["unsafe_write"].status is EffectStatus.NOT_APPLIED
    assert log.applied("unsafe_write") == 0


@pytest.mark.parametrize("hook", [True, False], ids=["reconcile", "no-hook"])
def test_ambiguous_failure_on_side_effect(saver: Any, providers_path: str, hook: bool) -> None:
    """fail_after: the provider applied the refund, then the response was lost."""
    systems = Providers(providers_path)
    extra: dict[str, Any] = {"reconcile": refund_tools.reconcile_refund} if hook else {}
    refund = effect(
        EffectKind.IRREVERSIBLE,
        refund_tools.issue_refund,
        idempotency_key=refund_tools.refund_key,
        requires_approval=False,
        **extra,
    )  # not retry_safe: the ambiguity must be settled by asking, not by retrying
    systems.set_fault("refund", "fail_after", times=1)
    amount = 10 if hook else 11  # refund keys are global in the module's ledger
    model = scripted(
        AIMessage(
            "",
            tool_calls=[tool_call("issue_refund", {"order_id": "o-91", "amount": amount}, id="a1")],
        ),
        "fin",
    )
    graph = cancellable(agent_builder(model, EffectToolNode([refund])), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    key = refund_tools.refund_key({"order_id": "o-91", "amount": amount})
    assert systems.attempts(key) == 1  # never retried
    assert systems.executions(key) == 1  # the world did refund
    rec = saver.ledger.find_effect(thread_id, "a1")
    answer = tool_messages(out["messages"])[0]
    if hook:
        assert rec.status is EffectStatus.COMMITTED
        assert answer.status == "success"
        found = systems.find_refund(key)
        assert found is not None and found["refund_id"] in str(answer.content)
    else:
        assert rec.status is EffectStatus.UNKNOWN
        assert rec.owner and rec.next_action
        assert answer.status == "error" and "unknown" in str(answer.content).lower()
    assert out["messages"][-1].content == "fin"


def test_a_refund_found_not_applied_runs_when_the_model_asks_again(
    saver: Any, providers_path: str
) -> None:
    # The request failed before reaching the provider; its reconcile hook says so.
    # The model asks again (a new call, the same declared key): the refund runs, once.
    systems = Providers(providers_path)
    refund = effect(
        EffectKind.IRREVERSIBLE,
        refund_tools.issue_refund,
        idempotency_key=refund_tools.refund_key,
        reconcile=refund_tools.reconcile_refund,
        requires_approval=False,
    )
    systems.set_fault("refund", "fail_before", times=1)
    args = {"order_id": "o-93", "amount": 12}  # refund keys are global in the module's ledger
    model = scripted(
        AIMessage("", tool_calls=[tool_call("issue_refund", args, id="n1")]),
        AIMessage("", tool_calls=[tool_call("issue_refund", args, id="n2")]),
        "fin",
    )
    graph = cancellable(
        agent_builder(model, EffectToolNode([refund], handle_tool_errors=True)), saver
    )
    thread_id = new_thread()
    out = start(graph, thread_id)
    key = refund_tools.refund_key(args)
    assert systems.attempts(key) == 2 and systems.executions(key) == 1
    first, second = tool_messages(out["messages"])
    assert first.status == "error" and second.status == "success"
    assert saver.ledger.find_effect(thread_id, "n1").status is EffectStatus.DROPPED
    again = saver.ledger.find_effect(thread_id, "n2")
    assert again.status is EffectStatus.COMMITTED and again.idempotency_key == key
    assert out["messages"][-1].content == "fin"


# ----------------------------------------------------------------------------- re-run safety


def test_node_rerun_by_interrupt_replays_committed_calls(saver: Any, log: ExecutionLog) -> None:
    """A node that runs the tool batch and then interrupts is re-run whole on resume."""
    tools = [
        counting_tool(log, "w", EffectKind.REVERSIBLE),
        counting_tool(log, "x", EffectKind.IRREVERSIBLE),
        counting_tool(log, "r", EffectKind.READ_ONLY),
    ]
    effect_node = EffectToolNode(tools)
    seen: list[list[str]] = []

    def tools_then_confirm(state: MessagesState, config: RunnableConfig) -> Any:
        out = effect_node.invoke(state, config)
        seen.append([str(m.content) for m in out["messages"]])
        answer = interrupt({"confirm": seen[-1]})
        assert answer == "yes"
        return out

    model = scripted(calls(("w", "a", "i1"), ("x", "b", "i2"), ("r", "c", "i3")), "fin")
    graph = cancellable(agent_builder(model, tools_then_confirm), saver)
    thread_id = new_thread()
    cfg = config_for(thread_id)
    first = start(graph, thread_id)
    assert first["__interrupt__"]
    assert log.attempts("w") == 1 and log.attempts("x") == 1
    out = graph.invoke(Command(resume="yes"), cfg)
    # The node ran twice; the effects ran once, and the re-run got the recorded answers.
    assert len(seen) == 2 and seen[0] == seen[1]
    assert log.attempts("w") == 1 and log.attempts("x") == 1
    assert log.attempts("r") == 1  # read results are recorded and replayed too
    assert [m.content for m in tool_messages(out["messages"])] == ["w(a) ok", "x(b) ok", "r(c) ok"]
    assert out["messages"][-1].content == "fin"
    assert all(e.status is EffectStatus.COMMITTED for e in saver.ledger.effects(thread_id))
    assert_no_duplicate_keys(saver, thread_id)


def test_tool_that_interrupts_gets_its_answer_and_siblings_run_once(
    saver: Any, log: ExecutionLog
) -> None:
    """interrupt() inside a tool (LangGraph's HITL-in-tool pattern) re-runs the whole batch."""
    tool_w = counting_tool(log, "w", EffectKind.REVERSIBLE)

    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def confirm(item: str) -> str:
        """Ask a person to confirm an item."""
        answer = interrupt({"confirm": item})
        seq = log.start("confirm", idempotency_key(), item)
        log.apply(seq)
        return f"person said {answer}"

    model = scripted(calls(("w", "a", "h1"), ("confirm", "b", "h2")), "fin")
    graph = cancellable(agent_builder(model, EffectToolNode([tool_w, confirm])), saver)
    thread_id = new_thread()
    first = start(graph, thread_id)
    assert first["__interrupt__"][0].value == {"confirm": "b"}
    out = graph.invoke(Command(resume="yes"), config_for(thread_id))
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    assert answers["h1"].content == "w(a) ok"
    assert answers["h2"].content == "person said yes" and answers["h2"].status == "success"
    assert log.attempts("w") == 1 and log.applied("confirm") == 1
    eff = effects_by_tool(saver, thread_id)
    assert eff["confirm"].status is EffectStatus.COMMITTED
    assert eff["w"].status is EffectStatus.COMMITTED


@pytest.mark.parametrize("hook", [True, False], ids=["reconcile", "no-hook"])
def test_node_rerun_by_retry_policy(saver: Any, log: ExecutionLog, hook: bool) -> None:
    """RetryPolicy re-runs the node after a failure that follows a committed sibling."""
    tools = [
        counting_tool(log, "first", EffectKind.REVERSIBLE),
        counting_tool(
            log, "second", EffectKind.IRREVERSIBLE, reconcile=hook, fail=[RuntimeError("flaky")]
        ),
    ]
    model = scripted(calls(("first", "a", "y1"), ("second", "b", "y2")), "fin")
    builder = agent_builder(
        model,
        EffectToolNode(tools, handle_tool_errors=False),
        retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01, retry_on=RuntimeError),
    )
    graph = cancellable(builder, saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    assert out["messages"][-1].content == "fin"
    # The committed sibling was not dispatched again.
    assert log.attempts("first") == 1 and log.applied("first") == 1
    # The failed call: known not applied, so the retry made one fresh attempt; applied once.
    assert log.attempts("second") == 2 and log.applied("second") == 1
    keys = {r["key"] for r in log.rows("second")}
    assert len(keys) == 1
    eff = effects_by_tool(saver, thread_id)
    assert eff["first"].status is EffectStatus.COMMITTED
    assert eff["second"].status is EffectStatus.COMMITTED
    statuses = [h.to_status for h in saver.ledger.history(eff["second"].effect_id)]
    assert statuses.count(EffectStatus.DISPATCHED) == 2
    assert EffectStatus.NOT_APPLIED in statuses
    assert_no_duplicate_keys(saver, thread_id)


@pytest.fixture(scope="module", params=backend_params(durable_only=True))
def durable_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """SQLite and PostgreSQL only: what survives the death of a process."""
    with module_database(request) as url:
        yield url


@pytest.mark.slow
def test_kill9_mid_batch_then_resume_in_new_process(
    durable_url: str, providers_path: str, log: ExecutionLog
) -> None:
    """SIGKILL while the second of three side effects is in flight; resume elsewhere.

    One worker runs two threads of the same agent; its ``charge`` call is held
    before the effect on one thread and after it on the other (applied, not yet
    recorded) when the worker is killed.
    """
    systems = Providers(providers_path)
    base = new_thread()
    phases = {"before": f"{base}-b", "after": f"{base}-a"}
    worker = f"worker-{base}"
    with open_saver(durable_url):  # the schema exists before the worker starts
        pass
    for phase in phases:
        log.arm(f"charge_{phase}", phase)
    runs = [f"{thread_id}:charge_{phase}" for phase, thread_id in phases.items()]
    proc = subprocess.Popen(
        worker_command("kill", durable_url, providers_path, runs, worker),
        env=worker_env(providers_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def both_in_flight() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited early: {proc.communicate()[1][-3000:]}")
            held_before = log.rows("charge_before")
            held_after = log.rows("charge_after")
            return bool(held_before) and bool(held_after) and held_after[0]["applied"] is not None

        wait_until(both_in_flight, timeout=90, what="the worker to be inside both charges")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]

    with open_saver(durable_url) as saver:
        ledger = saver.ledger
        for phase, thread_id in phases.items():
            # What the dead worker left: update committed, charge in flight, the email
            # planned with its batch but never dispatched.
            assert ledger.find_effect(thread_id, "k1").status is EffectStatus.COMMITTED
            assert ledger.find_effect(thread_id, "k2").status is EffectStatus.DISPATCHED
            email = ledger.find_effect(thread_id, "k3")
            assert email is not None and email.status is EffectStatus.PLANNED
            assert email.dispatched_at is None
            assert systems.attempts(derive_idempotency_key(thread_id, "k3")) == 0
            assert log.applied(f"charge_{phase}") == (1 if phase == "after" else 0)
            log.release(f"charge_{phase}", phase)

        for phase, thread_id in phases.items():
            charge = f"charge_{phase}"
            graph, _model = kill_graph(saver, log, charge)
            out = graph.invoke(None, config_for(thread_id, worker=worker))
            assert out["messages"][-1].content == "done"
            assert not dangling_calls(out["messages"])
            # Provider truth: every key applied exactly once, and requested once.
            for call_id in ("k1", "k3"):
                key = derive_idempotency_key(thread_id, call_id)
                assert systems.executions(key) == 1 and systems.attempts(key) == 1, call_id
            assert log.applied(charge) == 1
            # Killed before applying: one fresh attempt after reconcile said not applied.
            # Killed after applying: reconcile found it committed; no second attempt.
            assert log.attempts(charge) == (2 if phase == "before" else 1)
            effects = ledger.effects(thread_id)
            assert [e.tool_call_id for e in effects] == ["k1", "k2", "k3"]
            assert all(e.status is EffectStatus.COMMITTED for e in effects)
            assert_no_duplicate_keys(saver, thread_id)
            assert len(ledger.runs(thread_id)) == 1
            assert ledger.latest_run(thread_id).status.value == "completed"


# ----------------------------------------------------------------------------- guards and keys


def test_durability_exit_is_refused(saver: Any, log: ExecutionLog) -> None:
    tool_w = counting_tool(log, "w", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("w", "a", "d1")), "fin")
    graph = cancellable(agent_builder(model, EffectToolNode([tool_w])), saver)
    thread_id = new_thread()
    with pytest.raises(DurabilityError, match="exit"):
        start(graph, thread_id, durability="exit")
    # Refused when the graph starts: no model call, no dispatch, no run.
    assert model.calls == 0 and log.attempts("w") == 0
    assert saver.ledger.latest_run(thread_id) is None
    with pytest.raises(DurabilityError):
        asyncio.run(
            graph.ainvoke(
                {"messages": [HumanMessage("go")]}, config_for(thread_id), durability="exit"
            )
        )
    assert model.calls == 0
    # A tool node used without add_cancellation refuses too, before dispatching anything.
    plain = agent_builder(scripted(calls(("w", "a", "d2"))), EffectToolNode([tool_w]))
    with pytest.raises(DurabilityError):
        start(plain.compile(checkpointer=saver), new_thread(), durability="exit")
    assert log.attempts("w") == 0
    # The other modes run.
    out = start(graph, new_thread(), durability="sync")
    assert out["messages"][-1].content == "fin"


def test_idempotency_key_inside_tool_matches_ledger(
    saver: Any, log: ExecutionLog, providers_path: str
) -> None:
    seen: list[str] = []
    tool_w = counting_tool(log, "w", EffectKind.IRREVERSIBLE, seen_keys=seen)
    tool_u = counting_tool(log, "u", EffectKind.REVERSIBLE, seen_keys=seen)
    model = scripted(
        AIMessage(
            "",
            tool_calls=[
                tool_call("w", {"item": "a"}, id="q1"),
                tool_call("u", {"item": "b"}, id="q2"),
                tool_call("issue_refund", {"order_id": "o-93", "amount": 5}, id="q3"),
            ],
        ),
        "fin",
    )
    graph = cancellable(
        agent_builder(model, EffectToolNode([tool_w, tool_u, refund_tools.issue_refund])), saver
    )
    thread_id = new_thread()
    start(graph, thread_id)
    ledger = saver.ledger
    w_rec, u_rec = ledger.find_effect(thread_id, "q1"), ledger.find_effect(thread_id, "q2")
    # Default keys: derived from thread and tool-call id; the tool saw the ledger's key.
    assert seen == [u_rec.idempotency_key, w_rec.idempotency_key]
    assert w_rec.idempotency_key == derive_idempotency_key(thread_id, "q1")
    assert [r["key"] for r in log.rows("w")] == [w_rec.idempotency_key]
    # A declared key function: the provider received exactly the ledger's key.
    refund = ledger.find_effect(thread_id, "q3")
    assert refund.idempotency_key == "refund:o-93:5.00"
    systems = Providers(providers_path)
    assert systems.executions("refund:o-93:5.00") == 1
    # Outside a dispatched call there is no key.
    with pytest.raises(RuntimeError, match="only available inside"):
        idempotency_key()


@pytest.mark.parametrize("use_async", [False, True])
def test_a_tool_a_wrapper_serves_runs_as_classified_by_name(use_async: bool) -> None:
    """``effects=`` classifies by name what a ``wrap_tool_call`` serves: it runs, and a
    name it does not give still waits for approval."""
    ran: list[str] = []

    @tool
    def weather(city: str) -> str:
        """The weather in a city (served by the wrapper, not given to the node)."""
        ran.append(city)
        return f"sunny in {city}"

    @tool
    def wire(amount: int) -> str:
        """Wire money (served by the wrapper, not classified)."""
        ran.append(f"wire {amount}")
        return "wired"

    served = {"weather": weather, "wire": wire}

    def serve(request: Any, execute: Any) -> Any:
        return execute(request.override(tool=served[request.tool_call["name"]]))

    async def aserve(request: Any, execute: Any) -> Any:
        return await execute(request.override(tool=served[request.tool_call["name"]]))

    node = EffectToolNode(
        [],
        wrap_tool_call=serve,
        awrap_tool_call=aserve,
        effects={"weather": effect(EffectKind.READ_ONLY)},
    )
    graph = (
        StateGraph(MessagesState)
        .add_node("tools", node)
        .add_edge(START, "tools")
        .compile(checkpointer=InMemorySaver())
    )

    def run(call: Any, thread: str) -> Any:
        message: Any = {"messages": [AIMessage("", tool_calls=[call])]}
        config = config_for(thread)
        if use_async:
            return asyncio.run(graph.ainvoke(message, config))
        return graph.invoke(message, config)

    out = run(tool_call("weather", {"city": "Oslo"}, id="c-weather"), new_thread())
    assert out["messages"][-1].content == "sunny in Oslo"
    assert "__interrupt__" not in out
    out = run(tool_call("wire", {"amount": 5}, id="c-wire"), new_thread())
    assert out["__interrupt__"][0].value["effect_kind"] == "irreversible"
    assert ran == ["Oslo"]

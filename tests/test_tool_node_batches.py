"""EffectToolNode's batches: reads first and together, then side effects, reversible first.

Reads run concurrently before any side effect, and the answers keep the model's order
whatever the order of execution. With ``effect_concurrency`` side effects overlap, and
their intents and outcomes share ledger writes; ``max_concurrency`` bounds the calls
running at once. A failed ledger lookup runs no read, a call repeated in its batch runs
once, and a cancel mid-batch dispatches nothing after it. Same graphs and backends as
``test_tool_node``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from graphs import (
    ExecutionLog,
    agent_builder,
    calls,
    cancellable,
    config_for,
    counting_tool,
    new_thread,
    scripted,
    wait_until,
)
from langgraph_cancel import EffectKind, EffectStatus, EffectToolNode, get_report
from langgraph_cancel.testing import tool_call
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)
from tool_node_helpers import astart, effects_by_tool, start, tool_messages


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
    # one is dispatched once under its own intent, the six intents travel with the
    # batch's plan, and the outcomes in a few shared writes instead of one each.
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

    begun: list[int] = []
    plan, aplan = ledger.plan_many_and_begin, ledger.aplan_many_and_begin

    def counted_plan(**kwargs: Any) -> Any:
        entries, records = plan(**kwargs)
        begun.append(len(records))
        return entries, records

    async def acounted_plan(**kwargs: Any) -> Any:
        entries, records = await aplan(**kwargs)
        begun.append(len(records))
        return entries, records

    ledger.transition, ledger.transition_many = counted_one, counted_many
    ledger.atransition, ledger.atransition_many = acounted_one, acounted_many
    ledger.plan_many_and_begin, ledger.aplan_many_and_begin = counted_plan, acounted_plan
    try:
        thread_id = new_thread()
        out = asyncio.run(astart(graph, thread_id)) if use_async else start(graph, thread_id)
    finally:
        del ledger.transition, ledger.transition_many, ledger.atransition, ledger.atransition_many
        del ledger.plan_many_and_begin, ledger.aplan_many_and_begin
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
    assert begun == [6]  # the six intents in the plan's one write
    assert sum(writes) == 6  # six outcomes, each written once
    assert len(writes) < 6, writes  # ... in fewer round trips than one per outcome


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

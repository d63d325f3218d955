"""The cancellation protocol: the seed scenario, and the stop pressed at every moment.

Real compiled graphs on memory, SQLite and PostgreSQL; the stop button is
pressed from another thread while the run works (before a call, during a read,
a write, a compensation; a hundred times at once), and what the run did is
checked against what the external systems did. Where else the stop reaches (a
second process, the queued Send tasks, every node and every dispatch) is
checked in ``test_cancel_boundaries.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from cancel_helpers import (
    TIMEOUT,
    state_report,
    url_ledgers_fixture,  # noqa: F401 (a fixture, found by name)
)
from graphs import (
    ExecutionLog,
    agent_builder,
    calls,
    cancellable,
    collect_custom,
    config_for,
    counting_tool,
    dangling_calls,
    new_thread,
    open_saver,
    progress_events,
    scripted,
    wait_until,
)
from langgraph_cancel import (
    CancellationReport,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    UnknownThreadError,
    add_cancellation,
    get_report,
    request_cancel,
)
from langgraph_cancel.demo import tools as refund_tools
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.execution.answers import ABANDONED_READ
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.testing import tool_call
from langgraph_cancel.types import RunStatus
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)


class Background:
    """Run a graph invocation in a thread; join it with a timeout, re-raising its error."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._result: list[Any] = []
        self._error: list[BaseException] = []

        def target() -> None:
            try:
                self._result.append(fn())
            except BaseException as exc:  # handed to the test thread
                self._error.append(exc)

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def wait_for(self, predicate: Callable[[], Any], what: str) -> Any:
        """Poll ``predicate`` while the run works; fail at once if the run ends first."""

        def check() -> Any:
            value = predicate()
            if not value and not self._thread.is_alive():
                error = self._error[0] if self._error else None
                raise AssertionError(f"the run ended before {what}: {error!r}") from error
            return value

        return wait_until(check, timeout=TIMEOUT, what=what)

    def finished_within(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def result(self, timeout: float = TIMEOUT) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the run did not finish within {timeout}s"
        if self._error:
            raise self._error[0]
        return self._result[0]


def cancelled_events(events: list[Any]) -> list[dict[str, Any]]:
    return [
        e["langgraph_cancel"]
        for e in events
        if isinstance(e, dict) and e.get("langgraph_cancel", {}).get("event") == "cancelled"
    ]


def assert_report_from_database(
    saver: Any, db_url: str, thread_id: str, expected: Any, url_ledgers: list[str]
) -> None:
    """get_report from the saver, from the URL and from a fresh connection equals ``expected``."""
    assert get_report(saver, thread_id) == expected
    if not db_url.startswith("memory://"):
        url_ledgers.append(db_url)
        assert get_report(db_url, thread_id) == expected
        with Ledger.from_url(db_url) as fresh:
            assert get_report(fresh, thread_id) == expected


def summary_of(effects: list[Any]) -> list[tuple[str, str]]:
    return sorted((e.tool, json.dumps(e.args, sort_keys=True)) for e in effects)


# ----------------------------------------------------------------------------- the seed


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_seed_scenario(
    saver: Any, db_url: str, providers_path: str, use_async: bool, url_ledgers: list[str]
) -> None:
    """Refund and two emails done; update_order(o-88) in flight; four calls queued; stop."""
    systems = Providers(providers_path)
    amount = 41 if use_async else 40  # refund keys are global in the module's ledger
    email = {"to": "dana@example.com", "subject": "Refund", "body": f"We refunded {amount}."}
    turn1 = AIMessage(
        "",
        tool_calls=[
            tool_call("issue_refund", {"order_id": "o-88", "amount": amount}, id="s1"),
            tool_call("send_email", email, id="s2"),
            tool_call("send_email", {**email, "subject": "Receipt"}, id="s3"),
        ],
    )
    queued = {
        "s5": tool_call(
            "create_ticket", {"order_id": "o-88", "subject": "Damaged", "body": "Check."}, id="s5"
        ),
        "s6": tool_call("send_email", {**email, "subject": "Order updated"}, id="s6"),
        "s7": tool_call("issue_refund", {"order_id": "o-91", "amount": amount - 30}, id="s7"),
        "s8": tool_call("send_email", {**email, "to": "sam@example.com"}, id="s8"),
    }
    turn2 = AIMessage(
        "",
        tool_calls=[
            tool_call("update_order", {"order_id": "o-88", "status": "refunded"}, id="s4"),
            *queued.values(),
        ],
    )
    model = scripted(turn1, turn2, "Stopped as you asked; here is where things stand.")
    graph = cancellable(agent_builder(model, EffectToolNode(refund_tools.TOOLS)), saver)
    thread_id = new_thread()
    cfg = config_for(thread_id)
    systems.set_fault("update_order", "hang:2", times=1)
    run = Background(
        lambda: collect_custom(
            graph, {"messages": [HumanMessage("refund o-88")]}, cfg, use_async=use_async
        )
    )

    ledger = saver.ledger

    def update_in_flight() -> Any:
        rec = ledger.find_effect(thread_id, "s4")
        return rec is not None and rec.status is EffectStatus.DISPATCHED and rec

    update = run.wait_for(update_in_flight, "update_order in flight")
    run.wait_for(lambda: systems.pending(update.idempotency_key), "the provider to hold it")
    answer = request_cancel(saver, thread_id, reason="user pressed stop", requested_by="alice")
    assert answer.accepted and answer.first
    # The stop was pressed while o-88 was really in flight at the provider.
    assert systems.pending(update.idempotency_key)
    events = run.result()

    # --- the world: exactly the refund, two emails and the o-88 update happened
    truth = systems.truth()
    assert [(r["order_id"], r["amount"]) for r in truth["refunds"]] == [("o-88", amount)]
    assert sorted(e["subject"] for e in truth["emails"]) == ["Receipt", "Refund"]
    assert [u["order_id"] for u in truth["updates"]] == ["o-88"]
    assert truth["tickets"] == [] and truth["messages"] == []
    assert truth["orders"]["o-88"]["status"] == "refunded"

    # --- the ledger: four calls dropped and never attempted; o-88 awaited and committed
    for call_id in queued:
        rec = ledger.find_effect(thread_id, call_id)
        assert rec is not None and rec.status is EffectStatus.DROPPED, call_id
        assert rec.dispatched_at is None
        assert systems.attempts(rec.idempotency_key) == 0
    assert ledger.find_effect(thread_id, "s4").status is EffectStatus.COMMITTED
    run_rec = ledger.latest_run(thread_id)
    assert run_rec.status is RunStatus.CANCELLED
    assert run_rec.reason == "user pressed stop" and run_rec.requested_by == "alice"

    # --- the report
    report = state_report(graph, thread_id)
    assert report.status == "cancelled"
    assert summary_of(report.permanent) == sorted(
        (t, json.dumps(a, sort_keys=True))
        for t, a in [
            ("issue_refund", {"order_id": "o-88", "amount": amount}),
            ("send_email", email),
            ("send_email", {**email, "subject": "Receipt"}),
        ]
    )
    assert report.unknown == []
    assert [e.tool_call_id for e in report.reversible_committed] == ["s4"]
    assert sorted(e.tool_call_id for e in report.not_run) == sorted(queued)
    assert report.dispatched_after_cancel == 0
    assert report.orphans == 0
    assert report.reason == "user pressed stop"
    assert report.cancel_latency_ms is not None and report.quiescence_ms is not None
    assert report.quiescence_ms >= report.cancel_latency_ms
    assert "4 steps not run" in report.summary
    assert_report_from_database(saver, db_url, thread_id, report, url_ledgers)
    # streamed as a custom event, once
    streamed = cancelled_events(events)
    assert len(streamed) == 1
    assert CancellationReport.model_validate(streamed[0]["report"]) == report
    # ... after each step of the stop, in order
    progress = progress_events(events)
    assert [(p.event.value, p.effect and p.effect.tool_call_id) for p in progress[:4]] == [
        ("requested", None),
        ("observed", None),
        ("waiting", "s4"),
        ("settled", "s4"),
    ]
    assert progress[0].reason == "user pressed stop" and progress[0].requested_by == "alice"
    assert progress[2].grace_s is not None and progress[2].effect is not None
    assert progress[2].effect.dispatched_at == ledger.find_effect(thread_id, "s4").dispatched_at
    assert progress[3].effect is not None and progress[3].effect.status is EffectStatus.COMMITTED
    dropped = progress[4:-1]
    assert [p.event.value for p in dropped] == ["dropped"] * len(queued)
    assert sorted(p.effect.tool_call_id for p in dropped if p.effect) == sorted(queued)
    assert progress[-1].event.value == "cancelled"
    assert {p.run_id for p in progress} == {run_rec.run_id}

    # --- every call in the history is answered; the next model call works
    messages = graph.get_state(cfg).values["messages"]
    assert dangling_calls(messages) == []
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    assert answers["s4"].status == "success" and "o-88" in str(answers["s4"].content)
    assert all(answers[c].status == "error" for c in queued)
    calls_before = model.calls
    out = graph.invoke({"messages": [HumanMessage("what happened?")]}, cfg)
    assert model.calls == calls_before + 1
    assert out["messages"][-1].content == "Stopped as you asked; here is where things stand."
    assert dangling_calls(model.inputs[-1]) == []
    assert ledger.latest_run(thread_id).status is RunStatus.COMPLETED
    # The cancelled run's report stays as it was.
    assert get_report(saver, thread_id, run_id=run_rec.run_id) == report


# ----------------------------------------------------------------------------- races


def test_cancel_before_a_call(saver: Any, log: ExecutionLog) -> None:
    """Stop pressed while the run waits before its tools: nothing is ever dispatched."""
    tools = [
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE),
        counting_tool(log, "u1", EffectKind.REVERSIBLE),
        counting_tool(log, "r1", EffectKind.READ_ONLY),
    ]
    model = scripted(calls(("w1", "a", "b1"), ("u1", "b", "b2"), ("r1", "c", "b3")), "after")
    builder = agent_builder(model, EffectToolNode(tools))
    graph = add_cancellation(builder).compile(checkpointer=saver, interrupt_before=["tools"])
    thread_id = new_thread()
    cfg = config_for(thread_id)
    graph.invoke({"messages": [HumanMessage("go")]}, cfg)
    assert graph.get_state(cfg).next == ("tools",)
    answer = request_cancel(saver, thread_id, reason="changed my mind", requested_by="bob")
    assert answer.accepted and answer.first
    graph.invoke(None, cfg)  # whoever resumes it must not start the calls
    assert log.rows() == []
    ledger = saver.ledger
    assert {e.tool_call_id: e.status for e in ledger.effects(thread_id)} == {
        "b1": EffectStatus.DROPPED,
        "b2": EffectStatus.DROPPED,
        "b3": EffectStatus.DROPPED,
    }
    report = state_report(graph, thread_id)
    assert report.status == "cancelled"
    assert report.permanent == [] and report.unknown == []
    # Every call is accounted for: the dropped read is "not run" too.
    assert sorted(e.tool_call_id for e in report.not_run) == ["b1", "b2", "b3"]
    assert report.dispatched_after_cancel == 0
    assert dangling_calls(graph.get_state(cfg).values["messages"]) == []
    assert graph.get_state(cfg).next == ()
    # A second resume of the cancelled run starts nothing either.
    graph.invoke(None, cfg)
    assert log.rows() == []


def test_cancel_during_a_read(saver: Any, log: ExecutionLog) -> None:
    tools = [
        counting_tool(log, "slow_read", EffectKind.READ_ONLY),
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE),
        counting_tool(log, "u1", EffectKind.REVERSIBLE),
    ]
    model = scripted(calls(("w1", "a", "d1"), ("slow_read", "b", "d2"), ("u1", "c", "d3")))
    graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
    thread_id = new_thread()
    log.arm("slow_read")
    run = Background(
        lambda: graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    )
    run.wait_for(lambda: log.started("slow_read"), "the read to start")
    assert request_cancel(saver, thread_id, reason="stop", requested_by="t").first
    log.release("slow_read")
    run.result()
    assert log.attempts("w1") == 0 and log.attempts("u1") == 0
    ledger = saver.ledger
    assert ledger.find_effect(thread_id, "d1").status is EffectStatus.DROPPED
    assert ledger.find_effect(thread_id, "d3").status is EffectStatus.DROPPED
    report = state_report(graph, thread_id)
    assert report.status == "cancelled"
    assert sorted(e.tool_call_id for e in report.not_run) == ["d1", "d3"]
    assert report.permanent == [] and report.reversible_committed == [] and report.unknown == []
    assert report.dispatched_after_cancel == 0
    assert dangling_calls(graph.get_state(config_for(thread_id)).values["messages"]) == []


def test_in_flight_read_is_abandoned_on_cancel(log: ExecutionLog) -> None:
    tools = [
        counting_tool(log, "hung_read", EffectKind.READ_ONLY),
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(calls(("hung_read", "a", "g1"), ("w1", "b", "g2")))
    with open_saver("memory://") as memory:
        graph = cancellable(
            agent_builder(model, EffectToolNode(tools, cancel_timeout=0.5)),
            memory,
            cancel_timeout=0.5,
        )
        thread_id = new_thread()
        log.arm("hung_read")
        run = Background(
            lambda: graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
        )
        try:
            run.wait_for(lambda: log.started("hung_read"), "the read to start")
            request_cancel(memory, thread_id, reason="stop", requested_by="t")
            finished = run.finished_within(3.0)
        finally:
            log.release("hung_read")
            run.result()
        assert finished, "the cancel waited for an abandoned read"
        assert log.attempts("w1") == 0
        abandoned = memory.ledger.find_effect(thread_id, "g1")
        assert abandoned is not None and abandoned.status is EffectStatus.FAILED
        assert abandoned.error == ABANDONED_READ


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_side_effect_outliving_its_grace_is_unknown_then_settles_late(
    log: ExecutionLog, use_async: bool
) -> None:
    # The stop waits cancel_timeout for the call in flight, then records it unknown
    # (with an owner) and returns; when the call finishes later, its outcome is kept.
    tools = [counting_tool(log, "slow_write", EffectKind.IRREVERSIBLE, reconcile=False)]
    model = scripted(calls(("slow_write", "a", "s1")))
    with open_saver("memory://") as memory:
        graph = cancellable(
            agent_builder(model, EffectToolNode(tools, cancel_timeout=0.3)),
            memory,
            cancel_timeout=0.3,
        )
        thread_id = new_thread()
        inp = {"messages": [HumanMessage("go")]}
        returned = threading.Event()

        async def ainvoke() -> Any:
            try:
                out = await graph.ainvoke(inp, config_for(thread_id))
            finally:
                returned.set()
            # The loop lives on, as a server's does (asyncio.run would cancel the call's
            # task on return): the late outcome is recorded on it.
            for _ in range(250):
                if memory.ledger.find_effect(thread_id, "s1").status is not EffectStatus.UNKNOWN:
                    break
                await asyncio.sleep(0.02)
            return out

        def invoke() -> Any:
            try:
                return graph.invoke(inp, config_for(thread_id))
            finally:
                returned.set()

        log.arm("slow_write")
        run = Background(lambda: asyncio.run(ainvoke()) if use_async else invoke())
        try:
            run.wait_for(lambda: log.started("slow_write"), "the write to start")
            request_cancel(memory, thread_id, reason="stop", requested_by="t")
            finished = returned.wait(5.0)
            rec = memory.ledger.find_effect(thread_id, "s1")
        finally:
            log.release("slow_write")
            run.result()
        assert finished, "the stop waited past cancel_timeout"
        assert rec is not None and rec.status is EffectStatus.UNKNOWN and rec.owner
        deadline = time.monotonic() + 5.0
        while memory.ledger.find_effect(thread_id, "s1").status is EffectStatus.UNKNOWN:
            assert time.monotonic() < deadline, "the late outcome was never recorded"
            time.sleep(0.02)
        late = memory.ledger.find_effect(thread_id, "s1")
        assert late.status is EffectStatus.COMMITTED and log.applied("slow_write") == 1
        assert memory.ledger.latest_run(thread_id).status is RunStatus.CANCELLED
        # The report of the stop says what was known then: unknown, with an owner.
        # Built now, it says where the call settled: permanent.
        at_stop = get_report(memory, thread_id)
        assert [(e.tool_call_id, e.owner) for e in at_stop.unknown] == [("s1", rec.owner)]
        assert at_stop.permanent == []
        now = get_report(memory, thread_id, now=True)
        assert [e.tool_call_id for e in now.permanent] == ["s1"] and now.unknown == []


def test_cancel_right_after_a_write_is_acknowledged(saver: Any, log: ExecutionLog) -> None:
    """The provider applied w1 and answered; the stop arrives before the node records it."""
    thread_id = new_thread()

    def stop(_item: str) -> None:
        request_cancel(saver, thread_id, reason="stop", requested_by="t")

    tools = [
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE, after=stop),
        counting_tool(log, "w2", EffectKind.IRREVERSIBLE),
        counting_tool(log, "u1", EffectKind.REVERSIBLE),
    ]
    model = scripted(calls(("w1", "a", "k1"), ("w2", "b", "k2")), calls(("u1", "c", "k3")))
    graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
    graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    assert log.applied("w1") == 1 and log.attempts("w2") == 0 and log.attempts("u1") == 0
    assert model.calls == 1  # no model turn after the stop
    ledger = saver.ledger
    assert ledger.find_effect(thread_id, "k1").status is EffectStatus.COMMITTED
    assert ledger.find_effect(thread_id, "k2").status is EffectStatus.DROPPED
    report = state_report(graph, thread_id)
    assert [e.tool_call_id for e in report.permanent] == ["k1"]
    assert [e.tool_call_id for e in report.not_run] == ["k2"]
    assert report.unknown == [] and report.dispatched_after_cancel == 0


def test_cancel_during_compensation(saver: Any, log: ExecutionLog) -> None:
    """compensate_on_cancel: a slow undo, and a second stop request while it runs."""
    thread_id = new_thread()

    def stop(_item: str) -> None:
        request_cancel(saver, thread_id, reason="first reason", requested_by="alice")

    tools = [
        counting_tool(log, "u1", EffectKind.REVERSIBLE),
        counting_tool(log, "u2", EffectKind.REVERSIBLE, after=stop),
        counting_tool(log, "w3", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(calls(("u1", "a", "c1"), ("u2", "b", "c2"), ("w3", "c", "c3")))
    graph = cancellable(
        agent_builder(model, EffectToolNode(tools)), saver, compensate_on_cancel=True
    )
    log.arm("u2", "undo")
    run = Background(
        lambda: graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    )
    run.wait_for(lambda: log.started("undo:u2"), "the undo of u2 to start")
    ledger = saver.ledger
    # Mid-compensation: newest first; u2 has its intent written, u1 has not started.
    assert ledger.find_effect(thread_id, "c2").status is EffectStatus.COMPENSATING
    assert ledger.find_effect(thread_id, "c1").status is EffectStatus.COMMITTED
    assert log.applied("undo:u2") == 0 and log.attempts("undo:u1") == 0
    again = request_cancel(saver, thread_id, reason="second reason", requested_by="bob")
    assert again.accepted and not again.first and again.reason == "first reason"
    log.release("u2", "undo")
    run.result()
    # Each undo ran exactly once and the ledger agrees with the world.
    assert log.applied("undo:u2") == 1 and log.attempts("undo:u2") == 1
    assert log.applied("undo:u1") == 1 and log.attempts("undo:u1") == 1
    order = [r["tool"] for r in log.rows() if r["tool"].startswith("undo:")]
    assert order == ["undo:u2", "undo:u1"]
    for call_id in ("c1", "c2"):
        assert ledger.find_effect(thread_id, call_id).status is EffectStatus.COMPENSATED
    assert log.attempts("w3") == 0
    report = state_report(graph, thread_id)
    assert sorted(e.tool_call_id for e in report.compensated) == ["c1", "c2"]
    assert report.reversible_committed == [] and report.compensation_failed == []
    assert report.unknown == [] and [e.tool_call_id for e in report.not_run] == ["c3"]
    assert report.reason == "first reason" and report.requested_by == "alice"
    assert ledger.latest_run(thread_id).status is RunStatus.CANCELLED


def test_hundred_concurrent_cancels_make_one_terminal_transition(
    saver: Any, log: ExecutionLog
) -> None:
    tools = [
        counting_tool(log, "slow", EffectKind.REVERSIBLE),
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(calls(("slow", "a", "h1"), ("w1", "b", "h2")))
    graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
    thread_id = new_thread()
    cfg = config_for(thread_id)
    log.arm("slow")
    run = Background(
        lambda: collect_custom(graph, {"messages": [HumanMessage("go")]}, cfg, use_async=False)
    )
    run.wait_for(lambda: log.started("slow"), "slow to start")
    barrier = threading.Barrier(100, timeout=TIMEOUT)
    answers: list[Any] = [None] * 100

    def press(presser_index: int) -> None:
        barrier.wait()
        answers[presser_index] = request_cancel(
            saver, thread_id, reason=f"reason {presser_index}", requested_by=f"u{presser_index}"
        )

    pressers = [threading.Thread(target=press, args=(i,)) for i in range(100)]
    for presser in pressers:
        presser.start()
    for presser in pressers:
        presser.join(TIMEOUT)
    assert all(a is not None and a.accepted for a in answers)
    firsts = [a for a in answers if a.first]
    assert len(firsts) == 1
    winner = firsts[0].reason
    assert {a.reason for a in answers} == {winner}
    log.release("slow")
    events = run.result()
    assert len(cancelled_events(events)) == 1
    ledger = saver.ledger
    runs = ledger.runs(thread_id)
    assert len(runs) == 1 and runs[0].status is RunStatus.CANCELLED
    assert runs[0].reason == winner
    assert ledger.finish_run(runs[0].run_id, RunStatus.CANCELLED) is False
    report = state_report(graph, thread_id)
    assert report.reason == winner
    assert [e.tool_call_id for e in report.not_run] == ["h2"] and log.attempts("w1") == 0


def test_cancelling_a_finished_run_is_a_no_op(saver: Any, log: ExecutionLog) -> None:
    model = scripted(calls(("w1", "a", "f1")), "fin")
    graph = cancellable(
        agent_builder(model, EffectToolNode([counting_tool(log, "w1", EffectKind.IRREVERSIBLE)])),
        saver,
    )
    thread_id = new_thread()
    graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    run = saver.ledger.latest_run(thread_id)
    assert run.status is RunStatus.COMPLETED
    answer = request_cancel(saver, thread_id, reason="too late", requested_by="t")
    assert not answer.accepted and not answer.first
    assert answer.status is RunStatus.COMPLETED and "nothing to cancel" in answer.message
    assert saver.ledger.latest_run(thread_id).status is RunStatus.COMPLETED
    assert saver.ledger.latest_run(thread_id).reason is None
    with pytest.raises(UnknownThreadError):
        request_cancel(saver, new_thread(), reason="who?", requested_by="t")

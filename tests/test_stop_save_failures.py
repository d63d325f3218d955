"""A stop whose thread state was not saved: the thread is closed all the same.

LangGraph saves a step's finished tasks' writes beside the step's checkpoint; when
the writes are saved and the checkpoint is not (the worker died, or its database
went away, in between), its state shows the step's writes and nothing next. A stop
of such a thread is closed by the sweeper that finishes it, or by ``resume`` when the
sweeper was not given the agent. An invocation whose run ends ``cancelled`` without
the thread's state put right (its cancel node's saves lost, or the run's end could
not write the answers and the report) keeps the thread's lease, so that the sweeper,
once it expires, closes the thread as after a worker that died there. So does an
invocation that cannot read its run back, and a sweeper pass that fails between a
stop's finish and the thread's close; and a sweeper lets the lease of a cancelled
thread go only once it has closed the thread. A close the run's end wrote only half
of (the paused step's tasks cleared, the answers and the report lost) is finished by
the sweeper, or by ``resume``, from the ledger.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool

import plan_hold
from cli_util import ok_json, run_main
from graphs import (
    ExecutionLog,
    agent_builder,
    answered_late,
    calls,
    cancellable,
    config_for,
    counting_tool,
    dangling_calls,
    new_thread,
    open_saver,
    scripted,
    wait_until,
)
from langgraph_cancel import (
    CheckpointNotSavedError,
    EffectKind,
    EffectToolNode,
    Outcome,
    add_cancellation,
    effect,
    request_cancel,
)
from langgraph_cancel import lifecycle as lgc_lifecycle
from langgraph_cancel.recovery import reap_expired_leases, reconcile
from langgraph_cancel.sweep_threads import CloseOutcome, CloseOutcomeLiteral
from langgraph_cancel.sweeper import SweepActionKind, Sweeper
from langgraph_cancel.testing import ScriptedChatModel
from langgraph_cancel.types import EffectStatus, RunStatus, utcnow
from plan_hold import (
    Hold,
    asks_for_calls,
    held_graph,
    held_saver,
    losing_saver,
    start_in_thread,
)


@pytest.fixture
def log(tmp_path: Any) -> ExecutionLog:
    return ExecutionLog(str(tmp_path / "providers.db"))


@dataclass(frozen=True, slots=True)
class Stopped:
    """A thread stopped after its model step's save failed, and what ran it."""

    saver: Any
    graph: Any
    refund: Any
    thread: str


@contextmanager
def stopped_after_an_unsaved_model_step(url: str, log: ExecutionLog) -> Iterator[Stopped]:
    """Run the agent until its model step's save fails, then ask the thread to stop.

    The worker saved the model step's writes, not the step's checkpoint (the database
    went away), and ended. LangGraph's live state then shows the step's tool call
    unanswered and nothing next (the step's one task has its writes).
    """
    hold = Hold(fail=True, only=asks_for_calls)
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    thread = new_thread()
    with held_saver(url, hold) as saver:
        model = scripted(calls(("refund", "r-9", "c1")), "done")
        node = EffectToolNode([refund], checkpoint_timeout=20.0)
        graph = held_graph(saver, hold, node, model, use_async=False)
        worker, out = start_in_thread(graph, thread, use_async=False)
        assert hold.holding.wait(20)
        hold.release.set()
        worker.join(60)
        assert out and isinstance(out[0], CheckpointNotSavedError), out
        request_cancel(saver, thread, reason="stop", requested_by="t")
        left = graph.get_state({"configurable": {"thread_id": thread}})
        assert not left.next and dangling_calls(left.values["messages"]) == ["c1"]
        yield Stopped(saver, graph, refund, thread)


def _assert_closed(graph: Any, saver: Any, thread: str) -> None:
    """The thread as a finished stop leaves it: nothing next, every call answered right
    after it, the run's report in the state."""
    closed = graph.get_state({"configurable": {"thread_id": thread}})
    messages = closed.values["messages"]
    assert not closed.next and not closed.tasks
    assert dangling_calls(messages) == [] and answered_late(messages) == []
    run = saver.ledger.require_latest_run(thread)
    assert run.status is RunStatus.CANCELLED
    assert closed.values["cancellation_report"]["run_id"] == run.run_id


def test_the_sweeper_closes_a_stopped_thread_whose_model_step_was_never_saved(
    sqlite_url: str, log: ExecutionLog
) -> None:
    # The sweeper finishing the stop closes the thread, as a resume would.
    with stopped_after_an_unsaved_model_step(sqlite_url, log) as stopped:
        saver, thread = stopped.saver, stopped.thread
        # A sweeper without the graph reads the same call from the saver.
        bare = Sweeper(saver, tools=[stopped.refund]).threads
        assert [call["id"] for call in bare.dangling(thread)] == ["c1"]

        sweeper = Sweeper(saver, graph=stopped.graph, tools=[stopped.refund], cancel_grace=0.0)
        summary = sweeper.sweep_once()

        finished = [a for a in summary.actions if a.kind is SweepActionKind.FINISHED_CANCEL]
        assert [(a.thread_id, a.next_action) for a in finished] == [(thread, None)], summary
        assert finished[0].detail.endswith(
            "(no worker finished it within 0s of the request); closed its thread"
        ), finished[0].detail
        _assert_closed(stopped.graph, saver, thread)
        assert saver.ledger.lease(thread) is None  # kept only when a close fails
    assert log.attempts("refund") == 0


def test_resume_closes_the_thread_a_sweeper_without_the_agent_left_open(
    sqlite_url: str, log: ExecutionLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the agent, the sweeper finishes the stop and names the step left; the
    # operator's resume takes it, though LangGraph's state shows nothing next.
    with stopped_after_an_unsaved_model_step(sqlite_url, log) as stopped:
        saver, thread = stopped.saver, stopped.thread
        summary = Sweeper(saver, tools=[stopped.refund], cancel_grace=0.0).sweep_once()
        finished = [a for a in summary.actions if a.kind is SweepActionKind.FINISHED_CANCEL]
        assert len(finished) == 1 and finished[0].next_action is not None, summary
        assert finished[0].next_action.startswith(f"langgraph-cancel resume {thread}")
        assert saver.ledger.lease(thread) is None  # without the agent, nothing to retry

        monkeypatch.setattr(plan_hold, "RESUMABLE_AGENT", stopped.graph, raising=False)
        command = ["resume", thread, "--db", sqlite_url, "--json"]
        resumed = ok_json(run_main([*command, "--graph", "plan_hold:RESUMABLE_AGENT"], tmp_path))
        assert resumed["resumed"] is True, resumed
        _assert_closed(stopped.graph, saver, thread)
    assert log.attempts("refund") == 0


def _expired(saver: Any, thread: str) -> bool:
    lease = saver.ledger.lease(thread)
    return lease is not None and lease.expires_at <= utcnow()


def _closed_once_expired(sweeper: Sweeper, graph: Any, saver: Any, thread: str) -> None:
    """The pass after the lease on ``thread`` has expired reaps it and closes the thread."""
    wait_until(lambda: _expired(saver, thread), timeout=10, what="the lease to expire")
    summary = sweeper.sweep_once()
    kinds = [(a.kind, a.thread_id) for a in summary.actions]
    assert (SweepActionKind.REAPED_LEASE, thread) in kinds, summary
    assert (SweepActionKind.CLOSED_THREAD, thread) in kinds, summary
    _assert_closed(graph, saver, thread)
    assert saver.ledger.lease(thread) is None


def saves_lost_once_cancelled(url: str, thread: str) -> AbstractContextManager[Any]:
    """A saver whose checkpoint saves fail once ``thread``'s run is cancelled (the
    database went away right after the ``cancelled`` transition)."""

    def lost(saver: Any) -> bool:
        run = saver.ledger.latest_run(thread)
        return run is not None and run.status is RunStatus.CANCELLED

    return losing_saver(url, lost)


@dataclass(frozen=True, slots=True)
class StoppedAfterOneCall:
    """An agent asked to stop by its first call's tool, the second call queued."""

    thread: str
    tools: list[Any]
    model: Any

    def graph(self, saver: Any) -> Any:
        return cancellable(agent_builder(self.model, EffectToolNode(self.tools)), saver)

    def invoke_failing(self, saver: Any) -> Any:
        """Run the agent on ``saver``, whose failure the run's stop meets; the graph."""
        graph = self.graph(saver)
        with pytest.raises(ConnectionError):
            graph.invoke({"messages": [HumanMessage("go")]}, config_for(self.thread))
        return graph

    def closed_on_expiry(self, url: str) -> None:
        """Once the lease kept on the thread has expired, a sweeper pass closes it."""
        with open_saver(url) as saver:
            graph = self.graph(saver)
            wait_until(lambda: _expired(saver, self.thread), timeout=20, what="the lease to expire")
            sweeper = Sweeper(saver, graph=graph, tools=self.tools, owner="sweeper")
            summary = sweeper.sweep_once()
            kinds = [(a.kind, a.thread_id) for a in summary.actions]
            assert (SweepActionKind.CLOSED_THREAD, self.thread) in kinds, summary
            _assert_closed(graph, saver, self.thread)


def stopped_after_one_call(url: str, log: ExecutionLog) -> StoppedAfterOneCall:
    thread = new_thread()

    def stop(_item: str) -> None:
        request_cancel(url, thread, reason="stop", requested_by="t")

    tools = [
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE, after=stop),
        counting_tool(log, "w2", EffectKind.IRREVERSIBLE),
    ]
    return StoppedAfterOneCall(thread, tools, scripted(calls(("w1", "a", "k1"), ("w2", "b", "k2"))))


def test_a_sweeper_whose_close_failed_keeps_the_lease_and_closes_the_thread_later(
    sqlite_url: str, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sweeper finishes the stop, and its close of the thread fails (the database
    # went away): nobody would come back for the thread, so the sweeper leaves its
    # lease on it, expired at once (a worker given the thread is not held up), and the
    # next pass closes the thread.
    monkeypatch.setattr(lgc_lifecycle, "LEASE_TTL", 0.5)
    gone = threading.Event()
    with (
        stopped_after_an_unsaved_model_step(sqlite_url, log) as stopped,
        losing_saver(sqlite_url, lambda _saver: gone.is_set()) as losing,
    ):
        thread = stopped.thread
        sweeper = Sweeper(
            losing,
            graph=stopped.graph,
            tools=[stopped.refund],
            cancel_grace=0.0,
            owner="sweeper",
            lease_ttl=0.3,
        )
        gone.set()
        first = sweeper.sweep_once()
        finished = [a for a in first.actions if a.kind is SweepActionKind.FINISHED_CANCEL]
        assert [a.thread_id for a in finished] == [thread], first
        assert not finished[0].detail.endswith("closed its thread"), finished[0].detail
        assert finished[0].next_action is not None
        assert finished[0].next_action.startswith(f"a sweeper closes thread {thread}")
        lease = losing.ledger.lease(thread)
        assert lease is not None and lease.owner == "sweeper", lease
        assert lease.expires_at <= utcnow(), lease

        gone.clear()
        _closed_once_expired(sweeper, stopped.graph, losing, thread)
    assert log.attempts("refund") == 0


def test_a_stop_whose_saves_were_lost_keeps_its_lease_for_the_sweeper_to_close(
    sqlite_url: str, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lgc_lifecycle, "LEASE_TTL", 0.5)
    stopped = stopped_after_one_call(sqlite_url, log)
    thread = stopped.thread
    with saves_lost_once_cancelled(sqlite_url, thread) as saver:
        graph = stopped.invoke_failing(saver)
        run = saver.ledger.require_latest_run(thread)
        assert run.status is RunStatus.CANCELLED
        # The cancel node's writes were not saved: the thread is open, without the report.
        left = graph.get_state(config_for(thread))
        assert "cancellation_report" not in left.values, left
        lease = saver.ledger.lease(thread)
        assert lease is not None and lease.owner == run.owner, lease

    # Nobody renews it: it expires after its TTL.
    stopped.closed_on_expiry(sqlite_url)
    assert log.applied("w1") == 1 and log.attempts("w2") == 0


@pytest.mark.parametrize("ended", [False, True], ids=["paused-before-tools", "ended"])
def test_a_stop_finished_at_the_runs_end_whose_state_write_failed_keeps_its_lease(
    sqlite_url: str, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch, ended: bool
) -> None:
    # The stop arrives after the graph's last check: with the model's last answer (the
    # graph ends), or with its calls when the graph pauses before its tools. The run's
    # end finishes the cancel and writes its answers and report into the state, and
    # that write fails. The lease is kept for the sweeper, which closes the thread: it
    # runs the paused graph on, and writes the report into the ended graph's state as
    # the cancel node leaves it (there is nothing left to run on).
    monkeypatch.setattr(lgc_lifecycle, "LEASE_TTL", 0.5)
    thread = new_thread()
    tools = [counting_tool(log, "w1", EffectKind.IRREVERSIBLE)]
    interrupt_before = [] if ended else ["tools"]

    def stop_then_reply(_messages: list[BaseMessage]) -> AIMessage:
        request_cancel(sqlite_url, thread, reason="stop", requested_by="t")
        return AIMessage("done") if ended else calls(("w1", "a", "k1"))

    def build() -> Any:
        model = ScriptedChatModel([stop_then_reply], on_exhausted="repeat_last")
        return add_cancellation(agent_builder(model, EffectToolNode(tools)))

    with saves_lost_once_cancelled(sqlite_url, thread) as saver:
        graph = build().compile(checkpointer=saver, interrupt_before=interrupt_before)
        graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread))
        run = saver.ledger.require_latest_run(thread)
        assert run.status is RunStatus.CANCELLED and run.report is not None, run
        left = graph.get_state(config_for(thread))
        assert left.next == (() if ended else ("tools",)), left
        assert "cancellation_report" not in left.values, left
        lease = saver.ledger.lease(thread)
        assert lease is not None and lease.owner == run.owner, lease

    with open_saver(sqlite_url) as saver:
        graph = build().compile(checkpointer=saver, interrupt_before=interrupt_before)
        sweeper = Sweeper(saver, graph=graph, tools=tools, owner="sweeper")
        _closed_once_expired(sweeper, graph, saver, thread)
    assert log.attempts("w1") == 0


def test_a_close_outcome_literal_names_each_outcome() -> None:
    assert set(get_args(CloseOutcomeLiteral)) == {outcome.value for outcome in CloseOutcome}


class GoneOnce:
    """A ledger read that fails once, the first time ``lost(result)`` says so, as
    when the database goes away at that moment; the read's earlier and later calls
    reach it."""

    def __init__(self, read: Any, lost: Any) -> None:
        self.read = read
        self.lost = lost
        self.failures = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.read(*args, **kwargs)
        if self.failures == 0 and self.lost(result):
            self.failures += 1
            raise ConnectionError("server closed the connection unexpectedly")
        return result


def _cancelled(run: Any) -> bool:
    return run is not None and run.status is RunStatus.CANCELLED


def test_a_sweeper_pass_that_fails_after_finishing_a_stop_keeps_the_lease_for_the_close(
    sqlite_url: str, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pass makes the run's one ``cancelled`` transition, and the database goes
    # away before the thread is closed: the pass fails. The lease it took stays on the
    # thread, and a pass after it expires closes the thread. Had the lease gone, the
    # run would be over, its thread open, and no pass would look at it again.
    with stopped_after_an_unsaved_model_step(sqlite_url, log) as stopped:
        saver, thread = stopped.saver, stopped.thread
        sweeper = Sweeper(
            saver,
            graph=stopped.graph,
            tools=[stopped.refund],
            cancel_grace=0.0,
            owner="sweeper",
            lease_ttl=0.3,
        )
        gone = GoneOnce(sweeper.ledger.get_run, _cancelled)
        monkeypatch.setattr(sweeper.ledger, "get_run", gone)
        with pytest.raises(ConnectionError):
            sweeper.sweep_once()
        assert gone.failures == 1
        assert saver.ledger.require_latest_run(thread).status is RunStatus.CANCELLED
        lease = saver.ledger.lease(thread)
        assert lease is not None and lease.owner == "sweeper", lease

        _closed_once_expired(sweeper, stopped.graph, saver, thread)
    assert log.attempts("refund") == 0


def test_an_expired_lease_on_a_cancelled_thread_stays_until_a_pass_closes_the_thread(
    sqlite_url: str, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker's stop lost its saves and kept its lease, which expired. The pass that
    # finds it fails (the database went away) before it has closed the thread: the
    # expired lease is still there for the next pass, which closes the thread.
    monkeypatch.setattr(lgc_lifecycle, "LEASE_TTL", 0.5)
    stopped = stopped_after_one_call(sqlite_url, log)
    thread, tools = stopped.thread, stopped.tools
    with saves_lost_once_cancelled(sqlite_url, thread) as saver:
        stopped.invoke_failing(saver)

    with open_saver(sqlite_url) as saver:
        graph = stopped.graph(saver)
        wait_until(lambda: _expired(saver, thread), timeout=10, what="the lease to expire")
        sweeper = Sweeper(saver, graph=graph, tools=tools, owner="sweeper")
        gone = GoneOnce(sweeper.ledger.latest_run, _cancelled)
        monkeypatch.setattr(sweeper.ledger, "latest_run", gone)
        with pytest.raises(ConnectionError):
            sweeper.sweep_once()
        assert gone.failures == 1
        assert _expired(saver, thread), saver.ledger.lease(thread)
        _closed_once_expired(sweeper, graph, saver, thread)
    assert log.applied("w1") == 1 and log.attempts("w2") == 0


def test_a_failed_stop_whose_run_cannot_be_read_keeps_its_lease_for_the_sweeper(
    sqlite_url: str, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The database goes away right after the run's ``cancelled`` transition: the
    # cancel node fails, and so does the run's end when it reads the run to learn
    # whether the thread was left open. It keeps the lease, unknowing, and the
    # sweeper closes the thread once it has expired.
    monkeypatch.setattr(lgc_lifecycle, "LEASE_TTL", 0.5)
    stopped = stopped_after_one_call(sqlite_url, log)
    thread = stopped.thread
    with saves_lost_once_cancelled(sqlite_url, thread) as saver:
        read = saver.ledger.get_run

        def get_run(run_id: str) -> Any:
            run = read(run_id)
            if _cancelled(run):
                raise ConnectionError("server closed the connection unexpectedly")
            return run

        with monkeypatch.context() as away:
            away.setattr(saver.ledger, "get_run", get_run)
            stopped.invoke_failing(saver)
        run = saver.ledger.require_latest_run(thread)
        assert run.status is RunStatus.CANCELLED
        lease = saver.ledger.lease(thread)
        assert lease is not None and lease.owner == run.owner, lease

    stopped.closed_on_expiry(sqlite_url)
    assert log.applied("w1") == 1 and log.attempts("w2") == 0


def stopped_with_an_unknown_call(url: str, log: ExecutionLog) -> tuple[str, Any]:
    """A stopped run whose one call's outcome is unknown and whose cancel node's saves
    were lost: its worker kept the thread's lease. The thread and its model."""
    thread = new_thread()
    model = scripted(calls(("w1", "a", "k1")))
    with saves_lost_once_cancelled(url, thread) as losing:

        def stop(_item: str) -> None:
            request_cancel(losing, thread, reason="stop", requested_by="t")

        # The worker's tool has no reconcile hook: its lost response leaves the call
        # unknown.
        sent = counting_tool(
            log,
            "w1",
            EffectKind.IRREVERSIBLE,
            reconcile=False,
            after=stop,
            fail_after_apply=[ConnectionError("connection reset")],
            max_attempts=1,
        )
        with pytest.raises(ConnectionError):
            cancellable(agent_builder(model, EffectToolNode([sent])), losing).invoke(
                {"messages": [HumanMessage("go")]}, config_for(thread)
            )
        ledger = losing.ledger
        run = ledger.require_latest_run(thread)
        unknown = ledger.find_effect(thread, "k1")
        assert run.status is RunStatus.CANCELLED, run
        assert unknown is not None and unknown.status is EffectStatus.UNKNOWN, unknown
        lease = ledger.lease(thread)
        assert lease is not None and lease.owner == run.owner, lease
    return thread, model


def test_a_sweeper_leaves_a_thread_with_a_lease_on_it_to_the_step_that_closes_it(
    sqlite_url: str, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stopped run whose call's outcome is unknown keeps its lease for the sweeper (its
    # cancel node's saves were lost). The lease expires while a pass reconciles another
    # thread, after the pass's lease step has seen it live. The pass's reconcile step
    # must not take that lease and let it go: it leaves the thread to the lease step of
    # the next pass, which closes the thread. Let go, nothing would bring it back.
    monkeypatch.setattr(lgc_lifecycle, "LEASE_TTL", 0.5)
    held = new_thread()
    stopped, model = stopped_with_an_unknown_call(sqlite_url, log)
    with open_saver(sqlite_url) as saver:
        ledger = saver.ledger
        run = ledger.require_latest_run(stopped)
        unknown = ledger.find_effect(stopped, "k1")
        assert unknown is not None
        # Another thread, its call in flight, whose reconcile hook returns only once
        # the stopped thread's lease has expired.
        other = ledger.start_run(held, owner="elsewhere")
        planned, _ = ledger.plan(
            thread_id=held,
            run_id=other.run_id,
            tool_call_id="h1",
            tool="hold",
            kind=EffectKind.IRREVERSIBLE,
            args={"item": "h"},
        )
        ledger.transition(planned.effect_id, EffectStatus.DISPATCHED, actor="t")

        def after_the_lease_expired(_key: str, _args: dict[str, Any]) -> Outcome:
            wait_until(lambda: _expired(saver, stopped), timeout=10, what="the lease to expire")
            return Outcome.not_applied("never sent")

        @effect(EffectKind.IRREVERSIBLE, reconcile=after_the_lease_expired)
        @tool
        def hold(item: str) -> str:
            """Hold an item."""
            return item

        # The sweeper knows a reconcile hook for the stopped thread's call.
        tools = [hold, counting_tool(log, "w1", EffectKind.IRREVERSIBLE)]
        graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
        sweeper = Sweeper(saver, graph=graph, tools=tools, owner="sweeper")
        kept = ledger.acquire_lease(stopped, run.owner or "", ttl=1.0)
        assert kept.expires_at > utcnow(), kept

        first = sweeper.sweep_once()
        assert ledger.get_effect(planned.effect_id).status is EffectStatus.NOT_APPLIED, first
        assert _expired(saver, stopped), (first, ledger.lease(stopped))
        assert ledger.get_effect(unknown.effect_id).status is EffectStatus.UNKNOWN, first
        _closed_once_expired(sweeper, graph, saver, stopped)


def test_an_operators_reconcile_leaves_the_lease_kept_on_a_stopped_thread(
    sqlite_url: str, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An operator's ``reconcile --all`` reaps expired leases and settles what it can.
    # The lease kept on a stopped run's open thread is not the lease of a crashed run
    # to reap: let go, nothing would bring a sweeper back to the thread. Both the reap
    # and the reconcile of the thread's unknown call leave a lease on the thread, and
    # the sweeper's pass after it has expired closes the thread.
    monkeypatch.setattr(lgc_lifecycle, "LEASE_TTL", 0.5)
    stopped, model = stopped_with_an_unknown_call(sqlite_url, log)
    crashed = new_thread()
    with open_saver(sqlite_url) as saver:
        ledger = saver.ledger
        # A thread whose worker died mid-run: its expired lease is reaped as before.
        ledger.start_run(crashed, owner="crashed", lease_ttl=0.5)
        wait_until(
            lambda: _expired(saver, stopped) and _expired(saver, crashed),
            timeout=10,
            what="both leases to expire",
        )
        kept = ledger.lease(stopped)
        assert kept is not None

        reaped = reap_expired_leases(saver)
        assert [lease.thread_id for lease in reaped] == [crashed], reaped
        assert ledger.lease(stopped) == kept

        # The operator, in a process of their own, knows the call's reconcile hook.
        tools = [counting_tool(log, "w1", EffectKind.IRREVERSIBLE)]
        results = {
            result.thread_id: result for result in reconcile(saver, tools=tools, owner="operator")
        }
        settled = results[stopped]
        assert (settled.reaped, settled.kept_lease) == (kept.owner, True), settled
        assert [each.effect.status for each in settled.effects] == [EffectStatus.COMMITTED]
        # Expired at once: the sweeper's next pass, or any worker, may take it over.
        lease = ledger.lease(stopped)
        assert lease is not None and lease.owner == "operator", lease
        assert lease.expires_at <= utcnow(), lease

        graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
        sweeper = Sweeper(saver, graph=graph, tools=tools, owner="sweeper")
        _closed_once_expired(sweeper, graph, saver, stopped)
    assert log.applied("w1") == 1


@dataclass(frozen=True, slots=True)
class HalfWritten:
    """A stop whose run's end wrote half of the thread's close: the paused step's tasks
    cleared, the answers and the report lost with the database."""

    thread: str
    tools: list[Any]
    url: str

    def builder(self) -> Any:
        def stop_then_call(_messages: list[BaseMessage]) -> AIMessage:
            request_cancel(self.url, self.thread, reason="stop", requested_by="t")
            return calls(("w1", "a", "k1"))

        model = ScriptedChatModel([stop_then_call], on_exhausted="repeat_last")
        return add_cancellation(agent_builder(model, EffectToolNode(self.tools)))


def half_written_stop(url: str, log: ExecutionLog) -> HalfWritten:
    """Run the agent to its model's calls, paused before its tools; the stop arrives
    with the calls, so the run's end finishes it and writes the thread's close: its
    first save (the paused step's tasks cleared) lands, the next ones are lost."""
    tools = [counting_tool(log, "w1", EffectKind.IRREVERSIBLE)]
    stopped = HalfWritten(new_thread(), tools, url)
    saves_once_cancelled: list[str] = []

    def lost(saver: Any) -> bool:
        run = saver.ledger.latest_run(stopped.thread)
        if run is None or run.status is not RunStatus.CANCELLED:
            return False
        saves_once_cancelled.append(run.run_id)
        # The clearing write saves its checkpoint; the answers' write saves its
        # messages and report beside that checkpoint, and then loses its own.
        return len(saves_once_cancelled) > 2

    with losing_saver(url, lost) as saver:
        graph = stopped.builder().compile(checkpointer=saver, interrupt_before=["tools"])
        graph.invoke({"messages": [HumanMessage("go")]}, config_for(stopped.thread))
        left = graph.get_state(config_for(stopped.thread))
        assert not left.next and not left.tasks, left
        assert dangling_calls(left.values["messages"]) == ["k1"], left
        run = saver.ledger.require_latest_run(stopped.thread)
        assert run.status is RunStatus.CANCELLED and run.report is not None, run
        assert saver.ledger.lease(stopped.thread) is not None  # kept for the sweeper
    return stopped


def test_a_stop_whose_close_was_half_written_is_closed_by_the_sweeper(
    sqlite_url: str, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LangGraph's state shows nothing next and the call unanswered; the answers' write
    # left its messages and report beside the checkpoint, which LangGraph never
    # applies. The sweeper that reaps the kept lease answers the call and writes the
    # report as the cancel node would, rather than taking those writes for a close.
    monkeypatch.setattr(lgc_lifecycle, "LEASE_TTL", 0.5)
    stopped = half_written_stop(sqlite_url, log)
    with open_saver(sqlite_url) as saver:
        graph = stopped.builder().compile(checkpointer=saver)
        sweeper = Sweeper(saver, graph=graph, tools=stopped.tools, owner="sweeper")
        _closed_once_expired(sweeper, graph, saver, stopped.thread)
        answer = graph.get_state(config_for(stopped.thread)).values["messages"][-1]
        assert answer.tool_call_id == "k1" and answer.status == "error", answer
    assert log.attempts("w1") == 0


def test_resume_closes_a_half_written_stop_a_sweeper_without_the_agent_named(
    sqlite_url: str, log: ExecutionLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the agent, the sweeper cannot close the thread: it names the step left
    # instead of letting the thread go as if closed, and the operator's resume closes
    # it, though the thread has nothing to run on.
    monkeypatch.setattr(lgc_lifecycle, "LEASE_TTL", 0.5)
    stopped = half_written_stop(sqlite_url, log)
    thread = stopped.thread
    with open_saver(sqlite_url) as saver:
        wait_until(lambda: _expired(saver, thread), timeout=10, what="the lease to expire")
        summary = Sweeper(saver, tools=stopped.tools, owner="sweeper").sweep_once()
        left = [a for a in summary.actions if a.kind is SweepActionKind.LEFT_TO_OWNER]
        assert [a.thread_id for a in left] == [thread], summary
        assert left[0].next_action is not None
        assert left[0].next_action.startswith(f"langgraph-cancel resume {thread}"), left

        monkeypatch.setattr(plan_hold, "RESUMABLE_AGENT", stopped.builder(), raising=False)
        command = ["resume", thread, "--db", sqlite_url, "--json"]
        resumed = ok_json(run_main([*command, "--graph", "plan_hold:RESUMABLE_AGENT"], tmp_path))
        assert resumed["resumed"] is False, resumed
        assert resumed["message"].startswith(f"closed thread {thread}"), resumed
        graph = stopped.builder().compile(checkpointer=saver)
        _assert_closed(graph, saver, thread)
        assert saver.ledger.lease(thread) is None
        again = ok_json(run_main([*command, "--graph", "plan_hold:RESUMABLE_AGENT"], tmp_path))
        assert again["message"].startswith("nothing to resume"), again
    assert log.attempts("w1") == 0

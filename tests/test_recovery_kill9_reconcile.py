"""The kill -9 suite, settling what a killed worker left: bad reconcile hooks, the sweeper.

A reconcile hook that raises, hangs or returns garbage leaves the effect
``unknown`` with an owner and a next action, and the recovering run completes
(resumed with ``graph.invoke(None)`` or ``langgraph-cancel resume``). Sweepers
(two racing, as on two machines, and ``langgraph-cancel sweep``) finish a killed
worker's stop, settle the refund it left in flight, and retry a failed
compensation, each once; given the agent, they close the stopped thread too.

The harness and the invariant checks are in ``kill9_harness.py``.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import pytest

import recovery_worker as rw
from graphs import answered_late, dangling_calls
from kill9_harness import (
    World,
    _fork_server,  # noqa: F401 (a fixture, found by name)
    assert_no_double_execution,
    assert_report_matches_truth,
    assert_settled,
    effect_of,
    sqlite_world_fixture,  # noqa: F401 (a fixture, found by name)
    world_fixture,  # noqa: F401 (a fixture, found by name)
)
from langgraph_cancel import EffectStatus, get_report, request_cancel
from langgraph_cancel.demo.tools import compensation_key
from langgraph_cancel.execution.answers import NOT_RUN_CANCELLED


# ---------------------------------------------------------------- misbehaving hooks
@pytest.mark.slow
@pytest.mark.parametrize("via", ["invoke", "cli"])
@pytest.mark.parametrize(
    ("mode", "expected_error"),
    [
        ("raise", "reconcile hook raised RuntimeError('provider status API exploded')"),
        ("hang", "reconcile hook timed out after 0.5s"),
        ("garbage", "reconcile hook returned dict, not an Outcome"),
    ],
    ids=["raise", "hang", "garbage"],
)
def test_bad_reconcile_hook_leaves_effect_unknown(
    sqlite_world: World, mode: str, expected_error: str, via: str
) -> None:
    """The hook is asked by the tool node on ``invoke(None)``, or by
    ``langgraph-cancel resume``'s reconciliation before it continues the thread."""
    world = sqlite_world
    first = world.start(
        "first", "run", script="hooks", hook_mode=mode, kill_at="after:dispatched:notify_customer"
    )
    first.wait_point("after:dispatched:notify_customer")
    first.kill9()

    second = world.start("second", "recover", script="hooks", hook_mode=mode, resume_via=via)
    # The hanging hook sleeps 120 s: had it held the run, the job would outlast this wait.
    result = second.ok(timeout=30)
    assert result["run_status"] == "completed"  # the run did not crash
    assert result["last_message"] == rw.FINAL_ANSWER
    ledger = world.ledger()
    notice = effect_of(ledger, world.thread_id, "notify_customer")
    assert notice.status is EffectStatus.UNKNOWN, notice
    assert expected_error in (notice.error or ""), notice.error
    assert notice.owner and notice.next_action
    truth = world.providers().truth()
    assert truth["keys"].get(notice.idempotency_key, {"executions": 0})["executions"] == 0
    assert_settled(ledger, world.thread_id)
    report = assert_report_matches_truth(world, truth)
    assert [e.tool for e in report.unknown] == ["notify_customer"]


# ---------------------------------------------------------------- the sweeper
def stop_a_worker_killed_after_the_refund(
    world: World, name: str = "first", **options: Any
) -> None:
    """A worker killed once the refund reached the provider (the email still queued),
    then its run asked to stop: a stop nobody alive will finish."""
    first = world.start(
        name, "run", kill_at="after_call:refund", worker_id=None, lease_ttl=600, **options
    )
    first.wait_point("after_call:refund")
    first.kill9()
    asked = request_cancel(world.db_url, world.thread_id, reason="ops", requested_by="test")
    assert asked.accepted, asked


def thread_state(world: World) -> Any:
    """The thread's last state, read through the refund agent."""
    spec: dict[str, Any] = {"thread_id": world.thread_id, "worker_id": None}
    with rw.open_saver(world.db_url) as saver:
        return rw.build_graph(spec, saver).get_state(rw.config_for(spec))


def assert_thread_closed(world: World) -> None:
    """The thread ends as its cancel node ends it: nothing next or waiting, every call
    answered right after it (the email "not run"), the report in the state."""
    snapshot = thread_state(world)
    messages = snapshot.values["messages"]
    assert snapshot.next == () and not snapshot.interrupts, snapshot
    assert not dangling_calls(messages) and not answered_late(messages), messages
    email = next(m for m in messages if getattr(m, "name", None) == "send_email")
    assert email.content == NOT_RUN_CANCELLED, email
    ledger = world.ledger()
    report = get_report(ledger, world.thread_id)
    assert snapshot.values["cancellation_report"] == report.model_dump(mode="json")
    assert len(ledger.runs(world.thread_id)) == 1  # closing started no run


@pytest.mark.slow
def test_sweepers_finish_the_stop_of_a_killed_worker_once(world: World) -> None:
    """Two sweepers racing (two machines), given the agent, finish the stop once: the
    refund settled as the provider has it, the report written, the run cancelled, the
    thread closed; a later pass does nothing."""
    import threading

    from langgraph_cancel.demo import tools as refund_tools
    from langgraph_cancel.sweeper import SweepActionKind, Sweeper, SweepSummary
    from langgraph_cancel.types import RunStatus

    stop_a_worker_killed_after_the_refund(world)
    refund_tools.set_providers_path(world.providers_path)
    try:
        with ExitStack() as savers:
            sweepers = [
                Sweeper(
                    savers.enter_context(rw.open_saver(world.db_url)),
                    graph=rw.build_builder({}),
                    tools=refund_tools.TOOLS,
                    owner=f"sweeper-{name}",
                )
                for name in ("a", "b")
            ]
            summaries: list[SweepSummary] = []
            racing = [
                threading.Thread(target=lambda s=s: summaries.append(s.sweep_once()))
                for s in sweepers
            ]
            for thread in racing:
                thread.start()
            for thread in racing:
                thread.join(60)
            later = sweepers[0].sweep_once()
    finally:
        refund_tools.set_providers_path(None)

    assert len(summaries) == 2
    finished = [
        a for s in summaries for a in s.actions if a.kind is SweepActionKind.FINISHED_CANCEL
    ]
    assert len(finished) == 1, summaries
    assert finished[0].detail.endswith("closed its thread") and finished[0].next_action is None
    assert later.count(SweepActionKind.FINISHED_CANCEL) == 0, later
    assert later.count(SweepActionKind.RECONCILED) == 0, later
    ledger = world.ledger()
    run = ledger.require_latest_run(world.thread_id)
    assert run.status is RunStatus.CANCELLED and run.report, run
    refund = effect_of(ledger, world.thread_id, "issue_refund")
    assert refund.status is EffectStatus.COMMITTED, refund
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert len(truth["refunds"]) == 1, truth["refunds"]
    assert not truth["emails"], truth["emails"]
    assert_settled(ledger, world.thread_id)
    report = assert_report_matches_truth(world, truth)
    assert refund.idempotency_key in {e.idempotency_key for e in report.permanent}
    assert ledger.lease(world.thread_id) is None  # the sweepers gave the thread back
    assert_thread_closed(world)


@pytest.mark.slow
def test_sweep_command_closes_a_stopped_thread_of_the_agent_it_names(
    sqlite_world: World,
) -> None:
    """``langgraph-cancel sweep --graph``: the stop is finished and the thread closed;
    without the agent the summary names the step left, and ``resume`` closes it."""
    from langgraph_cancel.demo import tools as refund_tools
    from langgraph_cancel.sweeper import Sweeper

    world = sqlite_world
    stop_a_worker_killed_after_the_refund(world)
    spec = {"thread_id": world.thread_id}
    code, summary = rw.sweep_with_cli(spec, world.db_url, world.providers_path)
    assert code == 0, summary
    (finished,) = [a for a in summary["actions"] if a["kind"] == "finished_cancel"]
    assert finished["detail"].endswith("closed its thread"), finished
    assert_thread_closed(world)
    truth = world.providers().truth()
    assert len(truth["refunds"]) == 1 and not truth["emails"], truth

    # The same stop, swept without the agent.
    world.thread_id = f"{world.thread_id}-bare"
    stop_a_worker_killed_after_the_refund(world, "bare", refund_amount=60.0)  # its own key
    refund_tools.set_providers_path(world.providers_path)
    try:
        with rw.open_saver(world.db_url) as saver:
            bare = Sweeper(saver, tools=refund_tools.TOOLS).sweep_once()
    finally:
        refund_tools.set_providers_path(None)
    (left,) = [a for a in bare.actions if a.kind.value == "finished_cancel"]
    assert left.next_action == (
        f"langgraph-cancel resume {world.thread_id}, or new input on the thread: either "
        "answers the calls its worker left"
    )
    assert thread_state(world).next  # the checkpoint its worker left
    again = world.start("again", "recover", wait_lease=0, worker_id=None, resume_via="cli")
    assert again.ok()["run_status"] == "cancelled"
    assert_thread_closed(world)


def a_worker_killed_after_finishing_its_stop(world: World, name: str = "first") -> None:
    """A worker asked to stop once the refund was sent, killed right after its cancel
    node made the run's ``cancelled`` transition, before the node's checkpoint: the
    stop is finished, its thread is not, and the dead worker still holds the lease."""
    first = world.start(
        name,
        "run",
        pause_at=["after_call:refund"],
        kill_at="after:finish_run:cancelled",
        worker_id=None,
        lease_ttl=600,
    )
    first.wait_point("after_call:refund", "paused")
    asked = request_cancel(world.db_url, world.thread_id, reason="ops", requested_by="test")
    assert asked.accepted, asked
    first.go("after_call:refund")
    first.wait_point("after:finish_run:cancelled")
    first.kill9()


@pytest.mark.slow
def test_sweeper_closes_the_thread_of_a_stop_its_dead_worker_had_finished(world: World) -> None:
    """The sweeper, given the agent, takes over the dead worker's lease and closes the
    thread of its cancelled run (every call answered right after it, the report in the
    state); the refund was sent once and nothing more ran; a later pass does nothing."""
    from langgraph_cancel.demo import tools as refund_tools
    from langgraph_cancel.sweeper import SweepActionKind, Sweeper
    from langgraph_cancel.types import RunStatus

    a_worker_killed_after_finishing_its_stop(world)
    ledger = world.ledger()
    run = ledger.require_latest_run(world.thread_id)
    assert run.status is RunStatus.CANCELLED and run.report, run
    assert thread_state(world).next  # the checkpoint its worker left
    refund_tools.set_providers_path(world.providers_path)
    try:
        with rw.open_saver(world.db_url) as saver:
            sweeper = Sweeper(saver, graph=rw.build_builder({}), tools=refund_tools.TOOLS)
            summary = sweeper.sweep_once()
            later = sweeper.sweep_once()
    finally:
        refund_tools.set_providers_path(None)

    (closed,) = [a for a in summary.actions if a.kind is SweepActionKind.CLOSED_THREAD]
    assert closed.run_id == run.run_id and closed.status == "cancelled", closed
    assert closed.next_action is None, closed
    assert summary.count(SweepActionKind.TOOK_OVER_LEASE) == 1, summary
    assert summary.count(SweepActionKind.FINISHED_CANCEL) == 0, summary
    assert later.actions == (), later
    assert_thread_closed(world)
    assert ledger.lease(world.thread_id) is None
    assert len(ledger.runs(world.thread_id)) == 1  # closing started no run
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert len(truth["refunds"]) == 1 and not truth["emails"], truth
    assert_settled(ledger, world.thread_id)
    assert_report_matches_truth(world, truth)


@pytest.mark.slow
def test_sweeper_without_the_agent_names_the_step_a_finished_stop_left(
    sqlite_world: World,
) -> None:
    """Without the agent, the sweeper releases the dead worker's lease and names the
    step left on the thread; ``resume`` then closes it."""
    from langgraph_cancel.demo import tools as refund_tools
    from langgraph_cancel.sweeper import SweepActionKind, Sweeper

    world = sqlite_world
    a_worker_killed_after_finishing_its_stop(world)
    refund_tools.set_providers_path(world.providers_path)
    try:
        with rw.open_saver(world.db_url) as saver:
            summary = Sweeper(saver, tools=refund_tools.TOOLS).sweep_once()
    finally:
        refund_tools.set_providers_path(None)
    (left,) = [a for a in summary.actions if a.kind is SweepActionKind.LEFT_TO_OWNER]
    assert left.thread_id == world.thread_id and left.status == "cancelled", left
    assert left.next_action == (
        f"langgraph-cancel resume {world.thread_id}, or new input on the thread: either "
        "answers the calls its worker left"
    )
    assert world.ledger().lease(world.thread_id) is None
    assert thread_state(world).next
    again = world.start("again", "recover", wait_lease=0, worker_id=None, resume_via="cli")
    assert again.ok()["run_status"] == "cancelled"
    assert_thread_closed(world)


@pytest.mark.slow
def test_sweep_command_settles_a_killed_workers_refund_and_names_the_next_step(
    sqlite_world: World,
) -> None:
    """``langgraph-cancel sweep --json``: the refund a killed worker left in flight is
    settled through its hook; the run it left running is left to its owner, with the
    next step; resuming it then sends no second refund."""
    from langgraph_cancel.demo import tools as refund_tools

    world = sqlite_world
    first = world.start("first", "run", kill_at="after_call:refund", worker_id=None, lease_ttl=600)
    first.wait_point("after_call:refund")
    first.kill9()

    refund_tools.set_providers_path(world.providers_path)
    try:
        code, summary = rw.run_cli(["sweep", "--db", world.db_url, "--json"])
    finally:
        refund_tools.set_providers_path(None)
    assert code == 0, summary
    assert summary["counts"]["reconciled"] == 1, summary
    kinds = {(a["kind"], a["status"]) for a in summary["actions"]}
    assert ("reconciled", "committed") in kinds, summary
    left = [a for a in summary["actions"] if a["kind"] == "left_to_owner"]
    assert [a["thread_id"] for a in left] == [world.thread_id], summary
    assert "langgraph-cancel resume" in left[0]["next_action"]

    again = world.start("again", "recover", wait_lease=0, worker_id=None)
    assert again.ok()["run_status"] == "completed"
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert len(truth["refunds"]) == 1, truth["refunds"]
    assert_settled(world.ledger(), world.thread_id)


@pytest.mark.slow
def test_sweepers_retry_a_failed_compensation_once(sqlite_world: World) -> None:
    """A compensation that failed (the provider was down) is tried again by the sweeper
    once it is due: two sweepers racing undo the order update once; a later pass, and a
    pass before it is due, do nothing."""
    import threading

    from langgraph_cancel import compensate
    from langgraph_cancel.demo import tools as refund_tools
    from langgraph_cancel.sweeper import SweepActionKind, Sweeper, SweepSummary

    world = sqlite_world
    assert world.start("first", "run").ok()["run_status"] == "completed"
    refund_tools.set_providers_path(world.providers_path)
    try:
        tools = {t.name: t for t in refund_tools.TOOLS}
        world.providers().set_fault("restore_order", "fail_before")
        undone = compensate(world.db_url, world.thread_id, tools=tools)
        failed = [e for e in undone if e.status is EffectStatus.COMPENSATION_FAILED]
        assert [e.tool for e in failed] == ["update_order"], undone

        not_due = Sweeper(world.ledger(), tools=tools, owner="sweeper-early").sweep_once()
        assert not_due.count(SweepActionKind.COMPENSATED) == 0, not_due

        world.providers().set_fault("restore_order", "none")
        summaries: list[SweepSummary] = []
        sweepers = [
            Sweeper(world.ledger(), tools=tools, owner=f"sweeper-{n}", compensation_retry_after=0.0)
            for n in ("a", "b")
        ]
        racing = [
            threading.Thread(target=lambda s=s: summaries.append(s.sweep_once())) for s in sweepers
        ]
        for thread in racing:
            thread.start()
        for thread in racing:
            thread.join(60)
        later = sweepers[1].sweep_once()
    finally:
        refund_tools.set_providers_path(None)

    assert sum(s.count(SweepActionKind.COMPENSATED) for s in summaries) == 1, summaries
    assert later.count(SweepActionKind.COMPENSATED) == 0, later
    update = effect_of(world.ledger(), world.thread_id, "update_order")
    assert update.status is EffectStatus.COMPENSATED, update
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    restores = [k for k, v in truth["keys"].items() if v["operation"] == "restore_order"]
    assert restores == [compensation_key(update.idempotency_key)], truth["keys"]
    assert truth["keys"][restores[0]]["executions"] == 1

"""The kill -9 suite for the refund agent made by ``create_agent`` with ``EffectMiddleware``.

The same worker processes, kill points and providers as the other kill -9 suites
(``kill9_harness.py``), with the agent built by LangChain's ``create_agent``: a
worker killed mid-refund is resumed, by ``invoke`` or ``langgraph-cancel resume``,
and the refund is sent once; the stop of a worker that died is finished by the
sweeper, given the agent (``Sweeper(graph=agent)`` or ``langgraph-cancel sweep
--graph``), and the agent's thread closed; a stop its worker finished just before
dying is closed by ``resume``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import recovery_worker as rw
from graphs import answered_late, dangling_calls
from kill9_boundaries import (
    BOUNDARIES,
    Boundary,
    assert_orphaned_refund_not_applied,
    killed_at,
    recovered,
)
from kill9_harness import (
    World,
    _fork_server,  # noqa: F401 (a fixture, found by name)
    applied_keys,
    assert_answers_match_truth,
    assert_no_double_execution,
    assert_report_matches_truth,
    assert_settled,
    effect_of,
    sqlite_world_fixture,  # noqa: F401 (a fixture, found by name)
    world_fixture,  # noqa: F401 (a fixture, found by name)
)
from langgraph_cancel import EffectStatus, get_report, request_cancel
from langgraph_cancel.demo.tools import compensation_key
from langgraph_cancel.types import RunStatus

pytest.importorskip("langchain.agents")

AGENT = {"agent": "create_agent"}


def kill_a_worker_after_the_refund(world: World) -> None:
    """The agent's worker killed once the refund reached the provider."""
    first = world.start("first", "run", kill_at="after_call:refund", worker_id=None, **AGENT)
    first.wait_point("after_call:refund")
    first.kill9()


def agent_state(world: World) -> Any:
    """The thread's last state, read through the ``create_agent`` agent."""
    spec: dict[str, Any] = {"thread_id": world.thread_id, "worker_id": None, **AGENT}
    with rw.open_saver(world.db_url) as saver:
        return rw.build_graph(spec, saver).get_state(rw.config_for(spec))


def assert_agent_thread_closed(world: World) -> None:
    """The thread ends as the middleware ends a stopped agent: nothing next or
    waiting, every call answered right after it, the run's report in the state."""
    snapshot = agent_state(world)
    messages = snapshot.values["messages"]
    assert snapshot.next == () and not snapshot.interrupts, snapshot
    assert not dangling_calls(messages) and not answered_late(messages), messages
    report = get_report(world.ledger(), world.thread_id)
    assert snapshot.values["cancellation_report"] == report.model_dump(mode="json")


@pytest.mark.slow
@pytest.mark.parametrize("via", ["invoke", "cli"])
def test_a_killed_create_agent_worker_is_resumed_at_once_and_refunds_once(
    world: World, via: str
) -> None:
    """Started again right after ``kill -9``, the worker runs the agent on to its end
    at once (the lease the agent held over its calls is taken over: its holder, a
    process of this host, is gone): the refund in flight is settled as the provider
    has it, never sent again."""
    kill_a_worker_after_the_refund(world)
    second = world.start("second", "recover", wait_lease=0, worker_id=None, resume_via=via, **AGENT)
    result = second.ok()
    assert result["run_status"] == "completed", result
    assert result["last_message"] == rw.FINAL_ANSWER, result
    ledger = world.ledger()
    assert len(ledger.runs(world.thread_id)) == 1  # the same run, resumed
    refund = effect_of(ledger, world.thread_id, "issue_refund")
    assert refund.status is EffectStatus.COMMITTED, refund
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert len(truth["refunds"]) == 1, truth["refunds"]
    assert len(truth["emails"]) == 1, truth["emails"]
    assert truth["keys"][refund.idempotency_key]["executions"] == 1, truth["keys"]
    assert_settled(ledger, world.thread_id)


@pytest.mark.slow
def test_sweeper_given_a_create_agent_agent_finishes_its_stop_and_closes_its_thread(
    world: World,
) -> None:
    """A stop asked of a worker that died mid-refund: the sweeper, given the agent and
    no tools of its own, settles the refund through the agent's tools' hooks, writes
    the report, cancels the run and closes the agent's thread; nothing runs twice,
    and a later pass does nothing."""
    from langgraph_cancel.demo import tools as refund_tools
    from langgraph_cancel.sweeper import SweepActionKind, Sweeper

    kill_a_worker_after_the_refund(world)
    asked = request_cancel(world.db_url, world.thread_id, reason="ops", requested_by="test")
    assert asked.accepted, asked
    refund_tools.set_providers_path(world.providers_path)
    try:
        with rw.open_saver(world.db_url) as saver:
            sweeper = Sweeper(saver, graph=rw.build_agent({}), owner="sweeper")
            summary = sweeper.sweep_once()
            later = sweeper.sweep_once()
    finally:
        refund_tools.set_providers_path(None)

    (finished,) = [a for a in summary.actions if a.kind is SweepActionKind.FINISHED_CANCEL]
    assert finished.detail.endswith("closed its thread") and finished.next_action is None
    assert not later.actions, later
    ledger = world.ledger()
    run = ledger.require_latest_run(world.thread_id)
    assert run.status is RunStatus.CANCELLED and run.report, run
    refund = effect_of(ledger, world.thread_id, "issue_refund")
    assert refund.status is EffectStatus.COMMITTED, refund
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert len(truth["refunds"]) == 1, truth["refunds"]
    assert_settled(ledger, world.thread_id)
    report = assert_report_matches_truth(world, truth)
    assert refund.idempotency_key in {e.idempotency_key for e in report.permanent}
    assert ledger.lease(world.thread_id) is None
    assert_agent_thread_closed(world)


@pytest.mark.slow
def test_sweep_command_closes_a_stopped_thread_of_a_create_agent_agent(
    sqlite_world: World,
) -> None:
    """``langgraph-cancel sweep --graph`` naming a ``create_agent`` agent finishes the
    dead worker's stop and closes the agent's thread."""

    world = sqlite_world
    kill_a_worker_after_the_refund(world)
    asked = request_cancel(world.db_url, world.thread_id, reason="ops", requested_by="test")
    assert asked.accepted, asked
    spec = {"thread_id": world.thread_id, **AGENT}
    code, summary = rw.sweep_with_cli(spec, world.db_url, world.providers_path)
    assert code == 0, summary
    (finished,) = [a for a in summary["actions"] if a["kind"] == "finished_cancel"]
    assert finished["detail"].endswith("closed its thread"), finished
    assert_agent_thread_closed(world)
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert len(truth["refunds"]) == 1, truth["refunds"]


@pytest.mark.slow
def test_a_create_agent_stop_whose_worker_died_before_its_checkpoint_is_closed_by_resume(
    world: World,
) -> None:
    """The agent's worker, asked to stop once the refund was sent, killed right after
    its model step made the run's ``cancelled`` transition and before that step's
    checkpoint: the stop is whole in the ledger (a ``create_agent`` run holds no lease
    between its calls, so none is left behind and the sweeper has nothing to settle),
    and ``resume``
    closes the thread without running anything again."""
    from langgraph_cancel.demo import tools as refund_tools
    from langgraph_cancel.sweeper import Sweeper

    first = world.start(
        "first",
        "run",
        pause_at=["after_call:refund"],
        kill_at="after:finish_run:cancelled",
        worker_id=None,
        **AGENT,
    )
    first.wait_point("after_call:refund", "paused")
    asked = request_cancel(world.db_url, world.thread_id, reason="ops", requested_by="test")
    assert asked.accepted, asked
    first.go("after_call:refund")
    first.wait_point("after:finish_run:cancelled")
    first.kill9()
    ledger = world.ledger()
    run = ledger.require_latest_run(world.thread_id)
    assert run.status is RunStatus.CANCELLED and run.report, run
    assert ledger.lease(world.thread_id) is None
    assert agent_state(world).next  # the step that stopped the agent was not saved

    refund_tools.set_providers_path(world.providers_path)
    try:
        with rw.open_saver(world.db_url) as saver:
            swept = Sweeper(saver, graph=rw.build_agent({}), owner="sweeper").sweep_once()
    finally:
        refund_tools.set_providers_path(None)
    assert swept.actions == (), swept

    again = world.start("again", "recover", wait_lease=0, worker_id=None, resume_via="cli", **AGENT)
    assert again.ok()["run_status"] == "cancelled"
    assert_agent_thread_closed(world)
    assert len(ledger.runs(world.thread_id)) == 1  # closing started no run
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert len(truth["refunds"]) == 1, truth["refunds"]
    assert_settled(ledger, world.thread_id)
    assert_report_matches_truth(world, truth)


@pytest.mark.slow
def test_a_create_agent_worker_killed_waiting_for_approval_is_resumed_with_the_answer(
    sqlite_world: World,
) -> None:
    """A refund over 100 waits for a reviewer; the worker dies while it waits.
    ``langgraph-cancel resume --resume-value`` answers the question in a new process:
    the refund is sent once, after the approval, and the agent runs to its end."""
    world = sqlite_world
    first = world.start("first", "run", kill_at="interrupted", refund_amount=120.0, **AGENT)
    first.wait_point("interrupted")
    first.kill9()
    truth = world.providers().truth()
    assert not truth["refunds"], truth["refunds"]

    second = world.start(
        "second", "recover", wait_lease=0, resume_via="cli", refund_amount=120.0, **AGENT
    )
    result = second.ok()
    (question,) = second.answers()["next"]["interrupts"]
    assert question["type"] == "tool_approval" and question["name"] == "issue_refund", question
    assert result["run_status"] == "completed", result
    assert result["last_message"] == rw.FINAL_ANSWER, result
    ledger = world.ledger()
    refund = effect_of(ledger, world.thread_id, "issue_refund")
    assert refund.status is EffectStatus.COMMITTED, refund
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert len(truth["refunds"]) == 1, truth["refunds"]
    assert_settled(ledger, world.thread_id)


# ------------------------------------------------------------------- the boundaries
@pytest.mark.slow
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=[b.id for b in BOUNDARIES])
def test_create_agent_kill9_at_boundary_then_recover(world: World, boundary: Boundary) -> None:
    """``test_recovery_kill9.py``'s boundaries with the ``create_agent`` agent: killed at
    each, a new process answers the three questions from the database alone and
    resumes (``langgraph-cancel resume`` on SQLite, ``invoke`` on PostgreSQL); I2, I3,
    I6 and I7 hold against the providers' truth. ``create_agent`` sends a turn's calls
    at once, so a call beside the one at the kill point may be anywhere in its own
    course; the checks are those that hold wherever it is."""
    providers = world.providers()
    first, truth_at_kill = killed_at(world, boundary, **AGENT)

    second, result, answers = recovered(world, boundary, **AGENT)
    ledger = world.ledger()
    try:
        assert_answers_match_truth(answers, truth_at_kill, ledger, world.thread_id)
        if boundary.approval:
            (question,) = answers["next"]["interrupts"]
            assert question["name"] == "issue_refund", question
            assert boundary.refund_key not in applied_keys(truth_at_kill)
        truth = providers.truth()
        assert_no_double_execution(truth)
        # A call in flight at the kill may be sent again, under its key, when nothing
        # could tell whether it arrived; never more than that.
        assert all(v["attempts"] <= 2 for v in truth["keys"].values()), truth["keys"]
        if boundary.hang_refund:
            refund = effect_of(ledger, world.thread_id, "issue_refund")
            assert refund.status is EffectStatus.UNKNOWN, refund
            assert refund.owner and refund.next_action, refund
        assert_settled(ledger, world.thread_id)
        report = assert_report_matches_truth(world, truth)
        run = ledger.require_latest_run(world.thread_id)
        if boundary.cancel_after:
            assert run.status is RunStatus.CANCELLED and run.report is not None, run
            assert report.status == "cancelled" and not report.unknown, report
            assert result["run_status"] == "cancelled", result
            assert boundary.refund_key in applied_keys(truth)
            assert not truth["tickets"], truth["tickets"]  # the next turn's call never ran
            update = effect_of(ledger, world.thread_id, "update_order")
            if boundary.compensate:
                assert update.status is EffectStatus.COMPENSATED, update
                assert truth["orders"][rw.ORDER]["status"] == "refund_requested"
                undo = truth["keys"][compensation_key(update.idempotency_key)]
                assert undo["executions"] == 1, undo
            else:
                assert update.status is EffectStatus.COMMITTED, update
        else:
            assert run.status is RunStatus.COMPLETED, run
            assert result["last_message"] == rw.FINAL_ANSWER, result
            assert len(truth["emails"]) == 1 and len(truth["tickets"]) == 1, truth
            assert len(truth["updates"]) == 1, truth["updates"]
            if not boundary.hang_refund:
                assert [r["amount"] for r in truth["refunds"]] == [boundary.refund_amount]
                assert {e.tool for e in report.permanent} == {"issue_refund", "send_email"}
            if boundary.approval:
                refund = effect_of(ledger, world.thread_id, "issue_refund")
                assert (refund.approval or {}).get("reviewer") == "reviewer-after-crash", refund
        if boundary.hang_refund:
            assert_orphaned_refund_not_applied(world, boundary, truth, **AGENT)
    except AssertionError:
        print(first.log(), second.log(), json.dumps(answers, indent=1), sep="\n-----\n")
        raise

"""The kill -9 suite: a worker process is SIGKILLed at each boundary, a new one recovers.

Each scenario runs the refund agent (``tests/recovery_worker.py``) in a real
process against a ledger on SQLite or PostgreSQL and fake providers that keep
their own truth in their own SQLite file (``langgraph_cancel/demo/providers/``).
The worker blocks at a *kill point*; the test SIGKILLs it there. A NEW process
then answers the three questions from the database alone (I7) and resumes the
thread. The test finally checks, against the provider's truth:

- I2: no idempotency key was applied twice (``executions(key) <= 1``, and the
  raw requests per key are what the scenario allows);
- I3: every effect is settled, or ``unknown`` with an owner and a next action;
- I6: the report's permanent (and reversible, compensated) effects are what
  the providers applied;
- I7: the answers written before resuming (the library's view of ledger and
  checkpoint, and ``langgraph-cancel status THREAD --json``) match the
  providers' truth at the moment of the kill, and name a next step.

The recovering process resumes on SQLite with ``langgraph-cancel resume``
(which reconciles first) and on PostgreSQL with ``graph.invoke(None, config)``
(the tool node settles what it left in flight), so both paths run.

The harness (the worker processes, their fork server, the world) and the
invariant checks are in ``kill9_harness.py``, the boundaries in
``kill9_boundaries.py`` (``test_recovery_kill9_create_agent.py`` runs them with the
agent made by ``create_agent``). Two workers on one thread and a
killed worker's lease are in ``test_recovery_kill9_leases.py``; reconcile hooks
that misbehave and the sweeper in ``test_recovery_kill9_reconcile.py``.
"""

from __future__ import annotations

import json

import pytest

import recovery_worker as rw
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
from langgraph_cancel import EffectStatus
from langgraph_cancel.demo.tools import compensation_key


@pytest.mark.slow
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=[b.id for b in BOUNDARIES])
def test_kill9_at_boundary_then_recover(world: World, boundary: Boundary) -> None:
    providers = world.providers()
    first, truth_at_kill = killed_at(world, boundary)

    second, result, answers = recovered(world, boundary)
    ledger = world.ledger()
    try:
        assert_answers_match_truth(answers, truth_at_kill, ledger, world.thread_id)
        if boundary.approval:
            # Paused on the reviewer: nothing of the refund left the process.
            assert answers["next"]["graph_next"] == ["approval"], answers["next"]
            (question,) = answers["next"]["interrupts"]
            assert [a["name"] for a in question["action_requests"]] == ["issue_refund"]
            assert boundary.refund_key not in applied_keys(truth_at_kill)
            pending = effect_of(ledger, world.thread_id, "issue_refund")
            assert pending.effect_id in answers["next"]["not_yet_dispatched"]
        in_doubt = {
            e.tool
            for e in ledger.effects(world.thread_id)
            if e.idempotency_key in answers["may_have_been_committed"]
        }
        assert in_doubt == set(boundary.in_doubt_at_kill), answers

        truth = providers.truth()
        assert_no_double_execution(truth)
        # Attempts dedupe: recovery re-sends nothing it could settle by asking; the one
        # request re-sent (an unrecorded compensation, run again by design) reuses its key.
        attempts = {k: v["attempts"] for k, v in truth["keys"].items()}
        assert attempts == {
            k: 2 if truth["keys"][k]["operation"] in boundary.resent_ops else 1 for k in attempts
        }, truth["keys"]
        if boundary.hang_refund:
            # The refund was in flight when the worker died: nobody can tell yet.
            refund = effect_of(ledger, world.thread_id, "issue_refund")
            assert refund.status is EffectStatus.UNKNOWN, refund
            assert refund.owner == "reconciler" and refund.next_action
            assert "still processing" in (refund.error or "")
        assert_settled(ledger, world.thread_id)
        report = assert_report_matches_truth(world, truth)

        run = ledger.latest_run(world.thread_id)
        assert run is not None
        if boundary.cancel_after:
            assert run.status.value == "cancelled", run
            assert report.status == "cancelled"
            assert result["run_status"] == "cancelled"
            assert not report.unknown
            assert boundary.refund_key in applied_keys(truth)
            email = effect_of(ledger, world.thread_id, "send_email")
            assert email.status is EffectStatus.DROPPED
            assert not truth["emails"] and not truth["tickets"]
            update = effect_of(ledger, world.thread_id, "update_order")
            if boundary.compensate:
                assert update.status is EffectStatus.COMPENSATED
                assert truth["orders"][rw.ORDER]["status"] == "refund_requested"
                restore = truth["keys"][compensation_key(update.idempotency_key)]
                assert restore["executions"] == 1
            else:
                assert update.status is EffectStatus.COMMITTED
            # The report written at the one cancelled transition is the stored one.
            assert run.report is not None
        else:
            assert run.status.value == "completed", run
            assert result["last_message"] == rw.FINAL_ANSWER
            assert len(truth["emails"]) == 1 and len(truth["tickets"]) == 1
            assert len(truth["updates"]) == 1
            if not boundary.hang_refund:
                assert len(truth["refunds"]) == 1
                assert truth["refunds"][0]["amount"] == boundary.refund_amount
                assert {e.tool for e in report.permanent} == {"issue_refund", "send_email"}
            if boundary.approval:
                refund = effect_of(ledger, world.thread_id, "issue_refund")
                assert (refund.approval or {}).get("reviewer") == "reviewer-after-crash", refund

        if boundary.hang_refund:
            assert_orphaned_refund_not_applied(world, boundary, truth)
    except AssertionError:
        print(first.log(), second.log(), json.dumps(answers, indent=1), sep="\n-----\n")
        raise


@pytest.mark.slow
def test_kill9_while_the_model_steps_checkpoint_is_being_written(world: World) -> None:
    # Checkpoints take a second to write, the model names its calls anew each time it
    # is asked (as real models do), and the worker dies just after the first side
    # effect reached the provider. Under LangGraph's default durability the model's
    # step could still be unsaved then: the resume would ask the model again and send
    # the update a second time under a new key. The tool node waits for that step's
    # checkpoint before the update goes out, so the resume finds the same calls.
    providers = world.providers()
    first = world.start(
        "first", "run", kill_at="after_call:update_order", slow_checkpoints=1.0, fresh_ids=True
    )
    first.wait_point("after_call:update_order")
    first.kill9()
    assert len(providers.truth()["updates"]) == 1
    second = world.start(
        "second",
        "recover",
        fresh_ids=True,
        resume_via="cli" if world.backend == "sqlite" else "invoke",
    )
    result = second.ok()
    ledger = world.ledger()
    try:
        truth = providers.truth()
        assert_no_double_execution(truth)
        assert len(truth["updates"]) == 1, truth["updates"]
        assert len(truth["refunds"]) == 1 and len(truth["emails"]) == 1
        assert len(truth["tickets"]) == 1
        assert len([e for e in ledger.effects(world.thread_id) if e.tool == "update_order"]) == 1
        assert_settled(ledger, world.thread_id)
        assert result["last_message"] == rw.FINAL_ANSWER
    except AssertionError:
        print(first.log(), second.log(), sep="\n-----\n")
        raise

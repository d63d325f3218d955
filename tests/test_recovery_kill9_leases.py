"""The kill -9 suite, who holds the thread: two workers at once, a dead worker's lease.

Two workers started on one thread at the same moment (with distinct ids, and
forked from one parent without ids): one runs it, the other gets
``ThreadBusyError``, and no provider request is sent twice. A worker SIGKILLed
mid-run leaves its lease behind: while it is live another worker is turned
away; once it expires it is reaped and the next worker takes over. A worker
started again on the same host takes over at once.

The harness and the invariant checks are in ``kill9_harness.py``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kill9_harness import (
    MARKER_TIMEOUT,
    POLL,
    World,
    _fork_server,  # noqa: F401 (a fixture, found by name)
    assert_no_double_execution,
    assert_report_matches_truth,
    assert_settled,
    effect_of,
    sqlite_world_fixture,  # noqa: F401 (a fixture, found by name)
    world_fixture,  # noqa: F401 (a fixture, found by name)
)
from langgraph_cancel import EffectStatus
from langgraph_cancel.recovery import reap_expired_leases
from langgraph_cancel.types import utcnow


# --------------------------------------------------------------- two workers at once
@pytest.mark.slow
def test_two_workers_on_one_thread(world: World) -> None:
    gate = world.tmp / "gate"
    # Whoever wins holds the thread for a while (the first provider call is slow).
    options: dict[str, Any] = {
        "start_gate": str(gate),
        "lease_ttl": 30.0,
        "hold": {"before_call:update_order": 1.0},
    }
    worker_a = world.start("a", "run", **options)
    worker_b = world.start("b", "run", **options)
    deadline = time.monotonic() + MARKER_TIMEOUT
    while not all((world.tmp / f"{j.name}.ready").exists() for j in (worker_a, worker_b)):
        assert time.monotonic() < deadline, worker_a.log() + worker_b.log()
        assert worker_a.proc.is_alive() and worker_b.proc.is_alive(), (
            worker_a.log() + worker_b.log()
        )
        time.sleep(POLL)
    gate.write_text("go")
    results = {j.spec["worker_id"]: j.result() for j in (worker_a, worker_b)}
    winners = [w for w, r in results.items() if r.get("ok")]
    losers = [w for w, r in results.items() if not r.get("ok")]
    assert len(winners) == 1 and len(losers) == 1, results
    winner, loser = winners[0], losers[0]
    assert results[loser]["error_type"] == "ThreadBusyError", results[loser]
    assert results[winner]["run_status"] == "completed"

    ledger = world.ledger()
    effects = ledger.effects(world.thread_id)
    assert {e.tool for e in effects} >= {
        "update_order",
        "issue_refund",
        "send_email",
        "create_ticket",
    }
    for record in effects:
        assert record.owner == winner, record
        assert all(t.actor != loser for t in ledger.history(record.effect_id)), record
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert all(v["attempts"] == 1 for v in truth["keys"].values()), truth["keys"]
    assert_settled(ledger, world.thread_id)
    assert_report_matches_truth(world, truth)
    assert len(ledger.runs(world.thread_id)) == 1


@pytest.mark.slow
def test_two_forked_workers_without_ids_are_two_workers(sqlite_world: World) -> None:
    """Workers forked from one parent that imported the library (Celery prefork,
    gunicorn --preload, a multiprocessing fork server, as here) are still two workers:
    the second gets ThreadBusyError, it does not share the first one's lease."""
    world = sqlite_world
    gate = world.tmp / "gate"
    options: dict[str, Any] = {
        "start_gate": str(gate),
        "lease_ttl": 30.0,
        "worker_id": None,
        "hold": {"before_call:update_order": 1.0},
    }
    worker_a = world.start("a", "run", **options)
    worker_b = world.start("b", "run", **options)
    deadline = time.monotonic() + MARKER_TIMEOUT
    while not all((world.tmp / f"{j.name}.ready").exists() for j in (worker_a, worker_b)):
        assert time.monotonic() < deadline, worker_a.log() + worker_b.log()
        time.sleep(POLL)
    gate.write_text("go")
    results = [worker_a.result(), worker_b.result()]
    assert results[0]["worker_id"] != results[1]["worker_id"], results
    assert sorted(bool(r.get("ok")) for r in results) == [False, True], results
    loser = next(r for r in results if not r.get("ok"))
    assert loser["error_type"] == "ThreadBusyError", loser
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert all(v["attempts"] == 1 for v in truth["keys"].values()), truth["keys"]


# ------------------------------------------------------------ a dead worker's lease
@pytest.mark.slow
def test_killed_workers_lease_expires_then_another_worker_resumes(sqlite_world: World) -> None:
    world = sqlite_world
    first = world.start("first", "run", kill_at="after:dispatched:issue_refund", lease_ttl=2.0)
    first.wait_point("after:dispatched:issue_refund")
    first.kill9()
    ledger = world.ledger()
    lease = ledger.lease(world.thread_id)
    assert lease is not None and lease.owner == "worker-first"
    assert lease.expires_at > utcnow(), "the lease expired before the test could look"
    truth_before = world.providers().truth()
    effects_before = [(e.effect_id, e.status) for e in ledger.effects(world.thread_id)]

    # While the dead worker's lease is live, another worker is turned away.
    busy = world.start("busy", "recover", wait_lease=0)
    refused = busy.result()
    assert not refused["ok"] and refused["error_type"] == "ThreadBusyError", refused
    assert world.providers().truth()["keys"] == truth_before["keys"]
    assert [(e.effect_id, e.status) for e in ledger.effects(world.thread_id)] == effects_before

    # The lease expires (nobody heartbeats it); the reaper sees it, the next worker takes over.
    deadline = time.monotonic() + 10
    while world.thread_id not in {x.thread_id for x in ledger.expired_leases()}:
        assert time.monotonic() < deadline, ledger.lease(world.thread_id)
        time.sleep(POLL)
    reaped = reap_expired_leases(world.db_url)
    assert [(x.thread_id, x.owner) for x in reaped] == [(world.thread_id, "worker-first")]
    assert ledger.lease(world.thread_id) is None
    taker = world.start("taker", "recover", wait_lease=0)
    result = taker.ok()
    assert result["run_status"] == "completed"
    refund = effect_of(ledger, world.thread_id, "issue_refund")
    assert refund.status is EffectStatus.COMMITTED
    for tool_name in ("send_email", "create_ticket"):
        assert effect_of(ledger, world.thread_id, tool_name).owner == "worker-taker"
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert_settled(ledger, world.thread_id)
    assert_report_matches_truth(world, truth)
    assert ledger.lease(world.thread_id) is None  # released at the end of the run


@pytest.mark.slow
def test_a_worker_killed_on_this_host_is_resumed_at_once(world: World) -> None:
    """A worker killed mid-refund and started again on the same machine resumes the
    thread at once (no waiting out the lease, no --force); the refund is sent once."""
    options: dict[str, Any] = {"worker_id": None, "lease_ttl": 600.0}
    first = world.start("first", "run", kill_at="after:dispatched:issue_refund", **options)
    first.wait_point("after:dispatched:issue_refund")
    first.kill9()
    ledger = world.ledger()
    lease = ledger.lease(world.thread_id)
    assert lease is not None and lease.expires_at > utcnow(), lease  # ten more minutes

    again = world.start("again", "recover", wait_lease=0, **options)
    result = again.ok()
    assert result["run_status"] == "completed"
    takeovers = ledger.lease_takeovers(world.thread_id)
    assert [(t.previous_owner, t.owner, t.cause.value) for t in takeovers][:1] == [
        (lease.owner, result["worker_id"], "holder_gone")
    ], takeovers
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert len(truth["refunds"]) == 1, truth["refunds"]
    assert all(v["executions"] <= 1 for v in truth["keys"].values()), truth["keys"]
    assert_settled(ledger, world.thread_id)
    assert_report_matches_truth(world, truth)

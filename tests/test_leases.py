"""The process's lease keeper: one thread renews every lease the process holds.

A run holds its thread's lease for as long as it runs (``ThreadBusy`` for a
second worker); the keeper renews it every third of its TTL, stops when the run
lets go, and keeps going when one renewal fails.
"""

from __future__ import annotations

import threading
import time

import pytest

from langgraph_cancel.errors import IllegalTransitionError, ThreadBusyError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.runtime import LeaseKeeper
from langgraph_cancel.types import RunStatus, utcnow
from ledger_util import new_id

TTL = 1.2


def _keeper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "langgraph-cancel-leases"]


def test_held_leases_outlive_their_ttl_and_lapse_once_let_go(ledger: Ledger) -> None:
    keeper = LeaseKeeper()
    threads = [new_id("t") for _ in range(3)]
    handles = []
    for thread in threads:
        ledger.acquire_lease(thread, "w1", ttl=TTL)
        handles.append(keeper.hold(ledger, thread, "w1", ttl=TTL))
    assert keeper.held() == 3
    time.sleep(TTL * 2.5)
    for thread in threads:  # renewed all along: still live, still ours
        lease = ledger.lease(thread)
        assert lease is not None and lease.owner == "w1" and lease.expires_at > utcnow()
        with pytest.raises(ThreadBusyError):
            ledger.acquire_lease(thread, "w2", ttl=TTL)
    keeper.let_go(handles[0])
    assert keeper.held() == 2
    time.sleep(TTL * 1.5)
    assert ledger.lease(threads[0]).expires_at < utcnow()  # type: ignore[union-attr]
    ledger.acquire_lease(threads[0], "w2", ttl=TTL)  # taken over, as after a crash
    assert ledger.lease(threads[1]).expires_at > utcnow()  # type: ignore[union-attr]
    for handle in handles[1:]:
        keeper.let_go(handle)
    assert keeper.held() == 0


def test_one_thread_renews_them_all(ledger: Ledger) -> None:
    keeper = LeaseKeeper()
    before = len(_keeper_threads())
    handles = [keeper.hold(ledger, new_id("t"), "w1", ttl=30.0) for _ in range(20)]
    assert len(_keeper_threads()) == before + 1
    for handle in handles:
        keeper.let_go(handle)


def test_a_failed_renewal_is_tried_again(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    thread = new_id("t")
    ledger.acquire_lease(thread, "w1", ttl=TTL)
    real = ledger.heartbeat
    calls: list[str] = []

    def flaky(thread_id: str, owner: str, *, ttl: float = 30.0) -> bool:
        calls.append(thread_id)
        if len(calls) == 1:
            raise ConnectionError("database briefly unreachable")
        return real(thread_id, owner, ttl=ttl)

    monkeypatch.setattr(ledger, "heartbeat", flaky)
    keeper = LeaseKeeper()
    handle = keeper.hold(ledger, thread, "w1", ttl=TTL)
    deadline = time.monotonic() + 10
    while len(calls) < 2:
        assert time.monotonic() < deadline, "the keeper stopped after one failure"
        time.sleep(0.02)
    keeper.let_go(handle)
    assert ledger.lease(thread).owner == "w1"  # type: ignore[union-attr]


# ------------------------------------------- a run's lease, taken and given back with it
def test_start_run_takes_the_lease_with_the_run(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread, owner="w1", lease_ttl=30)
    lease = ledger.lease(thread)
    assert run.status.value == "running" and lease is not None and lease.owner == "w1"
    # Re-entrant for its owner: the same live run, the lease renewed.
    again = ledger.start_run(thread, owner="w1", lease_ttl=30)
    assert again.run_id == run.run_id
    with pytest.raises(ValueError, match="owner"):
        ledger.start_run(thread, lease_ttl=30)


def test_start_run_on_a_held_thread_starts_nothing(ledger: Ledger) -> None:
    thread = new_id("t")
    ledger.acquire_lease(thread, "w1", ttl=30)
    with pytest.raises(ThreadBusyError):
        ledger.start_run(thread, owner="w2", lease_ttl=30)
    assert ledger.runs(thread) == []  # the run row is only written under the lease
    lease = ledger.lease(thread)
    assert lease is not None and lease.owner == "w1"


@pytest.mark.parametrize("lease_ttl", [None, 30.0])
def test_start_run_and_unsettled_reads_what_the_two_calls_would(
    ledger: Ledger, lease_ttl: float | None
) -> None:
    thread = new_id("t")
    run, unsettled = ledger.start_run_and_unsettled(thread, owner="w1", lease_ttl=lease_ttl)
    assert run.status.value == "running" and unsettled == []
    # The thread's live run, and what it left unsettled (a dispatch, a plan, a commit).
    effect_a, _ = ledger.plan(thread_id=thread, run_id=run.run_id, tool_call_id="a", tool="t",
                              kind="irreversible", args={"n": 1}, seq=0)  # fmt: skip
    effect_b, _ = ledger.plan(thread_id=thread, run_id=run.run_id, tool_call_id="b", tool="t",
                              kind="irreversible", args={"n": 2}, seq=1)  # fmt: skip
    ledger.transition(effect_a.effect_id, "dispatched", owner="w1")
    ledger.transition(effect_b.effect_id, "dropped")
    again, unsettled = ledger.start_run_and_unsettled(thread, owner="w1", lease_ttl=lease_ttl)
    assert again.run_id == run.run_id
    assert unsettled == ledger.unsettled(thread)
    assert [(e.effect_id, e.status.value) for e in unsettled] == [
        (effect_a.effect_id, "dispatched")
    ]
    if lease_ttl is not None:
        with pytest.raises(ThreadBusyError):
            ledger.start_run_and_unsettled(thread, owner="w2", lease_ttl=lease_ttl)


def test_start_run_takes_over_an_expired_lease(ledger: Ledger) -> None:
    thread = new_id("t")
    ledger.acquire_lease(thread, "dead", ttl=0.05)
    time.sleep(0.1)
    run = ledger.start_run(thread, owner="w2", lease_ttl=30)
    lease = ledger.lease(thread)
    assert lease is not None and lease.owner == "w2"
    assert [r.run_id for r in ledger.runs(thread)] == [run.run_id]


def test_finish_run_gives_the_lease_back_only_when_it_ends_the_run(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread, owner="w1", lease_ttl=30)
    ledger.request_cancel(thread, reason="stop", requested_by="test")
    # Refused (a run asked to stop cannot complete): the lease stays with its owner.
    with pytest.raises(IllegalTransitionError):
        ledger.finish_run(run.run_id, RunStatus.COMPLETED, release_lease="w1")
    assert ledger.lease(thread) is not None
    # Another owner's name releases nothing.
    assert ledger.finish_run(run.run_id, RunStatus.CANCELLED, release_lease="w2")
    held = ledger.lease(thread)
    assert held is not None and held.owner == "w1"
    # Already terminal: False, and the lease is kept.
    assert not ledger.finish_run(run.run_id, RunStatus.CANCELLED, release_lease="w1")
    assert ledger.lease(thread) is not None

    other = new_id("t")
    done = ledger.start_run(other, owner="w1", lease_ttl=30)
    assert ledger.finish_run(done.run_id, RunStatus.COMPLETED, release_lease="w1")
    assert ledger.lease(other) is None
    assert ledger.get_run(done.run_id).status is RunStatus.COMPLETED

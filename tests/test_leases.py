"""The process's lease keeper: one thread renews every lease the process holds.

A run holds its thread's lease for as long as it runs (``ThreadBusy`` for a
second worker); the keeper renews it every third of its TTL, stops when the run
lets go, and keeps going when one renewal fails.
"""

from __future__ import annotations

import threading
import time

import pytest

from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.runtime import LeaseKeeper
from langgraph_cancel.types import utcnow
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

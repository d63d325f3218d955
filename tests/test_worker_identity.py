"""A dead holder on this host is known at once.

A worker's identity carries its host, boot id, pid namespace, pid and start time, so a
lease whose holder is a process of this host that no longer runs (or whose pid now
belongs to another process) is taken over at once, with the takeover in the leases'
audit trail. Holders of other hosts, and owner strings chosen by the user, keep the
TTL. The holders here are real processes, killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.ledger import AsyncLedger, Ledger
from langgraph_cancel.runtime import worker_id
from langgraph_cancel.types import LeaseTakeoverCause, utcnow
from langgraph_cancel.workers import (
    WorkerIdentity,
    holder_is_gone,
    lease_is_live,
    new_worker_id,
)
from ledger_util import new_id

HOLD_TTL = 600.0  # far longer than any test: only liveness can end these leases

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from langgraph_cancel.ledger import Ledger
    from langgraph_cancel.runtime import worker_id

    ledger = Ledger.from_url(sys.argv[1])
    ledger.setup()
    ledger.acquire_lease(sys.argv[2], worker_id(), ttl=float(sys.argv[3]))
    print(worker_id(), flush=True)
    time.sleep(600)
    """
)


class Holder:
    """A real process that takes a thread's lease under its own identity, then waits."""

    def __init__(self, db_url: str, thread_id: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, db_url, thread_id, str(HOLD_TTL)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.owner = self.proc.stdout.readline().strip()
        assert self.owner, f"the holder exited with {self.proc.wait()}"

    def kill9(self, *, reap: bool) -> None:
        """SIGKILL the holder; without ``reap`` it stays a zombie (not waited for)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        if reap:
            assert self.proc.wait(10) == -signal.SIGKILL
            return
        # The signal is delivered asynchronously: wait until the kernel shows a zombie.
        stat = Path(f"/proc/{self.proc.pid}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, stat.read_text()
            time.sleep(0.01)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def file_url(request: pytest.FixtureRequest) -> str:
    """A database another process can open (memory:// is one process's own)."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.stop()


def _ledger(url: str) -> Ledger:
    ledger = Ledger.from_url(url)
    ledger.setup()
    return ledger


# ------------------------------------------------------------------ the identity
def test_this_process_identity_is_checkable_and_alive() -> None:
    me = WorkerIdentity.parse(worker_id())
    assert me is not None, worker_id()
    assert (me.host, me.pid) == (socket.gethostname(), os.getpid())
    assert not holder_is_gone(worker_id())
    assert new_worker_id() != worker_id()  # a random part: two workers of one process


def test_a_reused_pid_is_another_process() -> None:
    me = WorkerIdentity.parse(worker_id())
    assert me is not None
    earlier = replace(me, start_ticks=me.start_ticks - 1)
    assert holder_is_gone(earlier.owner)


def test_holders_that_cannot_be_checked_here_are_never_judged_gone() -> None:
    me = WorkerIdentity.parse(worker_id())
    assert me is not None
    dead_pid = replace(me, pid=2**22 + 1)  # above pid_max: no such process here
    assert holder_is_gone(dead_pid.owner)
    assert not holder_is_gone(replace(dead_pid, host=me.host + "-other").owner)
    assert not holder_is_gone(replace(dead_pid, boot_id="0" * len(me.boot_id)).owner)
    assert not holder_is_gone(replace(dead_pid, pid_namespace=me.pid_namespace + 1).owner)
    for chosen in ("worker-1", "w1", f"{me.host}:{dead_pid.pid}:abc123", ""):
        assert WorkerIdentity.parse(chosen) is None
        assert not holder_is_gone(chosen)


# ---------------------------------------------------------------- the takeover
@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_a_killed_holders_live_lease_is_taken_over_at_once(
    file_url: str, holders: list[Holder], reap: bool
) -> None:
    thread = new_id("t")
    holder = Holder(file_url, thread)
    holders.append(holder)
    ledger = _ledger(file_url)
    try:
        with pytest.raises(ThreadBusyError):  # alive: its lease holds
            ledger.acquire_lease(thread, "taker", ttl=30.0)
        held = ledger.lease(thread)
        assert held is not None and lease_is_live(held)

        holder.kill9(reap=reap)
        assert held.expires_at > utcnow()  # the TTL alone would keep it ten minutes
        assert not lease_is_live(ledger.lease(thread))
        taken = ledger.acquire_lease(thread, "taker", ttl=30.0)
        assert taken.owner == "taker"
        [takeover] = ledger.lease_takeovers(thread)
        assert (takeover.previous_owner, takeover.owner, takeover.cause) == (
            holder.owner,
            "taker",
            LeaseTakeoverCause.HOLDER_GONE,
        )
        ledger.acquire_lease(thread, "taker", ttl=30.0)  # re-entrant: no second entry
        assert len(ledger.lease_takeovers(thread)) == 1
    finally:
        ledger.close()


def test_the_async_ledger_takes_a_killed_holders_lease_over(
    file_url: str, holders: list[Holder]
) -> None:
    thread = new_id("t")
    holder = Holder(file_url, thread)
    holders.append(holder)

    async def take() -> None:
        ledger = await AsyncLedger.from_url(file_url)
        try:
            with pytest.raises(ThreadBusyError):
                await ledger.aacquire_lease(thread, "taker", ttl=30.0)
            holder.kill9(reap=True)
            taken = await ledger.aacquire_lease(thread, "taker", ttl=30.0)
            assert taken.owner == "taker"
            [takeover] = await ledger.alease_takeovers(thread)
            assert takeover.previous_owner == holder.owner
            assert takeover.cause is LeaseTakeoverCause.HOLDER_GONE
        finally:
            await ledger.aclose()

    asyncio.run(take())


def test_a_run_starts_on_a_thread_whose_holder_was_killed(
    file_url: str, holders: list[Holder]
) -> None:
    thread = new_id("t")
    holder = Holder(file_url, thread)
    holders.append(holder)
    ledger = _ledger(file_url)
    try:
        holder.kill9(reap=True)
        run = ledger.start_run(thread, owner="next-worker", lease_ttl=30.0)
        assert run.owner == "next-worker"
        lease = ledger.lease(thread)
        assert lease is not None and lease.owner == "next-worker"
        assert [t.cause for t in ledger.lease_takeovers(thread)] == [LeaseTakeoverCause.HOLDER_GONE]
    finally:
        ledger.close()


def test_a_user_chosen_owner_keeps_its_ttl(ledger: Ledger) -> None:
    thread = new_id("t")
    ledger.acquire_lease(thread, "worker-elsewhere", ttl=HOLD_TTL)
    with pytest.raises(ThreadBusyError):
        ledger.acquire_lease(thread, "taker", ttl=30.0)
    assert ledger.lease_takeovers(thread) == []


def test_breaking_a_live_lease_is_audited(ledger: Ledger) -> None:
    thread = new_id("t")
    ledger.acquire_lease(thread, "worker-elsewhere", ttl=HOLD_TTL)
    taken = ledger.break_lease(thread, "operator", ttl=30.0)
    assert taken is not None and taken.owner == "operator"
    [takeover] = ledger.lease_takeovers(thread)
    assert (takeover.previous_owner, takeover.cause) == (
        "worker-elsewhere",
        LeaseTakeoverCause.FORCED,
    )
    assert ledger.break_lease(thread, "operator") is None  # already ours: nothing written
    assert ledger.break_lease(new_id("t"), "operator") is None  # nobody held it


def test_the_identity_survives_a_path_without_proc(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import langgraph_cancel.workers as workers

    monkeypatch.setattr(workers, "_PROC", tmp_path / "no-proc")
    workers._this_host.cache_clear()
    try:
        owner = new_worker_id()
        assert WorkerIdentity.parse(owner) is None  # host:pid:nonce, checkable nowhere
        assert owner.startswith(f"{socket.gethostname()}:{os.getpid()}:")
        assert not holder_is_gone(owner)
    finally:
        workers._this_host.cache_clear()

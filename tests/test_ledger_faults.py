"""Transient database faults: retried and never half-written; integrity errors never retried.

PostgreSQL: the ledger's connections are terminated (``pg_terminate_backend``)
while idle and in the middle of a write; a single closed connection makes the
write fail loudly after its retries. SQLite: another connection holds the write
lock (``BEGIN IMMEDIATE``) so the ledger sees ``database is locked``. Every
backend: an acknowledgement lost after the commit is recognised on retry, and a
duplicate key is refused at once.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from langgraph_cancel.errors import DuplicateIdempotencyKeyError, TransientDatabaseError
from langgraph_cancel.ledger import Ledger, PostgresBackend, SqliteBackend
from langgraph_cancel.ledger.retry import atransient_retry, is_transient, transient_retry
from langgraph_cancel.types import EffectKind, EffectRecord, EffectStatus, RunStatus
from ledger_util import make_effect, new_id

LOGGER = "langgraph_cancel.ledger"


class _SpyCursor:
    """A cursor that records every statement it runs."""

    def __init__(self, cur: Any, spy: _Spy) -> None:
        self._cur = cur
        self._spy = spy

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        self._spy.statements.append(" ".join(sql.split()))
        return self._cur.execute(sql, params)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> Any:
        return self._cur.fetchall()


class _Spy:
    """Wraps the backend's ``transaction`` (and ``statement``, where it has one).

    Records the statements run, and can fail the next unit of work with a
    transient error *after* it committed (an acknowledgement lost on the wire).
    """

    def __init__(self) -> None:
        self.units = 0
        self.statements: list[str] = []
        self.after_commit: BaseException | None = None

    def wrap(self, real: Callable[[], AbstractContextManager[Any]]) -> Callable[[], Any]:
        @contextmanager
        def unit() -> Iterator[_SpyCursor]:
            self.units += 1
            with real() as cur:
                yield _SpyCursor(cur, self)
            if self.after_commit is not None:
                exc, self.after_commit = self.after_commit, None
                raise exc

        return unit

    def count(self, fragment: str) -> int:
        return sum(1 for s in self.statements if fragment in s)


def spy_on(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> _Spy:
    spy = _Spy()
    backend = ledger.backend
    monkeypatch.setattr(backend, "transaction", spy.wrap(backend.transaction))
    if hasattr(backend, "statement"):
        monkeypatch.setattr(backend, "statement", spy.wrap(backend.statement))
    return spy


def retry_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    records = [r for r in caplog.records if r.name == LOGGER and "Retrying" in r.getMessage()]
    # A retry is logged under the name of what is retried, never as a repr with its
    # arguments.
    assert not [r.getMessage() for r in records if " object at 0x" in r.getMessage()]
    return records


def test_a_retried_call_is_logged_by_its_name_and_returns_once_it_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    faults = [sqlite3.OperationalError("database is locked")] * 2

    @transient_retry()
    def write_something(value: int) -> int:
        if faults:
            raise faults.pop()
        return value

    assert write_something(7) == 7
    messages = [r.getMessage() for r in retry_logs(caplog)]
    assert len(messages) == 2, messages
    assert all("write_something" in message for message in messages), messages


async def test_a_retried_coroutine_is_logged_by_its_name_and_returns_once_it_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    faults = [sqlite3.OperationalError("database is locked")] * 2

    @atransient_retry()
    async def write_something(value: int) -> int:
        if faults:
            raise faults.pop()
        return value

    assert await write_something(7) == 7
    messages = [r.getMessage() for r in retry_logs(caplog)]
    assert len(messages) == 2, messages
    assert all("write_something" in message for message in messages), messages


def transient_error_for(ledger: Ledger) -> BaseException:
    if ledger.backend.dialect == "postgres":
        import psycopg

        return psycopg.OperationalError("server closed the connection unexpectedly")
    return sqlite3.OperationalError("database is locked")


def test_transient_classification() -> None:
    import psycopg
    from psycopg import errors as pge
    from psycopg_pool import PoolClosed, PoolTimeout

    assert is_transient(sqlite3.OperationalError("database is locked"))
    assert is_transient(sqlite3.OperationalError("database table is busy"))
    assert not is_transient(sqlite3.OperationalError("no such table: lgc_effects"))
    assert not is_transient(sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert is_transient(psycopg.OperationalError("connection lost"))
    assert is_transient(pge.SerializationFailure("could not serialize access"))
    assert is_transient(pge.DeadlockDetected("deadlock detected"))
    assert is_transient(PoolTimeout("couldn't get a connection"))
    assert not is_transient(PoolClosed("the pool is already closed"))  # nothing to wait for
    assert not is_transient(pge.UniqueViolation("duplicate key"))
    assert not is_transient(pge.CheckViolation("lgc: run is already terminal"))
    assert not is_transient(ValueError("nope"))


# ------------------------------------------------------------------- every backend


def test_duplicate_key_is_not_retried(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Ledger.from_url(db_url) as ledger:
        thread = new_id("t")
        run = ledger.start_run(thread)
        ledger.plan(
            thread_id=thread,
            run_id=run.run_id,
            tool_call_id="c1",
            tool="refund",
            kind=EffectKind.IRREVERSIBLE,
            args={},
            idempotency_key="k-1",
        )
        spy = spy_on(ledger, monkeypatch)
        with pytest.raises(DuplicateIdempotencyKeyError):
            ledger.plan(
                thread_id=thread,
                run_id=run.run_id,
                tool_call_id="c2",
                tool="refund",
                kind=EffectKind.IRREVERSIBLE,
                args={},
                idempotency_key="k-1",
            )
        assert spy.count("INSERT INTO lgc_effects") == 1  # one attempt, no retry
        assert retry_logs(caplog) == []
        assert ledger.find_effect(thread, "c2") is None


def test_lost_acknowledgement_after_commit_is_not_doubled(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The write committed but the client saw a transient error: the retry recognises it.

    Checked for a plain move (approved -> dispatched) and for a self-transition
    (an unknown effect re-labelled), which a naive retry would apply twice.
    """
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Ledger.from_url(db_url) as ledger:
        thread = new_id("t")
        run = ledger.start_run(thread)
        approved = make_effect(ledger, EffectStatus.APPROVED, thread_id=thread, run_id=run.run_id)
        unknown = make_effect(ledger, EffectStatus.UNKNOWN, thread_id=thread, run_id=run.run_id)
        cases: list[tuple[EffectRecord, EffectStatus, dict[str, Any]]] = [
            (approved, EffectStatus.DISPATCHED, {}),
            (unknown, EffectStatus.UNKNOWN, {"owner": "finance", "next_action": "call the bank"}),
        ]
        for case_number, (rec, target, extra) in enumerate(cases, start=1):
            spy = spy_on(ledger, monkeypatch)
            spy.after_commit = transient_error_for(ledger)
            moved = ledger.transition(rec.effect_id, target, actor="worker", **extra)
            monkeypatch.undo()
            assert moved.status is target
            assert spy.units >= 2  # the committed attempt, then the retry
            assert len(retry_logs(caplog)) == case_number
            stored = ledger.get_effect(rec.effect_id)
            assert stored.version == rec.version + 1, target
            history = ledger.history(rec.effect_id)
            assert len(history) == rec.version + 1, history
            assert (history[-1].from_status, history[-1].to_status) == (rec.status, target)


def test_lost_acknowledgement_of_a_run_write_is_recognised(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancel request or a terminal transition that committed, then lost its ack:
    the retry says it won (runs carry a write token too), not that another writer did."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Ledger.from_url(db_url) as ledger:
        thread = new_id("t")
        run = ledger.start_run(thread)
        spy = spy_on(ledger, monkeypatch)
        spy.after_commit = transient_error_for(ledger)
        asked = ledger.request_cancel(thread, reason="user pressed stop", requested_by="ui")
        assert spy.units >= 2 and len(retry_logs(caplog)) == 1
        assert asked.accepted and asked.first, asked
        assert ledger.get_run(run.run_id).reason == "user pressed stop"
        # A second, genuine request is told the first reason won.
        again = ledger.request_cancel(thread, reason="other", requested_by="cli")
        assert again.accepted and not again.first
        spy.after_commit = transient_error_for(ledger)
        assert ledger.finish_run(run.run_id, RunStatus.CANCELLED) is True
        assert len(retry_logs(caplog)) == 2
        monkeypatch.undo()
        assert ledger.finish_run(run.run_id, RunStatus.CANCELLED) is False  # a repeat
        assert ledger.get_run(run.run_id).status is RunStatus.CANCELLED


def test_a_finish_that_lost_its_acknowledgement_still_gives_the_lease_back(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The finish and the lease's release committed together, then the ack was lost:
    the retry says this call ended the run, and the lease is gone."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Ledger.from_url(db_url) as ledger:
        thread = new_id("t")
        run = ledger.start_run(thread, owner="w1", lease_ttl=30)
        spy = spy_on(ledger, monkeypatch)
        spy.after_commit = transient_error_for(ledger)
        assert ledger.finish_run(run.run_id, RunStatus.COMPLETED, release_lease="w1") is True
        monkeypatch.undo()
        assert len(retry_logs(caplog)) == 1
        assert ledger.lease(thread) is None
        assert ledger.get_run(run.run_id).status is RunStatus.COMPLETED


# -------------------------------------------------------------------------- SQLite


def _locked_ledger(tmp_path: Path) -> tuple[Ledger, str]:
    path = str(tmp_path / "locked.db")
    ledger = Ledger(SqliteBackend(path, busy_timeout_ms=10))
    ledger.setup()
    return ledger, path


def test_sqlite_locked_database_is_retried_until_released(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ledger, path = _locked_ledger(tmp_path)
    with ledger:
        thread = new_id("t")
        run = ledger.start_run(thread)
        rec = make_effect(ledger, EffectStatus.PLANNED, thread_id=thread, run_id=run.run_id)
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        timer = threading.Timer(0.2, lambda: holder.execute("ROLLBACK"))
        timer.start()
        try:
            t0 = time.monotonic()
            moved = ledger.transition(rec.effect_id, EffectStatus.APPROVED, actor="w")
            elapsed = time.monotonic() - t0
        finally:
            timer.join()
            holder.close()
        assert moved.status is EffectStatus.APPROVED
        assert elapsed >= 0.15  # it waited for the lock instead of failing
        logs = retry_logs(caplog)
        assert logs and all("locked" in r.getMessage() for r in logs)
        history = ledger.history(rec.effect_id)
        assert [h.to_status for h in history] == [EffectStatus.PLANNED, EffectStatus.APPROVED]


def test_sqlite_lock_held_past_all_retries_raises_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ledger, path = _locked_ledger(tmp_path)
    with ledger:
        thread = new_id("t")
        run = ledger.start_run(thread)
        rec = make_effect(ledger, EffectStatus.PLANNED, thread_id=thread, run_id=run.run_id)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(TransientDatabaseError, match="locked") as info:
                ledger.transition(rec.effect_id, EffectStatus.APPROVED)
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert len(retry_logs(caplog)) == 5  # six attempts in all, then it gives up loudly
        stored = ledger.get_effect(rec.effect_id)
        assert stored.status is EffectStatus.PLANNED and stored.version == rec.version
        assert len(ledger.history(rec.effect_id)) == 1


# ---------------------------------------------------------------------- PostgreSQL


def _terminate(admin_url: str, pids: list[int]) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while True:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()
            if row is not None and row[0] == 0:
                return
            assert time.monotonic() < deadline, "backends did not terminate"
            time.sleep(0.01)


def _ledger_pids(pg_url: str) -> list[int]:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    return [r[0] for r in rows]


@contextmanager
def _killed_mid_write(pg_url: str) -> Iterator[list[int]]:
    """Kill the ledger's connection while its write is in progress, once.

    Another session holds ``lgc_transitions`` in EXCLUSIVE mode, so the ledger's
    write blocks on the audit insert (after changing the effect row, when the
    update and the audit are two statements of one transaction). A watcher
    terminates the blocked backend, then releases the lock so the retry can pass.
    Yields the list of pids it killed.
    """
    import psycopg

    locker = psycopg.connect(pg_url)
    locker.execute("LOCK TABLE lgc_transitions IN EXCLUSIVE MODE")
    killed: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        try:
            with psycopg.connect(pg_url, autocommit=True) as watcher:
                while not stop.is_set():
                    rows = watcher.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                    ).fetchall()
                    if rows:
                        pids = [r[0] for r in rows]
                        _terminate(pg_url, pids)
                        killed.extend(pids)
                        return
                    time.sleep(0.005)
        finally:
            locker.rollback()  # release the lock: the retry may proceed

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        stop.set()
        thread.join(timeout=30)
        locker.close()


@pytest.mark.postgres
def test_postgres_killed_idle_connections_are_replaced(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Ledger.from_url(pg_url) as ledger:
        thread = new_id("t")
        run = ledger.start_run(thread)
        rec = make_effect(ledger, EffectStatus.APPROVED, thread_id=thread, run_id=run.run_id)
        pids = _ledger_pids(pg_url)
        assert pids, "the ledger's pool holds connections"
        _terminate(pg_url, pids)
        moved = ledger.transition(rec.effect_id, EffectStatus.DISPATCHED, actor="worker")
        assert moved.status is EffectStatus.DISPATCHED
        history = ledger.history(rec.effect_id)
        assert [h.to_status for h in history].count(EffectStatus.DISPATCHED) == 1
        assert ledger.get_effect(rec.effect_id).version == rec.version + 1
        assert set(_ledger_pids(pg_url)).isdisjoint(pids)


@pytest.mark.postgres
def test_postgres_connection_killed_mid_write_is_retried_and_not_half_written(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import psycopg

    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Ledger.from_url(pg_url) as ledger:
        thread = new_id("t")
        run = ledger.start_run(thread)
        rec = make_effect(ledger, EffectStatus.APPROVED, thread_id=thread, run_id=run.run_id)
        with _killed_mid_write(pg_url) as killed:
            moved = ledger.transition(rec.effect_id, EffectStatus.DISPATCHED, actor="worker")
        assert killed, "the fault was injected"
        assert moved.status is EffectStatus.DISPATCHED
        logs = retry_logs(caplog)
        assert len(logs) == 1 and "_transition" in logs[0].getMessage()
        # Read back through a fresh connection: status, version and audit trail agree.
        with psycopg.connect(pg_url) as check:
            status, version = check.execute(
                "SELECT status, version FROM lgc_effects WHERE effect_id = %s", (rec.effect_id,)
            ).fetchone() or (None, None)
            audit = check.execute(
                "SELECT from_status, to_status, actor FROM lgc_transitions "
                "WHERE effect_id = %s ORDER BY id",
                (rec.effect_id,),
            ).fetchall()
        assert (status, version) == ("dispatched", rec.version + 1)
        assert audit[-1] == ("approved", "dispatched", "worker")
        assert len(audit) == rec.version + 1  # one audit row per transition, no more


@pytest.mark.postgres
def test_postgres_killed_mid_plan_is_retried_once(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Ledger.from_url(pg_url) as ledger:
        thread = new_id("t")
        run = ledger.start_run(thread)
        with _killed_mid_write(pg_url) as killed:
            rec, created = ledger.plan(
                thread_id=thread,
                run_id=run.run_id,
                tool_call_id="c1",
                tool="refund",
                kind=EffectKind.IRREVERSIBLE,
                args={"amount": 1},
            )
        assert killed, "the fault was injected"
        assert rec.status is EffectStatus.PLANNED
        assert created  # the killed attempt left nothing behind, so the retry created it
        assert len(retry_logs(caplog)) == 1
        assert [e.effect_id for e in ledger.effects(thread)] == [rec.effect_id]
        assert len(ledger.history(rec.effect_id)) == 1


@pytest.mark.postgres
def test_postgres_closed_single_connection_raises_after_retries(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import psycopg

    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Ledger.from_url(pg_url) as setup_ledger:
        thread = new_id("t")
        run = setup_ledger.start_run(thread)
        rec = make_effect(setup_ledger, EffectStatus.PLANNED, thread_id=thread, run_id=run.run_id)
    conn = psycopg.connect(pg_url, autocommit=True)
    ledger = Ledger(PostgresBackend(conn))
    assert ledger.get_effect(rec.effect_id).status is EffectStatus.PLANNED
    conn.close()
    with pytest.raises(TransientDatabaseError) as info:
        ledger.transition(rec.effect_id, EffectStatus.APPROVED)
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    assert len(retry_logs(caplog)) == 5  # six attempts in all, then it gives up loudly
    with Ledger.from_url(pg_url, setup=False) as check:
        stored = check.get_effect(rec.effect_id)
        assert stored.status is EffectStatus.PLANNED and stored.version == rec.version
        assert len(check.history(rec.effect_id)) == 1


def test_a_closed_postgres_ledger_fails_at_once(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Using a ledger after ``close()`` is a caller's error: no retries, no backoff."""
    from psycopg_pool import PoolClosed

    caplog.set_level(logging.WARNING, logger=LOGGER)
    ledger = Ledger.from_url(pg_url)
    ledger.close()
    with pytest.raises(PoolClosed):
        ledger.start_run(new_id("t"))
    assert retry_logs(caplog) == []

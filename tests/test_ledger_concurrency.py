"""Races on the ledger: every one must have exactly one winner, on every backend.

Threads race through several ``Ledger`` objects where the backend allows it
(SQLite: one connection per ledger, so the file lock is contended; PostgreSQL:
pools of connections); the in-memory database exists once per ``Ledger``, so its
threads share one. Processes race on SQLite and PostgreSQL only: an in-memory
database cannot be shared between processes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import langgraph_cancel.ledger.core as ledger_module
from fork_server import ensure_fork_server
from langgraph_cancel.errors import (
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    TransitionConflictError,
)
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.backends import enable_wal
from langgraph_cancel.types import (
    CANCEL_STATUSES,
    EFFECT_TRANSITIONS,
    CancelRequestResult,
    EffectKind,
    EffectRecord,
    EffectStatus,
    RunStatus,
)
from ledger_util import make_effect, new_id, open_fresh_sqlite_file

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def racers(db_url: str) -> Iterator[list[Ledger]]:
    """Ledgers on the same database for racing threads to pick from (index % len)."""
    first = Ledger.from_url(db_url)
    extra: list[Ledger] = []
    if db_url.startswith("sqlite:///"):
        extra = [Ledger.from_url(db_url, setup=False) for _ in range(7)]
    elif db_url.startswith("postgresql://"):
        extra = [Ledger.from_url(db_url, setup=False) for _ in range(3)]
    try:
        yield [first, *extra]
    finally:
        for led in (first, *extra):
            led.close()


def race(count: int, fn: Callable[[int], T]) -> list[T | BaseException]:
    """Run ``fn(index)`` in ``count`` threads released together; return results or exceptions."""
    barrier = threading.Barrier(count)
    results: list[T | BaseException | None] = [None] * count

    def body(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = fn(index)
        except BaseException as exc:
            results[index] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
        assert not th.is_alive(), "a racing thread hung"
    return [r for r in results if r is not None]


def test_50_threads_racing_the_same_compare_and_set(racers: list[Ledger]) -> None:
    ledger = racers[0]
    thread = new_id("t")
    run = ledger.start_run(thread)
    rec = make_effect(ledger, EffectStatus.PLANNED, thread_id=thread, run_id=run.run_id)

    def approve(racer_index: int) -> EffectRecord:
        return racers[racer_index % len(racers)].transition(
            rec.effect_id,
            EffectStatus.APPROVED,
            expected=[EffectStatus.PLANNED],
            actor=f"racer-{racer_index}",
        )

    results = race(50, approve)
    assert len(results) == 50
    wins = [r for r in results if isinstance(r, EffectRecord)]
    losses = [r for r in results if not isinstance(r, EffectRecord)]
    assert len(wins) == 1, results
    assert all(isinstance(e, IllegalTransitionError) for e in losses), losses
    final = ledger.get_effect(rec.effect_id)
    assert final.status is EffectStatus.APPROVED and final.version == 2
    history = ledger.history(rec.effect_id)
    approvals = [h for h in history if h.to_status is EffectStatus.APPROVED]
    assert len(approvals) == 1
    assert approvals[0].from_status is EffectStatus.PLANNED
    assert approvals[0].actor == f"racer-{results.index(wins[0])}"
    assert len(history) == 2


def test_50_workers_dispatching_the_same_effect_one_wins(racers: list[Ledger]) -> None:
    """Invariant I2 at the ledger: only one worker may move an effect to ``dispatched``."""
    ledger = racers[0]
    thread = new_id("t")
    run = ledger.start_run(thread)
    rec = make_effect(ledger, EffectStatus.APPROVED, thread_id=thread, run_id=run.run_id)

    def dispatch(racer_index: int) -> EffectRecord:
        return racers[racer_index % len(racers)].transition(
            rec.effect_id, EffectStatus.DISPATCHED, actor=f"worker-{racer_index}"
        )

    results = race(50, dispatch)
    wins = [r for r in results if isinstance(r, EffectRecord)]
    losses = [r for r in results if not isinstance(r, EffectRecord)]
    assert len(wins) == 1, results
    assert all(isinstance(e, TransitionConflictError) for e in losses), losses
    history = ledger.history(rec.effect_id)
    assert [h.to_status for h in history].count(EffectStatus.DISPATCHED) == 1
    assert ledger.get_effect(rec.effect_id).version == rec.version + 1


def test_50_threads_racing_different_targets_from_the_same_status(racers: list[Ledger]) -> None:
    ledger = racers[0]
    thread = new_id("t")
    run = ledger.start_run(thread)
    rec = make_effect(ledger, EffectStatus.PLANNED, thread_id=thread, run_id=run.run_id)
    targets = [
        EffectStatus.APPROVED,
        EffectStatus.DROPPED,
        EffectStatus.PENDING_APPROVAL,
        EffectStatus.DISPATCHED,
        EffectStatus.REJECTED,
    ]

    def move(racer_index: int) -> EffectRecord:
        return racers[racer_index % len(racers)].transition(
            rec.effect_id,
            targets[racer_index % len(targets)],
            expected=[EffectStatus.PLANNED],
            actor=f"racer-{racer_index}",
        )

    results = race(50, move)
    wins = [r for r in results if isinstance(r, EffectRecord)]
    losses = [r for r in results if not isinstance(r, EffectRecord)]
    assert len(wins) == 1, results
    assert all(isinstance(e, IllegalTransitionError) for e in losses), losses
    winner = wins[0].status
    # A loser whose move is still legal from the winner's status lost a race and is
    # told so (TransitionConflictError); the others get a plain IllegalTransitionError.
    for racer_index, res in enumerate(results):
        if isinstance(res, EffectRecord):
            continue
        target = targets[racer_index % len(targets)]
        if target in EFFECT_TRANSITIONS[winner]:
            assert isinstance(res, TransitionConflictError), (winner, target, res)
        else:
            assert type(res) is IllegalTransitionError, (winner, target, res)
    history = ledger.history(rec.effect_id)
    assert [h.to_status for h in history] == [EffectStatus.PLANNED, winner]
    assert ledger.get_effect(rec.effect_id).version == 2


def test_unique_idempotency_key_under_concurrent_inserts(racers: list[Ledger]) -> None:
    ledger = racers[0]
    thread = new_id("t")
    run = ledger.start_run(thread)

    def plan(racer_index: int) -> tuple[EffectRecord, bool]:
        return racers[racer_index % len(racers)].plan(
            thread_id=thread,
            run_id=run.run_id,
            tool_call_id=f"call-{racer_index}",
            tool="refund",
            kind=EffectKind.IRREVERSIBLE,
            args={"i": racer_index},
            idempotency_key="refund-r-4471",
        )

    results = race(20, plan)
    created = [r for r in results if isinstance(r, tuple)]
    refused = [r for r in results if not isinstance(r, tuple)]
    assert len(created) == 1 and created[0][1] is True, results
    assert len(refused) == 19
    assert all(isinstance(e, DuplicateIdempotencyKeyError) for e in refused), refused
    winner = created[0][0]
    assert all(
        isinstance(e, DuplicateIdempotencyKeyError)
        and e.existing_effect_id in (winner.effect_id, None)
        for e in refused
    )
    rows = ledger.effects(thread)
    assert [r.effect_id for r in rows] == [winner.effect_id]
    assert ledger.effect_by_key("refund-r-4471") == winner


def test_same_tool_call_planned_concurrently_yields_one_row(racers: list[Ledger]) -> None:
    ledger = racers[0]
    thread = new_id("t")
    run = ledger.start_run(thread)

    def plan(racer_index: int) -> tuple[EffectRecord, bool]:
        return racers[racer_index % len(racers)].plan(
            thread_id=thread,
            run_id=run.run_id,
            tool_call_id="call-1",
            tool="refund",
            kind=EffectKind.IRREVERSIBLE,
            args={"amount": 5},
        )

    results = race(20, plan)
    assert all(isinstance(r, tuple) for r in results), results
    pairs = [r for r in results if isinstance(r, tuple)]
    assert sum(1 for _, created in pairs if created) == 1
    assert len({rec.effect_id for rec, _ in pairs}) == 1
    assert len(ledger.effects(thread)) == 1
    assert len(ledger.history(pairs[0][0].effect_id)) == 1


def test_100_concurrent_cancel_requests_have_one_first(racers: list[Ledger]) -> None:
    ledger = racers[0]
    thread = new_id("t")
    run = ledger.start_run(thread)

    def cancel(racer_index: int) -> CancelRequestResult:
        return racers[racer_index % len(racers)].request_cancel(
            thread, reason=f"reason-{racer_index}", requested_by=f"user-{racer_index}"
        )

    results = race(100, cancel)
    answers = [r for r in results if isinstance(r, CancelRequestResult)]
    assert len(answers) == 100, [r for r in results if not isinstance(r, CancelRequestResult)]
    firsts = [a for a in answers if a.first]
    assert len(firsts) == 1
    winner = firsts[0]
    assert winner.reason == f"reason-{answers.index(winner)}"
    assert all(a.accepted and a.run_id == run.run_id for a in answers)
    # Everyone is told the first reason, and that the run is on its way to stopping.
    assert {a.reason for a in answers} == {winner.reason}
    assert all(a.status in CANCEL_STATUSES for a in answers)
    stored = ledger.get_run(run.run_id)
    assert stored.status is RunStatus.CANCEL_REQUESTED
    assert (stored.reason, stored.requested_by) == (
        winner.reason,
        f"user-{answers.index(winner)}",
    )


def test_50_threads_racing_finish_run(racers: list[Ledger]) -> None:
    ledger = racers[0]
    thread = new_id("t")
    run = ledger.start_run(thread)
    statuses = [RunStatus.COMPLETED, RunStatus.FAILED]

    def finish(racer_index: int) -> bool:
        return racers[racer_index % len(racers)].finish_run(run.run_id, statuses[racer_index % 2])

    results = race(50, finish)
    assert all(isinstance(r, bool) for r in results), results
    assert results.count(True) == 1
    winner = statuses[results.index(True) % 2]
    assert ledger.get_run(run.run_id).status is winner


# ------------------------------------------------------------------ two processes

# The racer imports only the ledger: a bare package module stands in for
# ``langgraph_cancel/__init__.py`` (which pulls in LangGraph and the graph layer, seconds
# of start-up that have nothing to do with the race).
_FINISHER = """
import json, os, sys, time, types
pkg = types.ModuleType("langgraph_cancel")
pkg.__path__ = [os.environ["LGC_PACKAGE_DIR"]]
sys.modules["langgraph_cancel"] = pkg
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.backends import enable_wal

url, status, ready, go = sys.argv[1:5]
run_ids = sys.argv[5:]
ledger = Ledger.from_url(url, setup=False)
ledger.get_run(run_ids[0])  # connect before the start line
open(ready, "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("no go signal")
    time.sleep(0.001)
out = [ledger.finish_run(r, status) for r in run_ids]
ledger.close()
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_two_processes_racing_terminal_transitions(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url: str = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    with Ledger.from_url(url) as ledger:
        runs = [ledger.start_run(new_id("t")).run_id for _ in range(25)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *sys.path]),
            "LGC_PACKAGE_DIR": str(Path(ledger_module.__file__ or "").resolve().parent.parent),
        }
        go = tmp_path / "go"
        procs: list[tuple[RunStatus, subprocess.Popen[str], Path]] = []
        for status in (RunStatus.COMPLETED, RunStatus.FAILED):
            ready = tmp_path / f"ready-{status.value}"
            proc = subprocess.Popen(
                [sys.executable, "-c", _FINISHER, url, status.value, str(ready), str(go), *runs],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            procs.append((status, proc, ready))
        try:
            deadline = time.monotonic() + 60
            while not all(ready.exists() for _, _, ready in procs):
                for _, proc, _ in procs:
                    if proc.poll() is not None:
                        pytest.fail(f"racer exited early: {proc.communicate()[1]}")
                assert time.monotonic() < deadline, "racers never got ready"
                time.sleep(0.01)
            go.touch()
            outcomes: dict[RunStatus, list[bool]] = {}
            for status, proc, _ in procs:
                out, err = proc.communicate(timeout=60)
                assert proc.returncode == 0, err
                outcomes[status] = json.loads(out.strip().splitlines()[-1])
        finally:
            for _, proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

        done, failed = outcomes[RunStatus.COMPLETED], outcomes[RunStatus.FAILED]
        assert len(done) == len(failed) == len(runs)
        for run_id, completed_won, failed_won in zip(runs, done, failed, strict=True):
            # exactly one process made the transition
            assert completed_won != failed_won, (run_id, completed_won, failed_won)
            expected = RunStatus.COMPLETED if completed_won else RunStatus.FAILED
            assert ledger.get_run(run_id).status is expected


def test_processes_opening_a_fresh_sqlite_file_together(tmp_path: Path) -> None:
    """Workers started together on a file that does not exist yet all open it.

    Only one of several connections switching a fresh file to WAL gets the lock;
    SQLite tells the others "database is locked" at once, without its busy
    timeout. A worker must not die of that (found by CI in the forked-worker test).
    The racers come from the fork server: ``fork`` from this multi-threaded process
    could copy a lock another thread holds.
    """
    forked = multiprocessing.get_context("forkserver")
    forked.set_forkserver_preload(["ledger_util"])  # when the server starts here
    ensure_fork_server()
    for round_ in range(12):
        path, gate = str(tmp_path / f"fresh-{round_}.db"), str(tmp_path / f"go-{round_}")
        results = forked.Queue()
        procs = [
            forked.Process(target=open_fresh_sqlite_file, args=(path, gate, results))
            for _ in range(4)
        ]
        for proc in procs:
            proc.start()
        time.sleep(0.05)
        Path(gate).touch()
        outcomes = [results.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        assert outcomes == ["ok"] * len(procs), (round_, outcomes)
        with Ledger.from_url(f"sqlite:///{path}", setup=False) as ledger:
            assert len(ledger.runs_by_status(RunStatus.RUNNING)) == len(procs)


def test_enable_wal_waits_for_a_lock_the_busy_handler_would_not(tmp_path: Path) -> None:
    path = str(tmp_path / "locked.db")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    conn = sqlite3.connect(path, timeout=0, check_same_thread=False)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            enable_wal(conn, timeout=0.1)
        release = threading.Timer(0.3, holder.execute, args=("COMMIT",))
        release.start()
        enable_wal(conn, timeout=10)
        release.join()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
        holder.close()

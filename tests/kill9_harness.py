"""The kill -9 suite's harness: worker processes, the world they run in, the invariants.

Each scenario runs the refund agent (``tests/recovery_worker.py``) in a real
process against a ledger on SQLite or PostgreSQL and fake providers that keep
their own truth in their own SQLite file (``langgraph_cancel/demo/providers/``).
:class:`World` is one test's databases and starts the workers; :class:`Job` is
one worker: wait for its kill point, SIGKILL it, read its result and the answers
it wrote before resuming. The checks of the invariants (I2, I3, I6, I7) compare
the ledger, the report and those answers with the providers' truth.

Import the fixtures into a test module (``from kill9_harness import
_fork_server, world_fixture, ...``: pytest registers the fixtures it finds in a
module's namespace, under their ``name=``): ``world`` is parametrised over
SQLite and PostgreSQL, ``sqlite_world`` is SQLite only.

Worker processes are forked from a ``multiprocessing`` fork server that has
the heavy imports preloaded (a cold interpreter takes seconds to import
LangGraph; a fork takes milliseconds), so the suite stays in budget.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import recovery_worker as rw
from fork_server import ensure_fork_server
from kill_points import Points
from langgraph_cancel import EffectStatus, Ledger, get_report
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.demo.tools import compensation_key
from langgraph_cancel.ledgers import forget_url

POLL = 0.02
MARKER_TIMEOUT = 30.0
JOB_TIMEOUT = 60.0

CTX = multiprocessing.get_context("forkserver")
CTX.set_forkserver_preload(["recovery_worker"])
HERE = Path(__file__).resolve().parent

IRREVERSIBLE_OPS = {"refund", "send_email", "post_message"}
REVERSIBLE_OPS = {"update_order", "create_ticket"}
COMPENSATING_OPS = {"restore_order", "close_ticket"}
SETTLED_OK = {
    EffectStatus.COMMITTED,
    EffectStatus.COMPENSATED,
    EffectStatus.COMPENSATION_FAILED,
    EffectStatus.FAILED,
    EffectStatus.NOT_APPLIED,
    EffectStatus.DROPPED,
    EffectStatus.REJECTED,
}


# ---------------------------------------------------------------------------- harness
@pytest.fixture(scope="module", autouse=True)
def _fork_server() -> Iterator[None]:
    """Start the fork server with the worker module (and LangGraph) imported once
    (``fork_server``)."""
    ensure_fork_server()
    yield


@dataclass
class Job:
    """One worker process."""

    world: World
    spec: dict[str, Any]
    proc: Any

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def _file(self, suffix: str) -> Path:
        return self.world.tmp / f"{self.name}.{suffix}"

    def log(self) -> str:
        path = self._file("log")
        return path.read_text()[-6000:] if path.exists() else "(no log)"

    def wait_point(
        self, point: str, suffix: str = "reached", timeout: float = MARKER_TIMEOUT
    ) -> None:
        """Poll for the point's marker file (the worker is blocked or paused there)."""
        marker = self.world.tmp / Points.file_name(self.name, point, suffix)
        deadline = time.monotonic() + timeout
        while not marker.exists():
            if not self.proc.is_alive():
                pytest.fail(
                    f"{self.name} exited before {point} ({self.proc.exitcode}):\n"
                    f"{self.result_text()}\n{self.log()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name} never reached {point}:\n{self.log()}")
            time.sleep(POLL)

    def go(self, point: str) -> None:
        """Let a paused worker continue."""
        (self.world.tmp / Points.file_name(self.name, point, "go")).write_text("go")

    def kill9(self) -> None:
        """SIGKILL the worker and make sure it died of it."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)
        assert self.proc.exitcode == -signal.SIGKILL, (self.proc.exitcode, self.log())
        assert not self._file("result.json").exists(), "a killed worker wrote a result"

    def result_text(self) -> str:
        path = self._file("result.json")
        return path.read_text() if path.exists() else "(no result)"

    def result(self, timeout: float = JOB_TIMEOUT) -> dict[str, Any]:
        """Wait for the worker to finish; its JSON result."""
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
            pytest.fail(f"{self.name} did not finish within {timeout}s:\n{self.log()}")
        path = self._file("result.json")
        if not path.exists():
            pytest.fail(f"{self.name} wrote no result (exit {self.proc.exitcode}):\n{self.log()}")
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def ok(self, timeout: float = JOB_TIMEOUT) -> dict[str, Any]:
        """The result of a job that must have succeeded."""
        data = self.result(timeout)
        assert data.get("ok"), f"{self.name} failed: {data}\n{self.log()}"
        return data

    def answers(self) -> dict[str, Any]:
        """The three answers the (recovering) job wrote before it resumed anything."""
        data: dict[str, Any] = json.loads(self._file("answers.json").read_text())
        return data


@dataclass
class World:
    """One test's databases: the agent's (ledger + checkpoints) and the providers'."""

    tmp: Path
    db_url: str
    backend: str = "sqlite"
    thread_id: str = field(default_factory=lambda: f"t-{uuid.uuid4().hex[:10]}")
    jobs: list[Job] = field(default_factory=list)
    opened: list[Ledger] = field(default_factory=list)

    @property
    def providers_path(self) -> Path:
        return self.tmp / "providers.db"

    def providers(self) -> Providers:
        return Providers(self.providers_path)

    def ledger(self) -> Ledger:
        """A ledger on the agent's database, closed with the world."""
        ledger = Ledger.from_url(self.db_url)
        self.opened.append(ledger)
        return ledger

    def start(self, name: str, action: str, **options: Any) -> Job:
        spec: dict[str, Any] = {
            "name": name,
            "action": action,
            "db_url": self.db_url,
            "providers": str(self.providers_path),
            "thread_id": self.thread_id,
            "worker_id": f"worker-{name}",
            "workdir": str(self.tmp),
            "lease_ttl": 1.0,
            **options,
        }
        proc = CTX.Process(target=rw.main_job, args=(spec,), name=name, daemon=True)
        proc.start()
        job = Job(self, spec, proc)
        self.jobs.append(job)
        return job

    def stop_all(self) -> None:
        for job in self.jobs:
            if job.proc.is_alive():
                job.proc.kill()
                job.proc.join(5)
        for ledger in self.opened:
            ledger.close()
        forget_url(self.db_url)  # the package's own ledger for the URL, if the test used it


@pytest.fixture(
    name="world",
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ],
)
def world_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    """A fresh agent database (SQLite file or PostgreSQL database) and providers' file."""
    if request.param == "sqlite":
        url = "sqlite:///" + str((tmp_path / "agent.db").resolve())
    else:
        url = request.getfixturevalue("pg_url")
    new_world = World(tmp_path, url, request.param)
    Providers(new_world.providers_path)  # create and seed before any worker races to
    try:
        yield new_world
    finally:
        new_world.stop_all()


@pytest.fixture(name="sqlite_world")
def sqlite_world_fixture(tmp_path: Path) -> Iterator[World]:
    """A world on SQLite only (tests whose subject is not the backend)."""
    new_world = World(tmp_path, "sqlite:///" + str((tmp_path / "agent.db").resolve()))
    Providers(new_world.providers_path)
    try:
        yield new_world
    finally:
        new_world.stop_all()


# ------------------------------------------------------------------- the invariants
def applied_keys(truth: dict[str, Any], ops: set[str] | None = None) -> set[str]:
    """Keys the providers applied (optionally only for some operations)."""
    return {
        k
        for k, v in truth["keys"].items()
        if v["executions"] >= 1 and (ops is None or v["operation"] in ops)
    }


def assert_no_double_execution(truth: dict[str, Any]) -> None:
    """I2: the providers applied no key twice."""
    doubled = {k: v for k, v in truth["keys"].items() if v["executions"] > 1}
    assert not doubled, f"keys executed twice: {doubled}"
    assert len({r["key"] for r in truth["refunds"]}) == len(truth["refunds"])
    assert len({e["key"] for e in truth["emails"]}) == len(truth["emails"])


def assert_settled(ledger: Ledger, thread_id: str) -> None:
    """I3: every effect settled, or unknown with an owner and a next action."""
    for record in ledger.effects(thread_id):
        if record.status is EffectStatus.UNKNOWN:
            assert record.owner and record.next_action, (
                f"unknown without owner/next action: {record}"
            )
        else:
            assert record.status in SETTLED_OK, (
                f"{record.tool} left {record.status.value}: {record}"
            )


def assert_report_matches_truth(world: World, truth: dict[str, Any]) -> Any:
    """I6: the report's permanent / reversible / compensated effects are the providers' truth."""
    report = get_report(world.db_url, world.thread_id)
    keys = applied_keys(truth)
    compensated = {k for k in keys if compensation_key(k) in keys}
    permanent = applied_keys(truth, IRREVERSIBLE_OPS)
    reversible = applied_keys(truth, REVERSIBLE_OPS)
    assert {e.idempotency_key for e in report.permanent} == permanent, report.permanent
    assert {e.idempotency_key for e in report.compensated} == compensated
    assert {e.idempotency_key for e in report.reversible_committed} == reversible - compensated
    assert not report.compensation_failed
    assert report.dispatched_after_cancel == 0
    # Nothing the report calls "not run" or "unknown" was applied by a provider.
    for entry in [*report.not_run, *report.unknown]:
        assert entry.idempotency_key not in keys, entry
    return report


def assert_answers_match_truth(
    answers: dict[str, Any], truth_at_kill: dict[str, Any], ledger: Ledger, thread_id: str
) -> None:
    """I7: what the new process read from the database alone agrees with the world."""
    applied = applied_keys(truth_at_kill) - {
        k for k, v in truth_at_kill["keys"].items() if v["operation"] in COMPENSATING_OPS
    }
    committed = set(answers["committed"])
    maybe = set(answers["may_have_been_committed"])
    # Everything the ledger calls committed did happen ...
    assert committed <= applied, (committed, applied)
    # ... and everything that happened is committed or flagged as "may have been".
    assert applied <= committed | maybe, (applied, committed, maybe)
    # "What was done": every step the checkpoint holds an answer for is in the ledger.
    recorded = {e.tool_call_id for e in ledger.effects(thread_id)}
    assert set(answers["done"]["steps_checkpointed"]) <= recorded
    # "What is next": the run is not over, so resuming it (after settling what is in doubt).
    nxt = answers["next"]
    assert answers["run"] is not None and answers["run"]["status"] in (
        "running",
        "cancel_requested",
        "cancelling",
    ), answers["run"]
    in_doubt = {e.effect_id for e in ledger.effects(thread_id) if e.idempotency_key in maybe}
    assert in_doubt <= set(nxt["reconcile_first"])

    # The same three questions as `langgraph-cancel status THREAD --json` answers them.
    cli = answers["cli_status"]
    assert cli["exit"] == 0, cli
    status = cli["data"]
    cli_committed = {e["idempotency_key"] for e in status["committed"]}
    cli_maybe = {e["idempotency_key"] for e in status["maybe_committed"]}
    assert cli_committed <= applied, (cli_committed, applied)
    assert applied <= cli_committed | cli_maybe, (applied, cli_committed, cli_maybe)
    assert maybe <= cli_maybe
    assert status["lease"] is None or not status["lease"]["live"], status["lease"]
    assert any("resume" in step for step in status["next_steps"]), status["next_steps"]
    assert bool(status["interrupts"]) == bool(nxt["interrupts"])


def effect_of(ledger: Ledger, thread_id: str, tool: str) -> Any:
    found = [e for e in ledger.effects(thread_id) if e.tool == tool]
    assert len(found) == 1, (tool, found)
    return found[0]

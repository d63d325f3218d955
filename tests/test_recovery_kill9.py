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

Also here: two workers started on one thread at once (with distinct ids, and
forked from one parent without ids), a killed worker's lease expiring and
being reaped and taken over, and reconcile hooks that raise, hang, or return
garbage.

Worker processes are forked from a ``multiprocessing`` fork server that has
the heavy imports preloaded (a cold interpreter takes seconds to import
LangGraph; a fork takes milliseconds), so the whole file stays in budget.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import recovery_worker as rw
from langgraph_cancel import EffectStatus, Ledger, get_report, request_cancel
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.demo.tools import compensation_key, refund_key
from langgraph_cancel.recovery import reap_expired_leases
from langgraph_cancel.types import utcnow

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
    """Start the fork server with the worker module (and LangGraph) imported once.

    Python 3.11's fork server ignores the parent's ``sys.path`` when it preloads
    (the preload then fails silently and every worker pays the imports again),
    so it is started with ``PYTHONPATH`` naming the tests and the repository.
    """
    from multiprocessing import forkserver

    old = os.environ.get("PYTHONPATH")
    paths = [str(HERE), str(HERE.parent), *([old] if old else [])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    try:
        forkserver.ensure_running()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
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
        marker = self.world.tmp / rw.Points.file_name(self.name, point, suffix)
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
        (self.world.tmp / rw.Points.file_name(self.name, point, "go")).write_text("go")

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


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
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


@pytest.fixture
def sqlite_world(tmp_path: Path) -> Iterator[World]:
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


# ------------------------------------------------------------------- the boundaries
@dataclass(frozen=True)
class Boundary:
    """Where the worker dies, and what the world must look like afterwards."""

    id: str
    kill_at: str
    refund_amount: float = rw.REFUND_AMOUNT  # over 100: ApprovalGate asks a reviewer first
    cancel_after: str | None = None  # pause here, request a cancel, continue
    compensate: bool = False
    hang_refund: bool = False
    in_doubt_at_kill: tuple[str, ...] = ()  # tools whose effect is dispatched at the kill
    resent_ops: tuple[str, ...] = ()  # provider operations legitimately sent twice (deduped)
    slow_checkpoints: float = 0.0  # seconds each checkpoint write takes in the killed worker

    @property
    def approval(self) -> bool:
        return self.refund_amount > 100

    @property
    def refund_key(self) -> str:
        return refund_key({"order_id": rw.ORDER, "amount": self.refund_amount})


BOUNDARIES = [
    Boundary("before_intent", "before:dispatched:issue_refund"),
    Boundary(
        "after_intent_before_call",
        "after:dispatched:issue_refund",
        in_doubt_at_kill=("issue_refund",),
    ),
    Boundary(
        "during_call", "before_call:refund", hang_refund=True, in_doubt_at_kill=("issue_refund",)
    ),
    Boundary(
        "after_call_before_outcome",
        "before:committed:issue_refund",
        in_doubt_at_kill=("issue_refund",),
    ),
    Boundary("after_outcome_before_checkpoint", "after:committed:send_email"),
    # The saved checkpoint lags the ledger by whole steps (async durability, slow disk).
    # The write that records the refund's outcome also records the email's intent.
    Boundary(
        "checkpoint_steps_behind",
        "after:committed:issue_refund",
        slow_checkpoints=1.0,
        in_doubt_at_kill=("send_email",),
    ),
    Boundary("approval_pending", "interrupted", refund_amount=120.0),
    Boundary(
        "inside_cancel_node",
        "before:finish_run:cancelled",
        cancel_after="after_call:refund",
    ),
    Boundary(
        "compensation_intent_written",
        "after:compensating:update_order",
        cancel_after="after_call:refund",
        compensate=True,
    ),
    Boundary(
        "compensation_applied_not_recorded",
        "after_call:restore_order",
        cancel_after="after_call:refund",
        compensate=True,
        resent_ops=("restore_order",),
    ),
]


def expire_in_flight(providers_path: Path, key: str) -> None:
    """The provider gives up on a request whose client died mid-call.

    The fake keeps a killed request "in flight" for the hang plus a grace
    period; a real provider would likewise time it out. We move its deadline
    into the past rather than sleep through it.
    """
    conn = sqlite3.connect(providers_path, timeout=30)
    try:
        with conn:
            conn.execute(
                "UPDATE idempotency SET in_flight_until = 0 WHERE key = ? AND state = 'in_flight'",
                (key,),
            )
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=[b.id for b in BOUNDARIES])
def test_kill9_at_boundary_then_recover(world: World, boundary: Boundary) -> None:
    providers = world.providers()
    if boundary.hang_refund:
        providers.set_fault("refund", "hang:30", times=1)
    first = world.start(
        "first",
        "run",
        kill_at=None if boundary.hang_refund else boundary.kill_at,
        signal_at=[boundary.kill_at] if boundary.hang_refund else [],
        refund_amount=boundary.refund_amount,
        compensate_on_cancel=boundary.compensate,
        pause_at=[boundary.cancel_after] if boundary.cancel_after else [],
        slow_checkpoints=boundary.slow_checkpoints,
    )
    if boundary.cancel_after:
        first.wait_point(boundary.cancel_after, "paused")
        accepted = request_cancel(
            world.db_url, world.thread_id, reason="user pressed stop", requested_by="test"
        )
        assert accepted.accepted
        first.go(boundary.cancel_after)
    first.wait_point(boundary.kill_at)
    if boundary.hang_refund:
        deadline = time.monotonic() + MARKER_TIMEOUT
        while not providers.pending(boundary.refund_key):
            assert time.monotonic() < deadline, "the refund never reached the provider"
            time.sleep(POLL)
    first.kill9()
    truth_at_kill = providers.truth()

    # A new process: the three questions first, from the database alone; then resume:
    # on SQLite with `langgraph-cancel resume` (reconciles first, then continues), on
    # PostgreSQL with `graph.invoke(None)` (the tool node settles what it left in flight).
    second = world.start(
        "second",
        "recover",
        refund_amount=boundary.refund_amount,
        compensate_on_cancel=boundary.compensate,
        resume_via="cli" if world.backend == "sqlite" else "invoke",
    )
    result = second.ok()
    answers = second.answers()
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
            # Later the provider gives up on the orphaned request; reconciliation
            # (another new process) now learns the refund did not happen.
            assert not truth["refunds"]
            expire_in_flight(world.providers_path, boundary.refund_key)
            third = world.start("third", "reconcile")
            assert third.ok()["left_unknown"] == []
            refund = effect_of(ledger, world.thread_id, "issue_refund")
            assert refund.status is EffectStatus.NOT_APPLIED, refund
            truth = providers.truth()
            assert_no_double_execution(truth)
            assert not truth["refunds"]
            assert_settled(ledger, world.thread_id)
            assert_report_matches_truth(world, truth)
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

    started = time.monotonic()
    second = world.start("second", "recover", script="hooks", hook_mode=mode, resume_via=via)
    result = second.ok(timeout=30)
    elapsed = time.monotonic() - started
    assert elapsed < 20, f"recovery took {elapsed:.1f}s: a hung hook held the run"
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
@pytest.mark.slow
def test_sweepers_finish_the_stop_of_a_killed_worker_once(world: World) -> None:
    """A worker killed after the refund reached the provider, then asked to stop: two
    sweepers racing (two machines) finish the stop once, the refund settled as the
    provider has it, the report written, the run cancelled; a later pass does nothing."""
    import threading

    from langgraph_cancel.demo import tools as refund_tools
    from langgraph_cancel.sweeper import SweepActionKind, Sweeper, SweepSummary
    from langgraph_cancel.types import RunStatus

    first = world.start("first", "run", kill_at="after_call:refund", worker_id=None, lease_ttl=600)
    first.wait_point("after_call:refund")
    first.kill9()
    asked = request_cancel(world.db_url, world.thread_id, reason="ops", requested_by="test")
    assert asked.accepted, asked

    refund_tools.set_providers_path(world.providers_path)
    try:
        summaries: list[SweepSummary] = []
        sweepers = [
            Sweeper(world.ledger(), tools=refund_tools.TOOLS, owner=f"sweeper-{name}")
            for name in ("a", "b")
        ]
        racing = [
            threading.Thread(target=lambda s=s: summaries.append(s.sweep_once())) for s in sweepers
        ]
        for thread in racing:
            thread.start()
        for thread in racing:
            thread.join(60)
        later = sweepers[0].sweep_once()
    finally:
        refund_tools.set_providers_path(None)

    assert len(summaries) == 2
    assert sum(s.count(SweepActionKind.FINISHED_CANCEL) for s in summaries) == 1, summaries
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
    assert_settled(ledger, world.thread_id)
    report = assert_report_matches_truth(world, truth)
    assert refund.idempotency_key in {e.idempotency_key for e in report.permanent}
    assert ledger.lease(world.thread_id) is None  # the sweepers gave the thread back


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

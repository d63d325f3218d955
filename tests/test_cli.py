"""``langgraph-cancel``: every command, run as a subprocess on a database the demo filled.

People get tables, programs get ``--json``; a bad URL or an unknown thread is a
one-line error with exit code 1, never a traceback; cancelling a finished run is
a no-op with exit code 0. The crash test kills a worker with SIGKILL mid-call and
then answers the three questions, reconciles and resumes from the database alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cli_util import (
    THREAD,
    Demo,
    cli_env,
    ok_json,
    one_line_error,
    read,
    run_demo,
    run_main,
    sqlite_url,
)
from langgraph_cancel import Ledger
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.types import EffectKind, EffectStatus


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    return run_demo(tmp_path_factory.mktemp("cli"))


# ------------------------------------------------------------------- status
def test_status_json_answers_the_three_questions(demo: Demo) -> None:
    data = ok_json(demo.cli("status", THREAD, "--json"))
    assert data["thread_id"] == THREAD
    assert data["run"]["status"] == "cancelled"
    assert data["run"]["reason"] == "user pressed stop"
    assert data["lease"] is None
    # 1. what was done
    assert {(e["tool"], e["status"]) for e in data["done"]} >= {
        ("lookup_order", "committed"),
        ("issue_refund", "committed"),
        ("update_order", "committed"),
    }
    assert len(data["not_done"]) == 4
    # 2. which external side effects were committed, or may have been
    assert sorted(e["tool"] for e in data["permanent"]) == [
        "issue_refund",
        "send_email",
        "send_email",
    ]
    assert len(data["committed"]) == 4
    assert data["maybe_committed"] == []
    # 3. the next step
    assert data["next_steps"][0].startswith("Nothing: the run was cancelled")
    assert any("compensate" in step for step in data["next_steps"])


def test_status_human(demo: Demo) -> None:
    out = read(demo.cli("status", THREAD, subprocess=True))
    for text in (
        f"Thread {THREAD}: runs",
        "cancelled",
        "Lease: none",
        "1. What was done",
        "2. External side effects committed, or that may have been",
        "key refund:o-88:40.00: committed, permanent",
        "3. Next step",
        "Nothing: the run was cancelled and every effect is settled.",
    ):
        assert text in out, out


# ------------------------------------------------------------------ effects
def test_effects_json(demo: Demo) -> None:
    effects = ok_json(demo.cli("effects", THREAD, "--json"))
    assert len(effects) == 9  # the lookup, 3 permanent, the update, 4 not run
    by_status: dict[str, list[str]] = {}
    for effect in effects:
        by_status.setdefault(effect["status"], []).append(effect["tool"])
        assert effect["idempotency_key"]
        assert effect["thread_id"] == THREAD
        assert "history" not in effect
    assert sorted(by_status["committed"]) == sorted(
        ["lookup_order", "issue_refund", "send_email", "send_email", "update_order"]
    )
    assert len(by_status["dropped"]) == 4
    refund = next(e for e in effects if e["tool"] == "issue_refund" and e["status"] == "committed")
    assert refund["idempotency_key"] == "refund:o-88:40.00"


def test_effects_history_is_the_audit_trail(demo: Demo) -> None:
    effects = ok_json(demo.cli("effects", THREAD, "--json", "--history"))
    update = next(e for e in effects if e["tool"] == "update_order" and e["status"] == "committed")
    trail = [(h["from_status"], h["to_status"]) for h in update["history"]]
    assert trail == [(None, "planned"), ("planned", "dispatched"), ("dispatched", "committed")]
    assert all(h["actor"] and h["at"] for h in update["history"])


def test_effects_human(demo: Demo) -> None:
    out = read(demo.cli("effects", THREAD, "--history"))
    assert f"Effects of thread {THREAD}" in out
    assert "refund:o-88:40.00" in out
    assert "dispatched → committed" in out
    assert "planned → dropped" in out


# ------------------------------------------------------------------- report
def test_report_json_is_the_demo_report(demo: Demo) -> None:
    report = ok_json(demo.cli("report", THREAD, "--json"))
    assert report == demo.report


def test_report_human(demo: Demo) -> None:
    out = read(demo.cli("report", THREAD))
    for text in (
        "Permanent (3)",
        "Not run (4)",
        "Unknown outcome (0)",
        "cancel latency",
        "quiescence",
        "Summary: 1 issue_refund and 2 send_email are permanent",
    ):
        assert text in out, out


# ------------------------------------------------------------------- cancel
def test_cancel_of_a_finished_run_is_a_no_op(demo: Demo) -> None:
    proc = demo.cli("cancel", THREAD, "--reason", "again", "--by", "tester")
    out = read(proc)
    assert "nothing to cancel" in out and "already cancelled" in out
    assert "no-op" in out
    result = ok_json(demo.cli("cancel", THREAD, "--reason", "again", "--by", "tester", "--json"))
    assert result["accepted"] is False
    assert result["status"] == "cancelled"
    # The first reason stands.
    assert ok_json(demo.cli("report", THREAD, "--json"))["reason"] == "user pressed stop"


def test_cancel_of_a_live_run(tmp_path: Path) -> None:
    db = sqlite_url(tmp_path / "live.db")
    with Ledger.from_url(db) as ledger:
        run = ledger.start_run("t-live")
    first = run_main(
        ["cancel", "t-live", "--reason", "user pressed stop", "--by", "dana", "--db", db], tmp_path
    )
    out = read(first)
    assert f"cancel requested for run {run.run_id}" in out
    assert "No worker is running this thread" in out
    again = ok_json(
        run_main(
            ["cancel", "t-live", "--reason", "second", "--by", "sam", "--json", "--db", db],
            tmp_path,
        )
    )
    assert again["accepted"] is True and again["first"] is False
    assert again["reason"] == "user pressed stop"  # the first reason wins
    status = ok_json(run_main(["status", "t-live", "--json", "--db", db], tmp_path))
    assert status["run"]["status"] == "cancel_requested"
    assert "resume" in status["next_steps"][0]


# ------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "command",
    [["status"], ["effects"], ["report"], ["cancel"], ["reconcile"], ["compensate"]],
)
def test_unknown_thread_is_a_one_line_error(demo: Demo, command: list[str]) -> None:
    line = one_line_error(demo.cli(*command, "no-such-thread"))
    assert "unknown thread 'no-such-thread'" in line


def test_unknown_thread_from_the_console(demo: Demo) -> None:
    proc = demo.cli("status", "no-such-thread", subprocess=True)
    assert "unknown thread 'no-such-thread'" in one_line_error(proc)
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("db", "expect"),
    [
        ("mysql://root@localhost/x", "unsupported database URL"),
        ("/nonexistent/dir/agent.db", "no database at"),
        ("not-a-database.db", "not a database"),
        ("postgresql://postgres@127.0.0.1:1/nothing", "cannot connect"),
        ("postgresql:/bad", "malformed PostgreSQL URL"),
    ],
)
def test_bad_url_is_a_one_line_error(tmp_path: Path, db: str, expect: str) -> None:
    (tmp_path / "not-a-database.db").write_text("hello, I am a text file\n" * 10)
    line = one_line_error(run_main(["status", THREAD, "--db", db], tmp_path))
    assert expect in line, line


def test_resume_of_a_finished_thread_is_a_no_op(demo: Demo) -> None:
    out = read(demo.cli("resume", THREAD))
    assert "nothing to resume" in out and "cancelled" in out


def test_resume_without_a_saved_checkpoint_says_so(tmp_path: Path) -> None:
    # A worker killed before its first checkpoint reached the disk: the ledger knows
    # the run and an effect, the checkpointer knows nothing. Resume reconciles and says
    # there is no state to continue from, instead of failing inside LangGraph.
    db = sqlite_url(tmp_path / "agent.db")
    with Ledger.from_url(db) as ledger:
        run = ledger.start_run("early")
        ledger.plan(
            thread_id="early",
            run_id=run.run_id,
            tool_call_id="c1",
            tool="lookup_order",
            kind=EffectKind.READ_ONLY,
            args={"order_id": "o-88"},
            status=EffectStatus.COMMITTED,
            result={"content": "o-88: paid"},
        )
    resumed = ok_json(run_main(["resume", "early", "--db", db, "--json"], tmp_path))
    assert resumed["resumed"] is False
    assert "no saved checkpoint" in resumed["message"]
    assert resumed["run"]["status"] == "running"


def test_resume_force_takes_over_a_dead_workers_live_lease(tmp_path: Path) -> None:
    # kill -9 leaves the worker's lease live until its TTL runs out; an operator who
    # knows the worker is gone takes the thread over with --force instead of waiting.
    db = sqlite_url(tmp_path / "agent.db")
    with Ledger.from_url(db) as ledger:
        ledger.start_run("orphaned")
        ledger.acquire_lease("orphaned", "worker-killed-9", ttl=3600)
    refused = one_line_error(run_main(["resume", "orphaned", "--db", db], tmp_path))
    assert "being run by worker-killed-9" in refused and "--force" in refused
    with Ledger.from_url(db) as ledger:
        lease = ledger.lease("orphaned")
        assert lease is not None and lease.owner == "worker-killed-9"  # nothing changed
    out = read(run_main(["resume", "orphaned", "--db", db, "--force"], tmp_path))
    assert "Broke the live lease of worker-killed-9" in out
    assert "nothing to resume" in out
    with Ledger.from_url(db) as ledger:
        assert ledger.lease("orphaned") is None


def test_reconcile_with_nothing_to_settle(demo: Demo) -> None:
    out = read(demo.cli("reconcile", THREAD))
    assert "Nothing to reconcile" in out
    assert ok_json(demo.cli("reconcile", "--all", "--json")) == []


# --------------------------------------------------------------- compensate
def test_compensate_then_report_now(tmp_path: Path) -> None:
    demo = run_demo(tmp_path)
    result = ok_json(demo.cli("compensate", THREAD, "--json"))
    assert [(e["tool"], e["status"]) for e in result] == [("update_order", "compensated")]
    truth = Providers(demo.providers).truth()
    assert truth["orders"]["o-88"]["status"] == "refund_requested"  # put back
    assert len(truth["restores"]) == 1
    # Idempotent: nothing left to undo.
    assert "Nothing to compensate" in read(demo.cli("compensate", THREAD))
    # The stored report is the one written at the cancel; --now shows the ledger today.
    stored = read(demo.cli("report", THREAD))
    assert "report THREAD --now".replace("THREAD", THREAD) in stored
    now = ok_json(demo.cli("report", THREAD, "--json", "--now"))
    assert [e["tool"] for e in now["compensated"]] == ["update_order"]
    assert now["reversible_committed"] == []
    assert len(now["permanent"]) == 3  # the refund and the emails stay permanent


# -------------------------------------------------------------------- crash
_WORKER = textwrap.dedent(
    """
    import sys
    from langgraph_cancel.demo import tools
    from langgraph_cancel.demo.graph import build_builder, scripted_model, seed_input
    from langgraph_cancel.demo.services import Providers
    from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver

    db, providers, thread = sys.argv[1:4]
    tools.set_providers_path(providers)
    Providers(providers).set_fault("update_order", "hang:3", times=1)
    with SqliteCancelSaver.from_conn_string(db) as saver:
        saver.setup()
        graph = build_builder(scripted_model()).compile(checkpointer=saver)
        # LangGraph's default durability ("async"): the tool node waits for the model
        # step's checkpoint before the update goes out (checkpointers/durable.py).
        for _ in graph.stream(seed_input(), {"configurable": {"thread_id": thread}}):
            pass
    """
)


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.slow
def test_kill9_status_reconcile_resume(tmp_path: Path) -> None:
    db_path = tmp_path / "agent.db"
    db = sqlite_url(db_path)
    providers = tmp_path / "providers.db"
    thread = "crashy"
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    worker = subprocess.Popen(
        [sys.executable, str(script), str(db_path), str(providers), thread],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def in_flight() -> Any:
        if worker.poll() is not None:
            err = worker.stderr.read() if worker.stderr else ""
            raise AssertionError(f"worker exited early: {err}")
        if not db_path.exists():
            return None
        with Ledger.from_url(db) as ledger:
            return next(
                (
                    e
                    for e in ledger.effects(thread)
                    if e.tool == "update_order"
                    and e.status is EffectStatus.DISPATCHED
                    # At the provider too: killed between the intent and the request,
                    # the armed fault would fire on the resumed call instead.
                    and Providers(providers).pending(e.idempotency_key)
                ),
                None,
            )

    try:
        _wait_for(in_flight, 120, "update_order(o-88) in flight")
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        if worker.stderr:
            worker.stderr.close()
    env = {"REFUND_AGENT_PROVIDERS_DB": str(providers)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_main([*args, "--db", db], tmp_path, env=env)

    # The database alone answers the three questions.
    status = ok_json(cli("status", thread, "--json"))
    assert status["run"]["status"] == "running"
    assert sorted(e["tool"] for e in status["permanent"]) == [
        "issue_refund",
        "send_email",
        "send_email",
    ]
    assert [(e["tool"], e["status"]) for e in status["maybe_committed"]] == [
        ("update_order", "dispatched")
    ]
    # The worker ran on this host and no longer runs: its lease, far from expiring, is
    # known dead at once, so nothing waits for it.
    assert status["lease"]["live"] is False
    effects = ok_json(cli("effects", thread, "--json"))
    in_flight_key = next(e["idempotency_key"] for e in effects if e["status"] == "dispatched")
    # The provider's own in-flight window for the request passes.
    _wait_for(lambda: not Providers(providers).pending(in_flight_key), 30, "provider window")
    human = read(cli("status", thread))
    assert "HOLDER GONE" in human
    assert "MAY have been committed: in flight, no outcome recorded" in human
    assert "langgraph-cancel reconcile crashy" in human

    settled = ok_json(cli("reconcile", "--all", "--json"))
    (entry,) = [r for r in settled if r["thread_id"] == thread]
    assert entry["reaped_lease_of"]
    assert entry["kept_lease"] is False  # a crashed run's lease goes
    assert [(e["tool"], e["before"], e["status"]) for e in entry["effects"]] == [
        ("update_order", "dispatched", "not_applied")
    ]

    resumed = ok_json(cli("resume", thread, "--json"))
    assert resumed["resumed"] is True
    assert resumed["run"]["status"] == "completed"
    truth = Providers(providers).truth()
    assert all(info["executions"] <= 1 for info in truth["keys"].values())  # nothing doubled
    assert truth["keys"][in_flight_key]["executions"] == 1  # redispatched with the same key
    assert [r["order_id"] for r in truth["refunds"]] == ["o-88", "o-91"]
    after = ok_json(cli("status", thread, "--json"))
    assert after["run"]["status"] == "completed"
    assert after["maybe_committed"] == []
    assert after["next_steps"] == ["Nothing: the run completed and every effect is settled."]


# ---------------------------------------------------------------- postgres
@pytest.mark.postgres
def test_commands_on_postgres(tmp_path: Path, pg_url: str) -> None:
    demo = run_demo(tmp_path, pg_url)
    assert demo.report["status"] == "cancelled"
    status = ok_json(demo.cli("status", THREAD, "--json"))
    assert status["run"]["status"] == "cancelled"
    assert len(ok_json(demo.cli("effects", THREAD, "--json"))) == 9
    assert ok_json(demo.cli("report", THREAD, "--json")) == demo.report
    assert "nothing to cancel" in read(demo.cli("cancel", THREAD))
    one_line_error(demo.cli("status", "no-such-thread"))

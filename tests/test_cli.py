"""``langgraph-cancel``: every command, run as a subprocess on a database the demo filled.

People get tables, programs get ``--json``; a bad URL or an unknown thread is a
one-line error with exit code 1, never a traceback; cancelling a finished run is
a no-op with exit code 0. The crash test kills a worker with SIGKILL mid-call and
then answers the three questions, reconciles and resumes from the database alone.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

from cli_util import (
    cli_env,
    flat,
    json_error,
    ok,
    ok_json,
    one_line_error,
    run_cli,
    run_main,
    sqlite_url,
)
from langgraph_cancel import Ledger
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.types import EffectKind, EffectStatus

THREAD = "refund-demo"


def read(proc: CompletedProcess[str]) -> str:
    """What a successful command printed, its wrapped lines read as one."""
    return flat(ok(proc))


@dataclass
class Demo:
    """A directory where the default demo ran."""

    workdir: Path
    db: str
    providers: Path
    report: dict[str, Any]

    def cli(self, *args: str, subprocess: bool = False) -> CompletedProcess[str]:
        """Run a command on this database: in-process, or as a real subprocess."""
        run = run_cli if subprocess else run_main
        return run(
            [*args, "--db", self.db],
            self.workdir,
            env={"REFUND_AGENT_PROVIDERS_DB": str(self.providers)},
        )


def _run_demo(workdir: Path, db: str | None = None) -> Demo:
    workdir.mkdir(parents=True, exist_ok=True)
    db = db or str(workdir / "agent.db")  # a bare path is accepted as a SQLite file
    providers = workdir / "providers.db"
    report = ok_json(
        run_cli(["demo", "--json", "--db", db, "--providers-db", str(providers)], workdir)
    )
    return Demo(workdir, db, providers, report)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    return _run_demo(tmp_path_factory.mktemp("cli"))


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
    demo = _run_demo(tmp_path)
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
    demo = _run_demo(tmp_path, pg_url)
    assert demo.report["status"] == "cancelled"
    status = ok_json(demo.cli("status", THREAD, "--json"))
    assert status["run"]["status"] == "cancelled"
    assert len(ok_json(demo.cli("effects", THREAD, "--json"))) == 9
    assert ok_json(demo.cli("report", THREAD, "--json")) == demo.report
    assert "nothing to cancel" in read(demo.cli("cancel", THREAD))
    one_line_error(demo.cli("status", "no-such-thread"))


# ------------------------------------------------------------------- parser
def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from langgraph_cancel.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_takes_db_and_data_commands_take_json() -> None:
    commands = _subcommands()
    assert set(commands) == {
        "demo",
        "status",
        "effects",
        "cancel",
        "report",
        "compensate",
        "resume",
        "reconcile",
        "outbox",
        "sweep",
        "stats",
        "completion",
    }
    for name, command in commands.items():
        if name == "completion":
            continue
        flags = {f for a in command._actions for f in a.option_strings}
        assert "--db" in flags, name
        assert "--json" in flags, name


def test_every_argument_has_help() -> None:
    from langgraph_cancel.cli.parser import build_parser

    parsers = [build_parser(), *_subcommands().values()]
    for parser in parsers:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            name = "/".join(action.option_strings) or action.dest
            assert action.help and action.help.strip(), f"{parser.prog} {name} has no help"


def test_the_parser_names_what_the_demo_defines() -> None:
    from langgraph_cancel.cli import parser
    from langgraph_cancel.demo import scenario, services

    assert tuple(scenario.STEPS) == parser.DEMO_STEPS
    assert parser.DEMO_THREAD == scenario.DEFAULT_THREAD
    assert parser.DEMO_HANG == scenario.DEFAULT_HANG
    assert parser.ENV_PROVIDERS_DB == services.ENV_PROVIDERS_DB
    assert parser.DEFAULT_PROVIDERS_DB == services.DEFAULT_PROVIDERS_DB


def test_help_and_version(tmp_path: Path) -> None:
    from importlib.metadata import version

    shown = ok(run_cli(["--version"], tmp_path))
    assert shown == f"langgraph-cancel {version('langgraph-cancel')}\n"
    usage = ok(run_cli(["--help"], tmp_path))
    assert usage.startswith("usage: langgraph-cancel")
    for command in ("demo", "status", "effects", "cancel", "report", "resume", "completion"):
        assert f"    {command}" in usage, usage
    assert "--cancel-at STEP" in ok(run_cli(["demo", "--help"], tmp_path))


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["refund"], "invalid choice: 'refund'"),
        (["status"], "the following arguments are required: THREAD"),
        (["status", ""], "argument THREAD: a thread id cannot be empty"),
        (["demo", "--thread", ""], "argument --thread: a thread id cannot be empty"),
        (["demo", "--hang", "-1"], "argument --hang: wants a number of seconds >= 0, got '-1'"),
        (["demo", "--hang", "nan"], "argument --hang: wants a number of seconds >= 0"),
        (["demo", "--hang", "soon"], "argument --hang: wants a number of seconds, got 'soon'"),
        (["demo", "--cancel-at", "later"], "argument --cancel-at: invalid choice: 'later'"),
        (["status", "t", "--db", "postgresql:/bad"], "malformed PostgreSQL URL 'postgresql:/bad'"),
        (["status", "t", "--db", "sqlite:/x.db"], "malformed SQLite URL"),
        (["resume", "t", "--resume-value", "{oops"], "argument --resume-value: not JSON"),
        (["resume", "t", "--graph", "no_colon"], "argument --graph: wants module:attribute"),
        (["cancel", "t", "--reason", " "], "argument --reason: cannot be empty"),
        (["status", "t", "--colour"], "unrecognized arguments: --colour"),
        (["completion", "fish"], "argument SHELL: invalid choice: 'fish'"),
    ],
)
def test_argument_errors_are_one_line_and_exit_1(
    tmp_path: Path, args: list[str], expect: str
) -> None:
    line = one_line_error(run_main(args, tmp_path))
    assert expect in line, line
    assert "--help" in line  # where to look


def test_argument_errors_from_the_console(tmp_path: Path) -> None:
    proc = run_cli(["demo", "--hang", "-1"], tmp_path)
    assert "--hang" in one_line_error(proc)
    assert "usage:" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # refused before anything was opened


def test_errors_under_json_are_json(demo: Demo, tmp_path: Path) -> None:
    unknown = json_error(demo.cli("status", "no-such-thread", "--json"))
    assert unknown["type"] == "UnknownThreadError"
    assert "unknown thread 'no-such-thread'" in unknown["message"]
    refused = json_error(run_main(["demo", "--json", "--thread", ""], tmp_path))
    assert refused["type"] == "CommandLineError"
    assert "a thread id cannot be empty" in refused["message"]
    missing = json_error(run_cli(["effects", "t", "--json", "--db", "missing.db"], tmp_path))
    assert "no database at" in missing["message"]


def test_env_database_and_suggestions(demo: Demo) -> None:
    # $LANGGRAPH_CANCEL_DB names the database; suggested commands then need no --db.
    proc = run_main(["status", THREAD], demo.workdir, env={"LANGGRAPH_CANCEL_DB": demo.db})
    out = read(proc)
    assert "compensate refund-demo`" in out and "--db" not in out
    # Given on the command line, --db is repeated in every suggestion.
    assert f"compensate refund-demo --db {demo.db}`" in read(demo.cli("status", THREAD))
    bad = run_main(["status", THREAD], demo.workdir, env={"LANGGRAPH_CANCEL_DB": "postgres:/x"})
    assert "malformed PostgreSQL URL" in one_line_error(bad)


def test_report_of_a_run_of_another_thread(demo: Demo) -> None:
    run_id = demo.report["run_id"]
    assert ok_json(demo.cli("report", THREAD, "--run", run_id, "--json"))["run_id"] == run_id
    with Ledger.from_url(sqlite_url(Path(demo.db))) as ledger:
        ledger.start_run("other-thread")
    line = one_line_error(demo.cli("report", "other-thread", "--run", run_id))
    assert f"run {run_id} belongs to thread 'refund-demo', not 'other-thread'" in line


# ------------------------------------------------------------------- output
HUMAN_COMMANDS: list[list[str]] = [
    ["status", THREAD],
    ["effects", THREAD, "--history"],
    ["report", THREAD],
    ["cancel", THREAD],
]


@pytest.mark.parametrize("args", HUMAN_COMMANDS, ids=lambda a: a[0])
def test_piped_output_fits_80_columns_and_cuts_nothing(demo: Demo, args: list[str]) -> None:
    proc = run_cli([*args, "--db", demo.db], demo.workdir, env={"NO_COLOR": ""})
    out = ok(proc)
    lines = out.splitlines()
    assert max(len(text) for text in lines) <= 80, "\n".join(t for t in lines if len(t) > 80)
    assert all(text == text.rstrip() for text in lines)  # no padding to the width
    assert "\x1b[" not in out  # plain text: no colour when piped
    # Every key shown is whole on its line: wrapped at spaces, never cut.
    if args[0] == "status":
        shown = ok_json(demo.cli("status", THREAD, "--json"))["committed"]
    elif args[0] == "report":
        report = ok_json(demo.cli("report", THREAD, "--json"))
        shown = [
            e for bucket in ("permanent", "reversible_committed", "not_run") for e in report[bucket]
        ]
    elif args[0] == "effects":
        shown = ok_json(demo.cli("effects", THREAD, "--json"))
    else:
        shown = []
    for effect in shown:
        assert effect["idempotency_key"] in out, effect["idempotency_key"]


def test_piped_output_follows_columns(demo: Demo) -> None:
    out = ok(run_cli(["status", THREAD, "--db", demo.db], demo.workdir, env={"COLUMNS": "120"}))
    widths = [len(text) for text in out.splitlines()]
    assert 80 < max(widths) <= 120


def test_terminal_output_follows_the_terminal(demo: Demo) -> None:
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios

    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "langgraph_cancel.cli", "status", THREAD, "--db", demo.db],
        cwd=demo.workdir,
        env=cli_env({"NO_COLOR": "", "TERM": "xterm-256color"}),
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=subprocess.PIPE,
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    raw = b"".join(chunks).decode()
    assert "\x1b[" in raw  # a terminal gets colour
    plain = re.sub(r"\x1b\[[0-9;]*m", "", raw)
    widths = [len(text) for text in plain.splitlines()]
    assert 80 < max(widths) <= 100, plain


# ----------------------------------------------------------------- startup
_IMPORTS_PROBE = """
import sys
from langgraph_cancel.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as done:
    code = done.code
heavy = sorted(m for m in ("langchain_core", "langgraph", "langsmith") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
"""


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], *HUMAN_COMMANDS, ["status", THREAD, "--json"]],
    ids=lambda a: "_".join(a).strip("-"),
)
def test_quick_commands_import_neither_langgraph_nor_langchain(demo: Demo, args: list[str]) -> None:
    extra = [] if args[0].startswith("--") else ["--db", demo.db]
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORTS_PROBE, *args, *extra],
        cwd=demo.workdir,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "HEAVY=\n" in proc.stderr, proc.stderr


# -------------------------------------------------------------- completion
def test_bash_completion_completes_commands_and_options(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:  # pragma: no cover - bash is on every image we run on
        pytest.skip("no bash")
    script = tmp_path / "completion.bash"
    script.write_text(ok(run_cli(["completion", "bash"], tmp_path)))

    def complete(*words: str) -> list[str]:
        probe = (
            f"source {shlex.quote(str(script))}\n"
            f"COMP_WORDS=(langgraph-cancel {' '.join(shlex.quote(w) for w in words)})\n"
            f"COMP_CWORD={len(words)}\n"
            'COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}\n'
            "$(complete -p langgraph-cancel | sed -E 's/.* -F ([^ ]+) .*/\\1/') "
            'langgraph-cancel "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
            'printf "%s\\n" "${COMPREPLY[@]}"\n'
        )
        done = subprocess.run(
            [bash, "--norc", "-c", probe], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert {"status", "effects"} <= set(complete("st")) | set(complete("e"))
    assert "status" in complete("st")
    assert "--history" in complete("effects", "t", "--hi")
    assert "--cancel-at" in complete("demo", "--can")


def test_zsh_completion_script(tmp_path: Path) -> None:
    script = ok(run_cli(["completion", "zsh"], tmp_path))
    assert script.startswith("#compdef langgraph-cancel")
    for word in ("demo", "status", "effects", "--history", "--cancel-at", "--db"):
        assert word in script, word
    zsh = shutil.which("zsh")
    if zsh is not None:  # a syntax check where zsh is installed
        path = tmp_path / "_langgraph-cancel"
        path.write_text(script)
        checked = subprocess.run([zsh, "-n", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr

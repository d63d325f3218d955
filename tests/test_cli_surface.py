"""``langgraph-cancel``'s surface: its parser, help and argument errors, output that
fits the terminal or the pipe, quick commands that start without LangGraph, and
shell completion.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_util import (
    THREAD,
    Demo,
    cli_env,
    json_error,
    ok,
    ok_json,
    one_line_error,
    read,
    run_cli,
    run_demo,
    run_main,
    sqlite_url,
)
from langgraph_cancel import Ledger


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    return run_demo(tmp_path_factory.mktemp("cli-surface"))


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

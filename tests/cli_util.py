"""Run ``langgraph-cancel`` as a subprocess, as a user would, in a test's directory."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Variables a user's shell might have that would point the CLI elsewhere (or change
#: the width and colour of its output).
_SCRUB = (
    "LANGGRAPH_CANCEL_DB",
    "REFUND_AGENT_PROVIDERS_DB",
    "OPENAI_API_KEY",
    "LANGSMITH_API_KEY",
    "COLUMNS",
    "FORCE_COLOR",
)


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI subprocess: the repository importable, nothing remote.

    Output is piped, so it is 80 columns wide unless ``extra`` sets ``COLUMNS``.
    """
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    env.update({"LANGSMITH_TRACING": "false", "NO_COLOR": "1"})
    env.update(extra or {})
    return env


def flat(text: str) -> str:
    """``text`` with every run of whitespace one space: wrapped output read as one line."""
    return " ".join(text.split())


def run_cli(
    args: Sequence[str],
    cwd: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """``python -m langgraph_cancel.cli ARGS`` in ``cwd``; returns the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "langgraph_cancel.cli", *args],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@contextlib.contextmanager
def _environ(extra: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in (*_SCRUB, *extra)}
    try:
        for name in _SCRUB:
            os.environ.pop(name, None)
        os.environ.update(extra)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_main(
    args: Sequence[str], cwd: Path, *, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI's ``main(ARGS)`` in this process (much faster than a new interpreter).

    Same result shape as :func:`run_cli`; stdout and stderr are captured.
    """
    from langgraph_cancel.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_cwd = Path.cwd()
    try:
        os.chdir(cwd)
        with (
            _environ({"NO_COLOR": "1", **(env or {})}),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            code = main(list(args))
    finally:
        os.chdir(old_cwd)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """The stdout of a process that must have succeeded (its output on failure)."""
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc.stdout


def ok_json(proc: subprocess.CompletedProcess[str]) -> Any:
    """The JSON a successful process printed (its stdout, nothing else)."""
    return json.loads(ok(proc))


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The error of a failed process: exit 1, one line on stderr, nothing on stdout."""
    assert proc.returncode == 1, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("langgraph-cancel: error: "), lines[0]
    assert proc.stdout == "", proc.stdout
    return lines[0]


def json_error(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The error of a failed ``--json`` command: exit 1, a JSON object on stdout only."""
    assert proc.returncode == 1, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    assert proc.stderr == "", proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"error"}, data
    error: dict[str, str] = data["error"]
    assert set(error) == {"type", "message"}, error
    assert "\n" not in error["message"]
    return error


def sqlite_url(path: Path) -> str:
    """``sqlite:////abs/path``."""
    return "sqlite:///" + str(path.resolve())


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


def run_demo(workdir: Path, db: str | None = None) -> Demo:
    """Run the default demo in ``workdir`` (on ``db``, a SQLite file there by default)."""
    workdir.mkdir(parents=True, exist_ok=True)
    db = db or str(workdir / "agent.db")  # a bare path is accepted as a SQLite file
    providers = workdir / "providers.db"
    report = ok_json(
        run_cli(["demo", "--json", "--db", db, "--providers-db", str(providers)], workdir)
    )
    return Demo(workdir, db, providers, report)

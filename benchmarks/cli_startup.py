"""Command-line start-up: a cold process's wall time, from ``exec`` to exit.

Each command runs as a new process, the way a person (or a script) runs it:
``langgraph-cancel --help`` and ``--version``; ``cancel``, ``status`` and
``effects`` against a SQLite file and a PostgreSQL database holding a small
thread. The baselines, measured in the same run and interleaved with them:
the bare interpreter (``python -c pass``), importing LangGraph
(``python -c "import langgraph.graph"``) and LangGraph's own command line
(``langgraph --help``, when ``langgraph-cli`` is installed). Bytecode is
written and read as in an installed package (``PYTHONDONTWRITEBYTECODE`` is
removed), and one warm-up run of each command comes first.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Settings, ledger_url, log, ratio, rnd, summary

#: What a cold start of a quick command must stay under.
TARGET_S = 1.0
THREAD_DONE = "bench-cli-done"
THREAD_LIVE = "bench-cli-live"
QUICK_COMMANDS = ("cancel", "status", "effects")


def _cli() -> list[str]:
    """The ``langgraph-cancel`` console script of this interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name("langgraph-cancel")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "langgraph_cancel.cli"]


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONDONTWRITEBYTECODE", "LANGGRAPH_CANCEL_DB", "COLUMNS")
    }
    env.update({"LANGSMITH_TRACING": "false", "NO_COLOR": "1"})
    return env


def _fill(url: str) -> None:
    """A finished thread with a few effects, and a live run to cancel."""
    from langgraph_cancel.ledger import Ledger
    from langgraph_cancel.types import EffectKind, EffectStatus

    with Ledger.from_url(url) as ledger:
        run = ledger.start_run(THREAD_DONE)
        for number, kind in enumerate(
            (EffectKind.READ_ONLY, EffectKind.REVERSIBLE, EffectKind.IRREVERSIBLE)
        ):
            ledger.plan(
                thread_id=THREAD_DONE,
                run_id=run.run_id,
                tool_call_id=f"call-{number}",
                tool=f"tool_{kind.value}",
                kind=kind,
                args={"order_id": "o-88", "n": number},
                status=EffectStatus.COMMITTED,
                result={"content": "ok"},
            )
        ledger.finish_run(run.run_id, "completed")
        ledger.start_run(THREAD_LIVE)


def _commands(urls: dict[str, str]) -> dict[str, list[str]]:
    cli = _cli()
    commands: dict[str, list[str]] = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import langgraph.graph": [sys.executable, "-c", "import langgraph.graph"],
    }
    langgraph = shutil.which("langgraph") or str(Path(sys.executable).with_name("langgraph"))
    if Path(langgraph).is_file():
        commands["langgraph --help"] = [langgraph, "--help"]
    commands["langgraph-cancel --help"] = [*cli, "--help"]
    commands["langgraph-cancel --version"] = [*cli, "--version"]
    for backend, url in urls.items():
        commands[f"cancel ({backend})"] = [
            *cli,
            "cancel",
            THREAD_LIVE,
            "--reason",
            "benchmark",
            "--by",
            "bench",
            "--db",
            url,
        ]
        commands[f"status ({backend})"] = [*cli, "status", THREAD_DONE, "--db", url]
        commands[f"effects ({backend})"] = [*cli, "effects", THREAD_DONE, "--db", url]
    return commands


def _once(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, int]:
    """Wall and CPU seconds of one process, and its exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def _measure(commands: dict[str, list[str]], reps: int, cwd: str) -> dict[str, Any]:
    env = _env()
    for argv in commands.values():  # warm-up: bytecode written, files in the page cache
        _once(argv, env, cwd)
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, set[int]] = {name: set() for name in commands}
    for _ in range(reps):  # interleaved, so a slow phase of the machine moves every row
        for name, argv in commands.items():
            wall, cpu, code = _once(argv, env, cwd)
            walls[name].append(wall)
            cpus[name].append(cpu)
            codes[name].add(code)
    return {
        name: {
            "wall_ms": summary(walls[name], scale=1000, digits=1),
            "cpu_ms": summary(cpus[name], scale=1000, digits=1),
            "exit_codes": sorted(codes[name]),
        }
        for name in commands
    }


def run(settings: Settings, backends: list[str]) -> dict[str, Any]:
    """Cold-start wall time of the quick commands and of the baselines."""
    reps = 3 if settings.quick else 10
    durable = [b for b in backends if b in ("sqlite", "postgres")]
    out: dict[str, Any] = {"method": (__doc__ or "").strip(), "reps": reps, "target_s": TARGET_S}
    cwd = os.path.join(settings.workdir, "cli-startup")
    os.makedirs(cwd, exist_ok=True)
    with contextlib.ExitStack() as stack:
        urls = {b: stack.enter_context(ledger_url(b, settings, "cli")) for b in durable}
        for url in urls.values():
            _fill(url)
        out["commands"] = _measure(_commands(urls), reps, cwd)
    for name, row in out["commands"].items():
        log(f"  {name:32s} wall p50 {row['wall_ms']['median']} ms, exit {row['exit_codes']}")
    return out


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's target rows: each quick command's cold start under a second."""
    section = res.get("cli_startup")
    if not section:
        return []
    rows = section["commands"]
    ref = (rows.get("langgraph --help") or {}).get("wall_ms", {}).get("median")
    floor = rows["python -c pass"]["wall_ms"]["median"]
    out = []
    for name, row in rows.items():
        if not name.startswith(("langgraph-cancel", *QUICK_COMMANDS)):
            continue
        wall = row["wall_ms"]["median"]
        ok = wall is not None and wall < TARGET_S * 1000 and row["exit_codes"] == [0]
        against = f"; x{rnd(ratio(wall, ref), 2)} langgraph --help ({ref} ms)" if ref else ""
        out.append(
            {
                "target": f"CLI: {name} cold start < {TARGET_S:g} s",
                "measured": f"p50 {wall} ms (max {row['wall_ms']['max']})",
                "status": "PASS" if ok else "MISS",
                "detail": f"interpreter alone {floor} ms{against}; exit {row['exit_codes']}",
            }
        )
    return out


def print_table(console: Any, res: dict[str, Any]) -> None:
    """The section's table: every command's wall and CPU, and its ratio to the references."""
    from rich.table import Table

    section = res.get("cli_startup")
    if not section:
        return
    rows = section["commands"]
    ref = (rows.get("langgraph --help") or {}).get("wall_ms", {}).get("median")
    lg = rows["import langgraph.graph"]["wall_ms"]["median"]
    table = Table(title=f"Command-line cold start (ms, {section['reps']} runs each, interleaved)")
    for col in (
        "command",
        "wall p50",
        "wall max",
        "CPU p50",
        "x langgraph --help",
        "x import langgraph",
    ):
        table.add_column(col, justify="left" if col == "command" else "right")
    for name, row in rows.items():
        wall = row["wall_ms"]["median"]
        table.add_row(
            name,
            str(wall),
            str(row["wall_ms"]["max"]),
            str(row["cpu_ms"]["median"]),
            str(rnd(ratio(wall, ref), 2)) if ref else "",
            str(rnd(ratio(wall, lg), 2)),
        )
    console.print(table)


__all__ = ["TARGET_S", "print_table", "run", "targets"]

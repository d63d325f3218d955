"""The benchmark command: ``python -m benchmarks`` (or ``benchmarks/run.py``).

Measures langgraph-cancel against plain LangGraph on memory, SQLite (a file in a
temporary directory) and PostgreSQL (loopback), prints rich tables with the
targets marked PASS/MISS, and writes everything to JSON
(``benchmarks/results/latest.json`` by default). This is a measurement, never a
test: nothing here fails on a slow number.

PostgreSQL comes from ``--pg-dsn`` or ``$LANGGRAPH_CANCEL_TEST_PG_DSN`` (the
user must be allowed to CREATE DATABASE: every section works in a fresh one,
dropped afterwards). ``scripts/bench`` starts a throwaway server like
``scripts/test`` does. Without a DSN the PostgreSQL columns are skipped and the
JSON says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: benchmarks/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    BACKENDS,
    PG_DSN_ENV,
    Settings,
    log,
    pg_ping,
    pg_server_info,
    time_median,
)
from benchmarks.findings import findings
from benchmarks.tables import print_tables
from benchmarks.targets import evaluate_targets

ROOT = Path(__file__).resolve().parent.parent


SECTIONS = (
    "floor",
    "overhead",
    "server",
    "profile",
    "latency",
    "scale",
    "recovery",
    "cli_startup",
    "throughput",
)


def parse_args(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="1-minute smoke run with small sizes")
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated subset of memory,sqlite,postgres",
    )
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)}",
    )
    parser.add_argument(
        "--pg-dsn", default=None, help=f"PostgreSQL server DSN (default ${PG_DSN_ENV})"
    )
    parser.add_argument(
        "--scale-max",
        type=int,
        default=None,
        help="largest settled-row count for the scale section (default 1000000; --quick: 10000)",
    )
    parser.add_argument(
        "--latency-trials",
        type=int,
        default=None,
        help="cancel-latency trials per backend (default 30; --quick: 3)",
    )
    parser.add_argument(
        "--batches",
        default=None,
        help="per-call overhead batch sizes, comma-separated (default 1,10,100; --quick: 1,10)",
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions per overhead cell (default: 16/30/8 for N=1/10/100)",
    )
    parser.add_argument(
        "--out",
        default=str(ROOT / "benchmarks" / "results" / "latest.json"),
        help="where to write the JSON",
    )
    args = parser.parse_args(argv)
    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    bad = [b for b in backends if b not in BACKENDS] + [s for s in sections if s not in SECTIONS]
    if bad:
        parser.error(f"unknown backend/section: {', '.join(bad)}")
    return Settings(
        quick=args.quick,
        backends=backends,
        sections=sections,
        pg_dsn=args.pg_dsn or os.environ.get(PG_DSN_ENV) or None,
        scale_max=args.scale_max or (10_000 if args.quick else 1_000_000),
        latency_trials=args.latency_trials or (3 if args.quick else 30),
        batches=tuple(int(x) for x in args.batches.split(",")) if args.batches else None,
        reps=args.reps,
        out=args.out,
    )


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except Exception:
        return None


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in (
        "langgraph",
        "langgraph-prebuilt",
        "langgraph-checkpoint",
        "langgraph-checkpoint-sqlite",
        "langgraph-checkpoint-postgres",
        "langchain-core",
        "psycopg",
        "psycopg-pool",
        "langgraph-cancel",
    ):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def machine_speed() -> dict[str, float]:
    """A fixed piece of Python work and a fixed in-memory SQLite query, in microseconds
    (medians): the same code on a slower phase of the machine shows here first."""
    import sqlite3

    def med(fn: Any, reps: int) -> float:
        return round(time_median(fn, reps) * 1e6, 2)

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", ((i, str(i)) for i in range(1000)))
    try:
        return {
            "python_us": med(lambda: sorted(str(i) for i in range(200)), 2000),
            "sqlite_us": med(
                lambda: conn.execute("SELECT v FROM t WHERE k = 500").fetchone(), 5000
            ),
            "thread_hop_us": med(_thread_hop, 500),
        }
    finally:
        conn.close()


def _thread_hop() -> None:
    done = threading.Event()
    threading.Thread(target=done.set).start()
    done.wait()


def metadata(settings: Settings) -> dict[str, Any]:
    dirty = _git("status", "--porcelain", "--", "langgraph_cancel")
    import sqlite3

    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": _git("rev-parse", "HEAD"),
        "library_tree_dirty": bool(dirty) if dirty is not None else None,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "versions": _versions(),
        "quick": settings.quick,
        "backends": list(settings.backends),
        "sections": list(settings.sections),
        "scale_max": settings.scale_max,
        "latency_trials": settings.latency_trials,
        "batches": list(settings.batches) if settings.batches else None,
        "reps": settings.reps,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "machine_speed_start": machine_speed(),
    }


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    res: dict[str, Any] = {"meta": metadata(settings)}
    backends = list(settings.backends)
    if "postgres" in backends:
        problem = (
            "no DSN: pass --pg-dsn or set " + PG_DSN_ENV
            if not settings.pg_dsn
            else pg_ping(settings.pg_dsn)
        )
        if problem:
            log(f"PostgreSQL skipped: {problem}")
            res["meta"]["postgres_skipped"] = problem
            backends.remove("postgres")
        else:
            assert settings.pg_dsn
            res["meta"]["postgres"] = pg_server_info(settings.pg_dsn)
    res["meta"]["backends_run"] = backends
    durations: dict[str, float] = {}
    t_all = time.perf_counter()
    from benchmarks import (
        cli_startup,
        floor,
        latency,
        overhead,
        profile,
        recovery,
        scale,
        server,
        throughput,
    )

    modules = {
        "floor": floor,
        "server": server,
        "cli_startup": cli_startup,
        "overhead": overhead,
        "profile": profile,
        "latency": latency,
        "scale": scale,
        "recovery": recovery,
        "throughput": throughput,
    }
    try:
        for name in SECTIONS:
            if name not in settings.sections:
                continue
            t0 = time.perf_counter()
            log(f"== {name} (load average {os.getloadavg()[0]:.1f})")
            res[name] = modules[name].run(settings, backends)
            durations[name] = round(time.perf_counter() - t0, 1)
    finally:
        shutil.rmtree(settings.workdir, ignore_errors=True)
    res["meta"]["section_seconds"] = durations
    res["meta"]["total_seconds"] = round(time.perf_counter() - t_all, 1)
    res["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    res["meta"]["machine_speed_end"] = machine_speed()
    log(
        f"machine speed (python / sqlite / thread hop, us): start "
        f"{res['meta']['machine_speed_start']}, end {res['meta']['machine_speed_end']}"
    )
    res["targets"] = evaluate_targets(res, settings)
    res["notes"] = findings(res)
    out = Path(settings.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print_tables(res)
    log(f"wrote {out} in {res['meta']['total_seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

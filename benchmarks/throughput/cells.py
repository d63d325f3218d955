"""One cell: a variant's worker processes on a fresh database, and what they did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import fresh_pg_db, rnd
from benchmarks.throughput.constants import CALLS, ROOT
from benchmarks.throughput.readings import (
    READING_COMMITS,
    commits_and_wal,
    db_bytes,
    ledger_rows,
    sample_activity,
    server_cpu_s,
    statement_summary,
    statement_times,
    statements_ready,
)
from benchmarks.throughput.worker import setup_schema


def measure(
    variant: str, workers: int, runs: int, dsn: str, tool_ms: float = 0.0, calls: int = CALLS
) -> dict[str, Any]:
    """One cell: ``workers`` processes of ``variant`` on a fresh database."""
    with fresh_pg_db(dsn, f"tp{variant[0]}{workers}") as url, tempfile.TemporaryDirectory() as tmp:
        setup_schema(variant, url)
        go = os.path.join(tmp, "go")
        procs = []
        results: list[str] = []
        for worker in range(workers):
            spec: dict[str, Any] = {
                "variant": variant,
                "url": url,
                "runs": runs,
                "tool_ms": tool_ms,
                "calls": calls,
                "ready": os.path.join(tmp, f"ready-{worker}"),
                "go": go,
                "result": os.path.join(tmp, f"result-{worker}.json"),
            }
            results.append(spec["result"])
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.throughput", json.dumps(spec)],
                    cwd=ROOT,
                )
            )
        deadline = time.monotonic() + 120
        while not all(
            os.path.exists(os.path.join(tmp, f"ready-{worker}")) for worker in range(workers)
        ):
            if time.monotonic() > deadline or any(
                process.poll() not in (None, 0) for process in procs
            ):
                for process in procs:
                    process.kill()
                raise RuntimeError(f"throughput workers did not start ({variant}, {workers})")
            time.sleep(0.05)
        bytes_before = db_bytes(url)
        rows_before = ledger_rows(url)
        time.sleep(1.0)  # the warm-up backends have exited: their counts are in
        commits_before, wal_before, flushes_before = commits_and_wal(url)
        counting = statements_ready(url)
        samples: list[dict[str, int]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_activity, args=(url, stop, samples), daemon=True)
        sampler.start()
        server_before = server_cpu_s()
        Path(go).write_text("go")
        for process in procs:
            process.wait(600)
        server_after = server_cpu_s()
        stop.set()
        sampler.join(5)
        done = [json.loads(Path(r).read_text()) for r in results]
        statements = statement_times(url) if counting else None
        time.sleep(1.0)  # the workers' backends report their counts as they exit
        commits_after, wal_after, flushes_after = commits_and_wal(url)
        bytes_after = db_bytes(url)
        rows_after = ledger_rows(url)
    wall = max(d["ended"] for d in done) - min(d["started"] for d in done)
    total = sum(d["runs"] for d in done)
    cpu = sum(d["cpu_s"] for d in done)
    added_rows = {t: rows_after.get(t, 0) - rows_before.get(t, 0) for t in rows_after}
    bytes_per_run = (bytes_after - bytes_before) / total

    def mean(key: str) -> float | None:
        return rnd(sum(s[key] for s in samples) / len(samples), 2) if samples else None

    server_cpu = (
        None if server_before is None or server_after is None else server_after - server_before
    )
    spent = None if statements is None else statement_summary(statements, total)
    return {
        "variant": variant,
        "workers": workers,
        "tool_ms": tool_ms,
        "calls": calls,
        "runs": total,
        "wall_s": rnd(wall),
        "runs_per_s": rnd(total / wall, 2),
        "calls_per_s": rnd(total * calls / wall, 1),
        # Less the parent's own: the sampler's one statement per sample and the two of
        # the first reading (counted when its connection closed).
        "commits_per_run": rnd(
            (commits_after - commits_before - len(samples) - READING_COMMITS) / total, 1
        ),
        "wal_bytes_per_run": rnd((wal_after - wal_before) / total, 0),
        # The server's, for every database: other sessions on the server count too.
        "wal_flushes_per_run": rnd((flushes_after - flushes_before) / total, 1),
        "worker_cpu_s": rnd(cpu),
        "worker_cpu_ms_per_run": rnd(cpu * 1000 / total, 1),
        "worker_cpu_share_of_wall": rnd(cpu / (wall * workers), 3),
        # Over the whole measured span (the parent's sampler included: one statement
        # every 50 ms); None when the server is not on this machine.
        "server_cpu_ms_per_run": None if server_cpu is None else rnd(server_cpu * 1000 / total, 1),
        "mean_lock_waits": mean("lock_waits"),
        "max_lock_waits": max((s["lock_waits"] for s in samples), default=None),
        "mean_active_backends": mean("active"),
        "mean_io_or_lwlock_waits": mean("io"),
        # The workers' sessions on the cell's database (the sampler's own excluded).
        "mean_connections": mean("connections"),
        "max_connections": max((s["connections"] for s in samples), default=None),
        "ledger_rows_per_run": rnd(sum(added_rows.values()) / total, 2) if added_rows else None,
        "ledger_rows_per_run_by_table": {
            table: rnd(rows / total, 2) for table, rows in added_rows.items()
        },
        "bytes_per_run": rnd(bytes_per_run, 0),
        "gb_per_100k_runs": rnd(bytes_per_run * 1e5 / 1e9, 3),
        # The server's own time in statements (None without pg_stat_statements).
        "statements": spent,
        "ledger_statement_ms_per_run": None if spent is None else spent["ms_per_run"]["ledger"],
        "checkpoints_statement_ms_per_run": (
            None if spent is None else spent["ms_per_run"]["checkpoints"]
        ),
    }

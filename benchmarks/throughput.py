"""Throughput: runs and side-effecting calls per second with 1, 2 and 4 worker processes.

The same agent (one model turn with ``CALLS`` side-effecting calls, then a final
answer; tools take no time) runs in W worker processes on one PostgreSQL database,
each worker running its own threads one after the other:

- ``plain``: ``ToolNode`` on LangGraph's ``PostgresSaver``;
- ``effect``: ``EffectToolNode`` + ``add_cancellation`` on ``PostgresCancelSaver``
  (every call's intent written before it is dispatched, its outcome after; a lease
  per run);
- ``bound``: ``plain`` plus only the durable writes invariant I1 asks of any
  implementation (``benchmarks/bound.py``): a commit that waits for the flush before
  each call, and one that does not at the end. Its distance from ``plain`` is a floor
  under ours; it runs where the tools take no time.

Each worker imports, connects and warms up, then waits for a start file; runs/s is
the runs of all workers over the wall time from the start to the last worker's
end. While they run, the parent samples ``pg_stat_activity`` (backends waiting on a
lock, active connections); afterwards it reads the workers' CPU time and the
database's size. The ledger's rows per run are counted in its tables, and the
database size per 10^5 runs is extrapolated from the bytes the run added.

The section turns ``fsync`` and ``synchronous_commit`` on for its duration (``ALTER
SYSTEM`` + ``pg_reload_conf()``, put back afterwards): a commit then costs a disk
flush, as it does in production. Its target: ``effect`` within 15 % of ``plain`` at
every worker count, with tools that take no time (the package's whole cost shows).

Where the server preloads ``pg_stat_statements`` (``./scripts/bench`` does, when its
PostgreSQL has the module), each cell also reads the server's own time in statements,
the ledger's apart from LangGraph's checkpoint saver's, and the ledger's costliest
statements.

A shared machine's speed drifts by more than the difference measured, so the cells
run in rounds, the variants back to back at each worker count, and each figure is the
median over the rounds (the spread is kept beside it); a gap between two variants is
the median of the rounds' own gaps. A cell's runs are shared among its workers, so
every cell lasts a few seconds. A second set
of rows gives tools a latency (``TOOL_LATENCY_MS``, a fast internal API), where the
package's cost is a share of a run that also waits for its tools; there ours sends
a batch's calls at once (``effect_concurrency``), as ``ToolNode`` does, instead of
its default of one side effect at a time. A third set asks for one call a turn
(``ONE_CALL``), the shape of most agents' turns, where a batch's plan is one write
per call rather than one per three. The server's CPU
time is read from its processes (``/proc``) when the server runs on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.bound import TABLE as BOUND_TABLE
from benchmarks.bound import BoundWriter
from benchmarks.common import Settings, fresh_pg_db, log, plan_work, rnd

ROOT = Path(__file__).resolve().parent.parent
WORKER_COUNTS = (1, 2, 4)
CALLS = 3
#: Calls a turn in the third set of rows (none with ``--quick``).
ONE_CALL = 1
#: Runs of a cell, shared among its workers: every cell lasts a few seconds, so a
#: second of a busy machine weighs as much at one worker as at four.
RUNS_PER_CELL = 480
QUICK_RUNS_PER_WORKER = 10
#: Rounds of every cell (one with ``--quick``): a figure is the median of its rounds.
ROUNDS = 5
#: The tools' latency in the second set of rows (none with ``--quick``).
TOOL_LATENCY_MS = 10.0
WARMUP_RUNS = 2
LEDGER_TABLES = (
    "lgc_runs",
    "lgc_effects",
    "lgc_transitions",
    "lgc_leases",
    "lgc_lease_takeovers",
    BOUND_TABLE,
)
TARGET_PCT = 15.0
#: Transactions one ``_commits_and_wal`` reading commits.
_READING_COMMITS = 2


# =========================================================================== worker side
def _graph(
    variant: str,
    saver: Any,
    tool_ms: float = 0.0,
    calls: int = CALLS,
    writer: BoundWriter | None = None,
) -> Any:
    """The agent; with tools that take time, ours sends a batch's calls at once, as
    ``ToolNode`` does (its default sends side effects one at a time). ``writer``: the
    ``bound`` variant's durable writes around each call."""
    from benchmarks.agent import SIDE_EFFECT, build_graph, make_tool, scripted_model

    tool = make_tool(SIDE_EFFECT, tool_ms)
    return build_graph(
        [tool],
        scripted_model(calls),
        saver,
        effectful=variant == "effect",
        effect_concurrency=calls if tool_ms else 1,
        wrap_tool_call=None if writer is None else writer.wrap_tool_call,
    )


def _open_saver(variant: str, url: str) -> Any:
    if variant in ("plain", "bound"):
        from langgraph.checkpoint.postgres import PostgresSaver

        return PostgresSaver.from_conn_string(url)
    from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

    return PostgresCancelSaver.from_conn_string(url)


def worker_main(spec: dict[str, Any]) -> None:
    """One worker process: warm up, wait for the start file, run, report.

    The warm-up runs on a saver of its own, closed before the worker says it is
    ready: a backend reports its transaction counts when it exits (or up to a
    second later), so the warm-up's commits are in the parent's first reading
    and the measured runs' commits are in its last.
    """
    from langchain_core.messages import HumanMessage

    variant, url = spec["variant"], spec["url"]
    tool_ms = float(spec.get("tool_ms", 0.0))
    calls = int(spec.get("calls", CALLS))

    def run(graph: Any, writer: BoundWriter | None) -> None:
        thread_id = uuid.uuid4().hex
        if writer is not None:
            writer.start(thread_id)
        out = graph.invoke(
            {"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": thread_id}}
        )
        if writer is not None:
            writer.end()
        assert len(out["messages"]) == calls + 3, out["messages"]

    def bound_writer(stack: contextlib.ExitStack) -> BoundWriter | None:
        return stack.enter_context(BoundWriter.connect(url)) if variant == "bound" else None

    with contextlib.ExitStack() as stack:
        saver = stack.enter_context(_open_saver(variant, url))
        writer = bound_writer(stack)
        graph = _graph(variant, saver, tool_ms, calls, writer)
        for _ in range(WARMUP_RUNS):
            run(graph, writer)
    with contextlib.ExitStack() as stack:
        saver = stack.enter_context(_open_saver(variant, url))
        writer = bound_writer(stack)
        graph = _graph(variant, saver, tool_ms, calls, writer)
        Path(spec["ready"]).write_text("ready")
        go = Path(spec["go"])
        while not go.exists():
            time.sleep(0.005)
        cpu0 = time.process_time()
        started = time.time()
        for _ in range(spec["runs"]):
            run(graph, writer)
        ended = time.time()
        cpu = time.process_time() - cpu0
    Path(spec["result"]).write_text(
        json.dumps({"started": started, "ended": ended, "cpu_s": cpu, "runs": spec["runs"]})
    )


# =========================================================================== parent side
def _sample(url: str, stop: threading.Event, samples: list[dict[str, int]]) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'),"
                " count(*) FILTER (WHERE state = 'active'),"
                " count(*), count(*) FILTER (WHERE wait_event_type IN ('IO', 'LWLock'))"
                " FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchone()
            if row is not None:
                samples.append(
                    {"lock_waits": row[0], "active": row[1], "connections": row[2], "io": row[3]}
                )
            stop.wait(0.05)


def _db_bytes(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


def _commits_and_wal(url: str) -> tuple[int, int, int]:
    """Transactions committed in the database so far, the server's WAL position, and
    the WAL flushes to disk the server has done (``pg_stat_wal.wal_sync``)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT xact_commit, pg_current_wal_lsn() - '0/0'::pg_lsn,"
            " (SELECT wal_sync FROM pg_stat_wal)"
            " FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


def _ledger_rows(url: str) -> dict[str, int]:
    import psycopg

    rows: dict[str, int] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for table in LEDGER_TABLES:
            exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
            if exists and exists[0]:
                found = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                rows[table] = int(found[0]) if found else 0
    return rows


#: The families of statements the server's time is told apart by (``pg_stat_statements``).
STATEMENT_FAMILIES = ("ledger", "checkpoints", "other")


def statement_family(query: str) -> str:
    """Which family a statement belongs to: the ledger's (its tables are ``lgc_*``, the
    ``bound`` variant's its own),
    LangGraph's checkpoint saver's, or anything else (this section's own readings)."""
    text = query.lower()
    if "lgc_" in text or BOUND_TABLE in text:
        return "ledger"
    if "checkpoint" in text:
        return "checkpoints"
    return "other"


def _statements_ready(url: str) -> bool:
    """Whether the server counts statements (``pg_stat_statements`` preloaded): the
    extension is created in the database and its counts for it are cleared."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute(
                "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                " WHERE datname = current_database()), 0)"
            )
    except psycopg.Error:
        return False
    return True


def _statement_times(url: str) -> list[dict[str, Any]]:
    """The server's time per statement in this database since ``_statements_ready``:
    execution and planning, in ms, with the calls."""
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT query, calls, total_exec_time + total_plan_time AS ms"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
            " WHERE datname = current_database())"
        ).fetchall()


def statement_summary(rows: list[dict[str, Any]], runs: int) -> dict[str, Any]:
    """Per run: the server's statement time (ms) and statements by family, and the
    ledger's costliest statements (time per run and per call)."""
    time_ms = dict.fromkeys(STATEMENT_FAMILIES, 0.0)
    calls = dict.fromkeys(STATEMENT_FAMILIES, 0)
    by_name: dict[str, list[float]] = {}
    for row in rows:
        family = statement_family(row["query"])
        time_ms[family] += float(row["ms"])
        calls[family] += int(row["calls"])
        if family == "ledger":
            spent = by_name.setdefault(ledger_statement_name(row["query"]), [0.0, 0.0])
            spent[0] += int(row["calls"])
            spent[1] += float(row["ms"])
    costliest = sorted(by_name.items(), key=lambda item: -item[1][1])[:6]
    return {
        "ms_per_run": {family: rnd(ms / runs, 3) for family, ms in time_ms.items()},
        "statements_per_run": {family: rnd(n / runs, 2) for family, n in calls.items()},
        "costliest_ledger": [
            {
                "statement": name,
                "per_run": rnd(count / runs, 2),
                "us_per_call": rnd(ms * 1000 / max(count, 1), 0),
            }
            for name, (count, ms) in costliest
        ],
    }


def _shape(text: str) -> str:
    """A statement with its parameters blanked and its spacing made one blank."""
    return " ".join(re.sub(r"%\(\w+\)s|\$\d+", "?", text).lower().split())


def _common_start(first: str, second: str) -> int:
    """How many leading characters two strings share."""
    return next(
        (at for at, (one, other) in enumerate(zip(first, second, strict=False)) if one != other),
        min(len(first), len(second)),
    )


def ledger_statement_name(query: str) -> str:
    """The name of the ledger's SQL constant (``ledger/sql.py``) a statement the server
    counted was made from: the constant whose text starts the same way the longest
    (templates are filled in before they run, so only their beginning is compared).
    The statement's own beginning when none matches."""
    from langgraph_cancel.ledger import sql as ledger_sql

    shape = _shape(query)
    best, best_length = "", 0
    for name, text in vars(ledger_sql).items():
        if not (name.isupper() and isinstance(text, str)):
            continue
        length = _common_start(shape, _shape(text))
        if length > best_length:
            best, best_length = name, length
    return best if best_length >= 60 else shape[:60]


def _server_cpu_s() -> float | None:
    """CPU seconds used so far by this machine's PostgreSQL processes (None: none here).

    A backend that has exited counts too: the postmaster, which reaps it, holds its
    time as its children's (``cutime``, ``cstime``).
    """
    ticks = os.sysconf("SC_CLK_TCK")
    total, found = 0.0, False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read().split(b"\0", 1)[0]
            if not (command.startswith(b"postgres") or command.endswith(b"/postgres")):
                continue
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a process that ended meanwhile
        total += sum(int(value) for value in fields[11:15]) / ticks
        found = True
    return total if found else None


def step_costs(dsn: str, cycles: int) -> dict[str, Any]:
    """What one ledger operation of a run costs, beside one plain single-row commit.

    A cycle is the ledger's part of the throughput agent's run, called directly on a
    ``PostgresCancelSaver``'s ledger: the run's start, a plan of 3 effects, each
    effect's intent and outcome, the run's end (9 operations, each its own commit
    waiting for the disk). Client CPU from ``process_time``, the server's from its
    processes (None when it is not on this machine); per operation, against the
    same figures for a one-row ``INSERT`` in autocommit on a plain connection.
    """
    import psycopg

    from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
    from langgraph_cancel.types import EffectStatus

    operations_per_cycle = 9

    def per_operation(work: Any, operations: int) -> dict[str, Any]:
        server_before, cpu_before = _server_cpu_s(), time.process_time()
        started = time.perf_counter()
        work()
        wall = time.perf_counter() - started
        cpu, server_after = time.process_time() - cpu_before, _server_cpu_s()
        server = None
        if server_before is not None and server_after is not None:
            server = rnd((server_after - server_before) * 1e6 / operations, 0)
        return {
            "wall_us": rnd(wall * 1e6 / operations, 0),
            "client_cpu_us": rnd(cpu * 1e6 / operations, 0),
            "server_cpu_us": server,
        }

    with fresh_pg_db(dsn, "steps") as url, PostgresCancelSaver.from_conn_string(url) as saver:
        saver.setup()
        ledger = saver.ledger

        def cycle() -> None:
            thread_id = uuid.uuid4().hex
            started = ledger.start_run(thread_id)
            planned = plan_work(ledger, thread_id, started.run_id, CALLS, "call")
            for entry in planned:
                assert isinstance(entry, tuple), entry
                effect_id = entry[0].effect_id
                ledger.transition(effect_id, EffectStatus.DISPATCHED, actor="bench")
                ledger.transition(
                    effect_id, EffectStatus.COMMITTED, actor="bench", result=f"ok {effect_id}"
                )
            ledger.finish_run(started.run_id, "completed")

        for _ in range(5):
            cycle()

        def cycles_in_a_row() -> None:
            for _ in range(cycles):
                cycle()

        ledger_cost = per_operation(cycles_in_a_row, cycles * operations_per_cycle)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE floor (id bigint PRIMARY KEY, note text NOT NULL)")

            def commits() -> None:
                for n in range(cycles * operations_per_cycle):
                    conn.execute("INSERT INTO floor (id, note) VALUES (%s, %s)", (n, "x"))

            commit_cost = per_operation(commits, cycles * operations_per_cycle)
    return {
        "operations_per_cycle": operations_per_cycle,
        "cycles": cycles,
        "ledger_operation": ledger_cost,
        "single_row_commit": commit_cost,
    }


def _setup_schema(variant: str, url: str) -> None:
    with _open_saver(variant, url) as saver:
        saver.setup()
    if variant == "bound":
        with BoundWriter.connect(url) as writer:
            writer.setup()


def measure(
    variant: str, workers: int, runs: int, dsn: str, tool_ms: float = 0.0, calls: int = CALLS
) -> dict[str, Any]:
    """One cell: ``workers`` processes of ``variant`` on a fresh database."""
    with fresh_pg_db(dsn, f"tp{variant[0]}{workers}") as url, tempfile.TemporaryDirectory() as tmp:
        _setup_schema(variant, url)
        go = os.path.join(tmp, "go")
        procs = []
        results: list[str] = []
        for n in range(workers):
            spec: dict[str, Any] = {
                "variant": variant,
                "url": url,
                "runs": runs,
                "tool_ms": tool_ms,
                "calls": calls,
                "ready": os.path.join(tmp, f"ready-{n}"),
                "go": go,
                "result": os.path.join(tmp, f"result-{n}.json"),
            }
            results.append(spec["result"])
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.throughput", json.dumps(spec)],
                    cwd=ROOT,
                )
            )
        deadline = time.monotonic() + 120
        while not all(os.path.exists(os.path.join(tmp, f"ready-{n}")) for n in range(workers)):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError(f"throughput workers did not start ({variant}, {workers})")
            time.sleep(0.05)
        bytes_before = _db_bytes(url)
        rows_before = _ledger_rows(url)
        time.sleep(1.0)  # the warm-up backends have exited: their counts are in
        commits_before, wal_before, flushes_before = _commits_and_wal(url)
        counting = _statements_ready(url)
        samples: list[dict[str, int]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=_sample, args=(url, stop, samples), daemon=True)
        sampler.start()
        server_before = _server_cpu_s()
        Path(go).write_text("go")
        for p in procs:
            p.wait(600)
        server_after = _server_cpu_s()
        stop.set()
        sampler.join(5)
        done = [json.loads(Path(r).read_text()) for r in results]
        statements = _statement_times(url) if counting else None
        time.sleep(1.0)  # the workers' backends report their counts as they exit
        commits_after, wal_after, flushes_after = _commits_and_wal(url)
        bytes_after = _db_bytes(url)
        rows_after = _ledger_rows(url)
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
            (commits_after - commits_before - len(samples) - _READING_COMMITS) / total, 1
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
        "ledger_rows_per_run_by_table": {t: rnd(n / total, 2) for t, n in added_rows.items()},
        "bytes_per_run": rnd(bytes_per_run, 0),
        "gb_per_100k_runs": rnd(bytes_per_run * 1e5 / 1e9, 3),
        # The server's own time in statements (None without pg_stat_statements).
        "statements": spent,
        "ledger_statement_ms_per_run": None if spent is None else spent["ms_per_run"]["ledger"],
        "checkpoints_statement_ms_per_run": (
            None if spent is None else spent["ms_per_run"]["checkpoints"]
        ),
    }


def _durable(dsn: str, on: bool) -> dict[str, str]:
    """Turn fsync and synchronous_commit on (or back to the server's file) for the section."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in ("fsync", "synchronous_commit"):
            if on:
                conn.execute(f"ALTER SYSTEM SET {name} = on")
            else:
                conn.execute(f"ALTER SYSTEM RESET {name}")
        conn.execute("SELECT pg_reload_conf()")
        time.sleep(0.2)
        settings: dict[str, str] = {}
        for name in ("fsync", "synchronous_commit"):
            row = conn.execute(f"SHOW {name}").fetchone()
            settings[name] = str(row[0]) if row else "?"
        return settings


def run(settings: Settings, backends: list[str]) -> dict[str, Any]:
    """The ``throughput`` section (PostgreSQL only)."""
    if "postgres" not in backends or not settings.pg_dsn:
        return {"skipped": "needs PostgreSQL"}
    assert settings.pg_dsn

    def runs_per_worker(workers: int) -> int:
        return QUICK_RUNS_PER_WORKER if settings.quick else RUNS_PER_CELL // workers

    rounds = 1 if settings.quick else ROUNDS
    # (tool latency, calls a turn): the target's shape first.
    shapes = [(0.0, CALLS)]
    if not settings.quick:
        shapes += [(TOOL_LATENCY_MS, CALLS), (0.0, ONE_CALL)]
    server = _durable(settings.pg_dsn, True)
    cells: list[dict[str, Any]] = []
    try:
        log("throughput: what one ledger operation costs")
        steps = step_costs(settings.pg_dsn, 10 if settings.quick else 60)
        for round_no in range(rounds):
            for tool_ms, calls in shapes:
                for workers in WORKER_COUNTS:
                    for variant in _variants(tool_ms):
                        log(
                            f"throughput: round {round_no + 1}/{rounds} {variant} x{workers}"
                            f" {calls} calls, tools {tool_ms:g} ms"
                        )
                        cell = measure(
                            variant,
                            workers,
                            runs_per_worker(workers),
                            settings.pg_dsn,
                            tool_ms,
                            calls,
                        )
                        cell["round"] = round_no
                        cells.append(cell)
    finally:
        _durable(settings.pg_dsn, False)
    summaries = [
        _summary(cells, variant, workers, tool_ms, calls)
        for tool_ms, calls in shapes
        for workers in WORKER_COUNTS
        for variant in _variants(tool_ms)
    ]

    def rows_of(tool_ms: float, calls: int) -> list[dict[str, Any]]:
        if (tool_ms, calls) not in shapes:
            return []
        return [_row(summaries, cells, workers, tool_ms, calls) for workers in WORKER_COUNTS]

    return {
        "server": server,
        "calls_per_run": CALLS,
        "runs_per_worker": {workers: runs_per_worker(workers) for workers in WORKER_COUNTS},
        "rounds": rounds,
        "cells": cells,
        "summaries": summaries,
        "rows": rows_of(0.0, CALLS),
        "rows_with_tool_latency": rows_of(TOOL_LATENCY_MS, CALLS),
        "rows_with_one_call": rows_of(0.0, ONE_CALL),
        "step_costs": steps,
        "target_pct": TARGET_PCT,
    }


def _variants(tool_ms: float) -> tuple[str, ...]:
    """The variants measured: ``bound`` sends one call at a time, so only where the
    tools take no time (ours does too there, and ``ToolNode``'s threads gain nothing)."""
    return ("plain", "effect") if tool_ms else ("plain", "bound", "effect")


#: The cell figures a summary gives as the median over the rounds.
_SUMMARIZED = (
    "runs_per_s",
    "calls_per_s",
    "commits_per_run",
    "wal_flushes_per_run",
    "wal_bytes_per_run",
    "worker_cpu_ms_per_run",
    "worker_cpu_share_of_wall",
    "server_cpu_ms_per_run",
    "mean_lock_waits",
    "mean_connections",
    "ledger_rows_per_run",
    "gb_per_100k_runs",
    "ledger_statement_ms_per_run",
    "checkpoints_statement_ms_per_run",
)


def _cell_key(item: dict[str, Any]) -> tuple[str, int, float, int]:
    """A cell's or a summary's (variant, workers, tool latency, calls a turn)."""
    return item["variant"], item["workers"], item.get("tool_ms", 0.0), item.get("calls", CALLS)


def _summary(
    cells: list[dict[str, Any]], variant: str, workers: int, tool_ms: float, calls: int
) -> dict[str, Any]:
    """One (variant, workers, tool latency, calls): each figure's median over the rounds."""
    mine = [c for c in cells if _cell_key(c) == (variant, workers, tool_ms, calls)]
    out: dict[str, Any] = {
        "variant": variant,
        "workers": workers,
        "tool_ms": tool_ms,
        "calls": calls,
    }
    for key in _SUMMARIZED:
        values = [c[key] for c in mine if c.get(key) is not None]
        out[key] = rnd(statistics.median(values), 2) if values else None
    speeds = [c["runs_per_s"] for c in mine]
    out["runs_per_s_range"] = [min(speeds), max(speeds)]
    out["max_lock_waits"] = max((c["max_lock_waits"] or 0 for c in mine), default=None)
    out["max_connections"] = max((c.get("max_connections") or 0 for c in mine), default=None)
    return out


def round_gaps(
    cells: list[dict[str, Any]], key: tuple[int, float, int], slower: str, faster: str
) -> list[float]:
    """How much fewer runs/s ``slower`` made than ``faster`` in each round, in %.

    A round runs the variants of a worker count back to back, so its cells share
    the machine's phase; the median of these gaps is steadier than the gap between
    the two medians when the machine's speed drifts between rounds.
    """
    by_round: dict[int, dict[str, float]] = {}
    for cell in cells:
        if _cell_key(cell)[1:] == key:
            by_round.setdefault(cell.get("round", 0), {})[cell["variant"]] = cell["runs_per_s"]
    return [
        round((1 - speeds[slower] / speeds[faster]) * 100, 1)
        for _, speeds in sorted(by_round.items())
        if speeds.get(faster) and slower in speeds
    ]


def _row(
    summaries: list[dict[str, Any]],
    cells: list[dict[str, Any]],
    workers: int,
    tool_ms: float,
    calls: int,
) -> dict[str, Any]:
    """One worker count of a shape: each variant's medians, and the gaps between the
    variants as the median of the rounds' own gaps."""

    def find(variant: str) -> dict[str, Any] | None:
        return next(
            (s for s in summaries if _cell_key(s) == (variant, workers, tool_ms, calls)), None
        )

    plain, ours, least = find("plain"), find("effect"), find("bound")
    assert plain is not None and ours is not None
    key = (workers, tool_ms, calls)
    gaps = round_gaps(cells, key, "effect", "plain")
    gap = statistics.median(gaps)
    bound_figures: dict[str, Any] = {}
    if least is not None:
        bound_gaps = round_gaps(cells, key, "bound", "plain")
        above_bound = round_gaps(cells, key, "effect", "bound")
        bound_figures = {
            "bound_runs_per_s": least["runs_per_s"],
            "bound_runs_per_s_range": least["runs_per_s_range"],
            "bound_slower_pct": rnd(statistics.median(bound_gaps), 1),
            "bound_slower_pct_by_round": bound_gaps,
            "slower_than_bound_pct": rnd(statistics.median(above_bound), 1),
            "slower_than_bound_pct_by_round": above_bound,
        }
    return {
        "workers": workers,
        "tool_ms": tool_ms,
        "calls": calls,
        "plain_runs_per_s": plain["runs_per_s"],
        "effect_runs_per_s": ours["runs_per_s"],
        "plain_runs_per_s_range": plain["runs_per_s_range"],
        "effect_runs_per_s_range": ours["runs_per_s_range"],
        "plain_calls_per_s": plain["calls_per_s"],
        "effect_calls_per_s": ours["calls_per_s"],
        "slower_pct": rnd(gap, 1),
        "slower_pct_by_round": gaps,
        "within_target": gap <= TARGET_PCT,
        **bound_figures,
    }


def table(result: dict[str, Any]) -> str:
    """The section's results as Markdown tables: tools that take no time (the target),
    then tools with a latency, then one call a turn."""
    if "rows" not in result:
        return f"throughput: {result.get('skipped', 'no result')}"
    summaries = result.get("summaries") or result["cells"]
    found = {_cell_key(s): s for s in summaries}
    header = [
        "| calls a turn | tools | workers | plain runs/s | ours runs/s | slower | "
        "calls/s (ours / plain) | "
        "ledger rows/run | GB per 10^5 runs (ours / plain) | commits/run (ours / plain) | "
        "WAL flushes/run (ours / plain) | WAL kB/run (ours / plain) | lock waits (mean, max) | "
        "worker CPU ms/run (ours / plain) | server CPU ms/run (ours / plain) | "
        "server statement ms/run: ledger + checkpoints (ours) / checkpoints (plain) | "
        "worker CPU / wall (ours / plain) | connections: mean, max (ours / plain) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def spread(row: dict[str, Any], variant: str) -> str:
        low, high = row.get(f"{variant}_runs_per_s_range") or (None, None)
        return "" if low is None or low == high else f" ({low}-{high})"

    def kb(value: Any) -> Any:
        return None if value is None else rnd(value / 1024, 1)

    def connections(summary: dict[str, Any]) -> str:
        return f"{summary.get('mean_connections')}, {summary.get('max_connections')}"

    def statement_time(ours: dict[str, Any], plain: dict[str, Any]) -> str:
        ledger, checkpoints = (
            ours.get("ledger_statement_ms_per_run"),
            ours.get("checkpoints_statement_ms_per_run"),
        )
        if ledger is None or checkpoints is None:
            return "n/a"
        return f"{ledger} + {checkpoints} / {plain.get('checkpoints_statement_ms_per_run')}"

    lines = list(header)
    every_row = [
        *result["rows"],
        *result.get("rows_with_tool_latency", []),
        *result.get("rows_with_one_call", []),
    ]
    for row in every_row:
        key, calls = row.get("tool_ms", 0.0), row.get("calls", CALLS)
        plain = found[("plain", row["workers"], key, calls)]
        ours = found[("effect", row["workers"], key, calls)]
        verdict = ("PASS" if row["within_target"] else "MISS") if not key else "(no target)"
        lines.append(
            f"| {calls} | {key:g} ms | {row['workers']} | "
            f"{row['plain_runs_per_s']}{spread(row, 'plain')} | "
            f"{row['effect_runs_per_s']}{spread(row, 'effect')} | "
            f"{row['slower_pct']} % {verdict} | "
            f"{row['effect_calls_per_s']} / {row['plain_calls_per_s']} | "
            f"{ours['ledger_rows_per_run']} | {ours['gb_per_100k_runs']} / "
            f"{plain['gb_per_100k_runs']} | "
            f"{ours['commits_per_run']} / {plain['commits_per_run']} | "
            f"{ours.get('wal_flushes_per_run')} / {plain.get('wal_flushes_per_run')} | "
            f"{kb(ours['wal_bytes_per_run'])} / {kb(plain['wal_bytes_per_run'])} | "
            f"{ours['mean_lock_waits']}, {ours['max_lock_waits']} | "
            f"{ours.get('worker_cpu_ms_per_run')} / {plain.get('worker_cpu_ms_per_run')} | "
            f"{ours.get('server_cpu_ms_per_run')} / {plain.get('server_cpu_ms_per_run')} | "
            f"{statement_time(ours, plain)} | "
            f"{ours['worker_cpu_share_of_wall']} / {plain['worker_cpu_share_of_wall']} | "
            f"{connections(ours)} / {connections(plain)} |"
        )
    lines += _bound_table(every_row, found)
    steps = result.get("step_costs")
    if steps:
        ours, floor = steps["ledger_operation"], steps["single_row_commit"]
        lines += [
            "",
            "| per operation (fsync on) | wall us | client CPU us | server CPU us |",
            "|---|---|---|---|",
            f"| a ledger operation of a run | {ours['wall_us']} | {ours['client_cpu_us']} | "
            f"{ours['server_cpu_us']} |",
            f"| a one-row INSERT, autocommit | {floor['wall_us']} | {floor['client_cpu_us']} | "
            f"{floor['server_cpu_us']} |",
        ]
    costliest = next(
        (
            cell["statements"]["costliest_ledger"]
            for cell in result["cells"]
            if cell["variant"] == "effect"
            and cell["workers"] == 1
            and not cell.get("tool_ms")
            and cell.get("calls", CALLS) == CALLS
            and cell.get("statements")
        ),
        None,
    )
    if costliest:
        lines += [
            "",
            "| the ledger's costliest statements (1 worker, first round) | per run | "
            "server us per call |",
            "|---|---|---|",
            *(
                f"| `{entry['statement']}` | {entry['per_run']} | {entry['us_per_call']} |"
                for entry in costliest
            ),
        ]
    return "\n".join(lines)


def _bound_table(
    rows: list[dict[str, Any]], found: dict[tuple[str, int, float, int], dict[str, Any]]
) -> list[str]:
    """The ``bound`` variant beside ``plain`` and ours, where it ran."""
    measured = [row for row in rows if row.get("bound_runs_per_s") is not None]
    if not measured:
        return []
    lines = [
        "",
        "| calls a turn | workers | plain runs/s | bound runs/s | bound slower than plain | "
        "ours runs/s | ours slower than bound | commits/run (bound / ours) | "
        "worker CPU ms/run (bound / ours) | server CPU ms/run (bound / ours) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in measured:
        key = (row["workers"], row.get("tool_ms", 0.0), row.get("calls", CALLS))
        least, ours = found[("bound", *key)], found[("effect", *key)]
        lines.append(
            f"| {key[2]} | {key[0]} | {row['plain_runs_per_s']} | {row['bound_runs_per_s']} | "
            f"{row['bound_slower_pct']} % | {row['effect_runs_per_s']} | "
            f"{row['slower_than_bound_pct']} % | "
            f"{least['commits_per_run']} / {ours['commits_per_run']} | "
            f"{least.get('worker_cpu_ms_per_run')} / {ours.get('worker_cpu_ms_per_run')} | "
            f"{least.get('server_cpu_ms_per_run')} / {ours.get('server_cpu_ms_per_run')} |"
        )
    return lines


if __name__ == "__main__":
    worker_main(json.loads(sys.argv[1]))

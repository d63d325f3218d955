"""The section: cells in rounds, each figure's median over the rounds, and the rows
that set ours beside plain LangGraph and the floor."""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.common import Settings, log, rnd
from benchmarks.throughput.cells import measure
from benchmarks.throughput.constants import (
    CALLS,
    ONE_CALL,
    QUICK_RUNS_PER_WORKER,
    ROUNDS,
    RUNS_PER_CELL,
    TARGET_PCT,
    TOOL_LATENCY_MS,
    WORKER_COUNTS,
)
from benchmarks.throughput.steps import step_costs


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


def cell_key(item: dict[str, Any]) -> tuple[str, int, float, int]:
    """A cell's or a summary's (variant, workers, tool latency, calls a turn)."""
    return item["variant"], item["workers"], item.get("tool_ms", 0.0), item.get("calls", CALLS)


def _summary(
    cells: list[dict[str, Any]], variant: str, workers: int, tool_ms: float, calls: int
) -> dict[str, Any]:
    """One (variant, workers, tool latency, calls): each figure's median over the rounds."""
    mine = [c for c in cells if cell_key(c) == (variant, workers, tool_ms, calls)]
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
        if cell_key(cell)[1:] == key:
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
            (s for s in summaries if cell_key(s) == (variant, workers, tool_ms, calls)), None
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

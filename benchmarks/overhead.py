"""Per-call overhead: the same agent graph with ToolNode vs EffectToolNode, side by side."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from typing import Any

from benchmarks.agent import (
    READ_ONLY,
    SIDE_EFFECT,
    arun_once,
    async_savers,
    build_graph,
    make_tool,
    run_once,
    savers,
    scripted_model,
)
from benchmarks.common import (
    PG_NOSYNC,
    Settings,
    log,
    median,
    paired_ratio,
    ratio,
    rnd,
    summary,
)


def plan(settings: Settings) -> dict[str, Any]:
    """Batch sizes, tool durations and repetitions for this mode."""
    if settings.quick:
        cfg: dict[str, Any] = {
            "batches": [1, 10],
            "tool_ms": [0, 5],
            "reps": {1: 2, 10: 2},
            "warmup": 0,
        }
    else:
        cfg = {
            "batches": [1, 10, 100],
            "tool_ms": [0, 5],
            # N=10 carries the 10%-of-wall targets: enough pairs for a usable interval
            # on a machine whose speed moves by +-15% between trials.
            "reps": {1: 16, 10: 30, 100: 8},
            "warmup": 1,
        }
    if settings.batches:
        cfg["batches"] = list(settings.batches)
        cfg["reps"] = {n: cfg["reps"].get(n, 3) for n in settings.batches}
    if settings.reps:
        cfg["reps"] = {n: settings.reps for n in cfg["batches"]}
    return cfg


def _fit(points: list[tuple[int, float]]) -> tuple[float | None, float | None]:
    """Least squares: added(N) = fixed + per_call * N. Returns (fixed, per_call)."""
    if len({n for n, _ in points}) < 2:
        return None, None
    count = len(points)
    sx = sum(n for n, _ in points)
    sy = sum(y for _, y in points)
    sxx = sum(n * n for n, _ in points)
    sxy = sum(n * y for n, y in points)
    per_call = (count * sxy - sx * sy) / (count * sxx - sx * sx)
    fixed = (sy - per_call * sx) / count
    return fixed, per_call


def _paired(name: str, base: list[float], other: list[float]) -> dict[str, Any]:
    """``paired_<name>``: the median of the per-pair added %, and its 95% interval."""
    est = paired_ratio(base, other)
    if est is None:
        return {}
    mid, low, high = (rnd(x * 100 - 100, 1) for x in est)
    return {f"paired_{name}": mid, f"paired_{name}_ci95": [low, high]}


#: The 10-call batch of 5 ms tools the 10%-of-wall targets are about (also run async).
ASYNC_CELL = (10, 5.0)


@contextlib.contextmanager
def _normal_sync_saver(backend: str, settings: Settings) -> Iterator[Any]:
    """On SQLite, LangGraph's ``SqliteSaver`` with ``synchronous=NORMAL`` (else None)."""
    if backend != "sqlite":
        yield None
        return
    from langgraph.checkpoint.sqlite import SqliteSaver

    directory = tempfile.mkdtemp(prefix="overhead-normal-", dir=settings.workdir)
    conn = sqlite3.connect(os.path.join(directory, "base.db"), check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        saver = SqliteSaver(conn)
        saver.setup()
        yield saver
    finally:
        conn.close()


def measure_cell(
    base_saver: Any,
    cancel_saver: Any,
    calls: int,
    tool_ms: float,
    kind: str,
    reps: int,
    warmup: int,
    normal_saver: Any = None,
) -> dict[str, dict[str, list[float]]]:
    """Interleaved trials (ABAB...) of the plain and the effect graph on fresh threads.

    ``normal_saver``: also the plain graph on it (``base_normal``).

    Returns ``{variant: {"wall": [...], "cpu": [...]}}`` in seconds.
    """
    tools = [make_tool(kind, tool_ms)]
    variants: dict[str, Any] = {
        "base": build_graph(tools, scripted_model(calls), base_saver, effectful=False),
        "effect": build_graph(tools, scripted_model(calls), cancel_saver, effectful=True),
    }
    if normal_saver is not None:
        variants["base_normal"] = build_graph(
            tools, scripted_model(calls), normal_saver, effectful=False
        )
    if kind == SIDE_EFFECT and calls > 1:
        # The default runs side effects one at a time, in plan order; this variant
        # lets a whole batch run at once, like ToolNode does, so its intents and its
        # outcomes are each written in one statement. (At N = 1 the two are the same.)
        variants["effect_concurrent"] = build_graph(
            tools, scripted_model(calls), cancel_saver, effectful=True, effect_concurrency=calls
        )
    expect = calls + 3  # human, AI with n calls, n tool messages, final AI
    for _ in range(warmup):
        for graph in variants.values():
            run_once(graph, expect)
    samples: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in variants}
    names = list(variants)
    # Collect once, then freeze what exists: a full collection during a trial then only
    # scans objects made since (cheap and alike for both variants).
    gc.collect()
    gc.freeze()
    try:
        for rep in range(reps):
            for name in names if rep % 2 == 0 else reversed(names):
                wall, cpu = run_once(variants[name], expect)
                samples[name]["wall"].append(wall)
                samples[name]["cpu"].append(cpu)
    finally:
        gc.unfreeze()
    return samples


async def _ameasure(
    backend: str, settings: Settings, kind: str, reps: int, warmup: int
) -> dict[str, dict[str, list[float]]]:
    """``measure_cell`` through ``ainvoke`` on the async savers (interleaved pairs)."""
    calls, tool_ms = ASYNC_CELL
    tools = [make_tool(kind, tool_ms)]
    expect = calls + 3
    async with async_savers(backend, settings) as (base_saver, cancel_saver):
        variants = {
            "base": build_graph(tools, scripted_model(calls), base_saver, effectful=False),
            "effect": build_graph(tools, scripted_model(calls), cancel_saver, effectful=True),
        }
        if kind == SIDE_EFFECT:
            variants["effect_concurrent"] = build_graph(
                tools, scripted_model(calls), cancel_saver, effectful=True, effect_concurrency=calls
            )
        for _ in range(warmup + 1):
            for graph in variants.values():
                await arun_once(graph, expect)
        samples: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in variants}
        names = list(variants)
        for rep in range(reps):
            for name in names if rep % 2 == 0 else reversed(names):
                wall, cpu = await arun_once(variants[name], expect)
                samples[name]["wall"].append(wall)
                samples[name]["cpu"].append(cpu)
    return samples


def run_async(settings: Settings, backends: list[str], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The 10 x 5 ms cells again, through ``ainvoke`` (a LangGraph server's way)."""
    cells: list[dict[str, Any]] = []
    calls, tool_ms = ASYNC_CELL
    reps = cfg["reps"].get(calls, max(cfg["reps"].values()))
    for backend in backends:
        for kind in (SIDE_EFFECT, READ_ONLY):
            samples = asyncio.run(_ameasure(backend, settings, kind, reps, cfg["warmup"]))
            base = median(samples["base"]["wall"])
            eff = median(samples["effect"]["wall"])
            assert base is not None and eff is not None
            cell: dict[str, Any] = {
                "backend": backend,
                "kind": kind,
                "tool_ms": tool_ms,
                "n_calls": calls,
                "mode": "async (ainvoke)",
                "base_ms": summary(samples["base"]["wall"], scale=1e3),
                "effect_ms": summary(samples["effect"]["wall"], scale=1e3),
                "added_us_per_call": rnd((eff - base) * 1e6 / calls, 1),
                "added_pct": rnd((ratio(eff, base) or 0) * 100 - 100, 1),
            }
            cell.update(_paired("added_pct", samples["base"]["wall"], samples["effect"]["wall"]))
            if "effect_concurrent" in samples:
                cell["effect_concurrent_ms"] = summary(
                    samples["effect_concurrent"]["wall"], scale=1e3
                )
                cell.update(
                    _paired(
                        "effect_concurrent_added_pct",
                        samples["base"]["wall"],
                        samples["effect_concurrent"]["wall"],
                    )
                )
            cells.append(cell)
            log(
                f"  async {backend:8s} {kind:14s} tool={tool_ms:g}ms N={calls} "
                f"base={base * 1e3:8.2f}ms effect={eff * 1e3:8.2f}ms "
                f"paired added={cell.get('paired_added_pct')}%"
            )
    return cells


def run(settings: Settings, backends: list[str]) -> dict[str, Any]:
    """The whole grid; returns the section's JSON."""
    cfg = plan(settings)
    cells: list[dict[str, Any]] = []
    fits: list[dict[str, Any]] = []
    if "postgres" in backends:
        # The library alone beside the headline: the same server, commits not waiting
        # for the WAL flush.
        backends = [*backends, PG_NOSYNC]
    for backend in backends:
        log(f"overhead: {backend}")
        with (
            savers(backend, settings) as (base_saver, cancel_saver),
            _normal_sync_saver(backend, settings) as normal_saver,
        ):
            for kind in (SIDE_EFFECT, READ_ONLY):
                for tool_ms in cfg["tool_ms"]:
                    points: list[tuple[int, float]] = []
                    cpu_points: list[tuple[int, float]] = []
                    # added(N) with the batch at once (effect_concurrency=N); N = 1 is
                    # the default variant itself.
                    conc_points: list[tuple[int, float]] = []
                    for calls in cfg["batches"]:
                        samples = measure_cell(
                            base_saver,
                            cancel_saver,
                            calls,
                            tool_ms,
                            kind,
                            cfg["reps"][calls],
                            cfg["warmup"],
                            normal_saver if (calls, tool_ms) == ASYNC_CELL else None,
                        )
                        base = median(samples["base"]["wall"])
                        eff = median(samples["effect"]["wall"])
                        base_cpu = median(samples["base"]["cpu"])
                        eff_cpu = median(samples["effect"]["cpu"])
                        assert base is not None and eff is not None
                        assert base_cpu is not None and eff_cpu is not None
                        added = eff - base
                        added_cpu = eff_cpu - base_cpu
                        points.append((calls, added))
                        cpu_points.append((calls, added_cpu))
                        if kind == SIDE_EFFECT and calls == 1:
                            conc_points.append((calls, added))
                        cell: dict[str, Any] = {
                            "backend": backend,
                            "kind": kind,
                            "tool_ms": tool_ms,
                            "n_calls": calls,
                            "base_ms": summary(samples["base"]["wall"], scale=1e3),
                            "effect_ms": summary(samples["effect"]["wall"], scale=1e3),
                            "added_ms": rnd(added * 1e3),
                            "added_us_per_call": rnd(added * 1e6 / calls, 1),
                            "ratio": rnd(ratio(eff, base)),
                            "added_pct": rnd((ratio(eff, base) or 0) * 100 - 100, 1),
                            "base_cpu_ms": rnd(base_cpu * 1e3),
                            "effect_cpu_ms": rnd(eff_cpu * 1e3),
                            "added_cpu_us_per_call": rnd(added_cpu * 1e6 / calls, 1),
                        }
                        cell.update(
                            _paired("added_pct", samples["base"]["wall"], samples["effect"]["wall"])
                        )
                        if "base_normal" in samples:
                            # SqliteCancelSaver commits with synchronous=NORMAL (as its
                            # ledger does); LangGraph's SqliteSaver keeps SQLite's FULL.
                            # Against a plain saver set alike: the library's own cost.
                            cell["base_normal_ms"] = summary(
                                samples["base_normal"]["wall"], scale=1e3
                            )
                            for variant, key in (
                                ("effect", "added_pct_vs_normal_base"),
                                ("effect_concurrent", "effect_concurrent_added_pct_vs_normal_base"),
                            ):
                                if variant in samples:
                                    normal = samples["base_normal"]["wall"]
                                    cell.update(_paired(key, normal, samples[variant]["wall"]))
                        if "effect_concurrent" in samples:
                            conc = median(samples["effect_concurrent"]["wall"])
                            assert conc is not None
                            conc_points.append((calls, conc - base))
                            cell["effect_concurrent_ms"] = summary(
                                samples["effect_concurrent"]["wall"], scale=1e3
                            )
                            cell["effect_concurrent_ratio"] = rnd(ratio(conc, base))
                            cell["effect_concurrent_added_pct"] = rnd(
                                (ratio(conc, base) or 0) * 100 - 100, 1
                            )
                            cell.update(
                                _paired(
                                    "effect_concurrent_added_pct",
                                    samples["base"]["wall"],
                                    samples["effect_concurrent"]["wall"],
                                )
                            )
                        cells.append(cell)
                        log(
                            f"  {backend:8s} {kind:14s} tool={tool_ms}ms N={calls:<3d} "
                            f"base={base * 1e3:8.2f}ms effect={eff * 1e3:8.2f}ms "
                            f"added/call={added * 1e6 / calls:9.1f}us ratio={eff / base:5.2f} "
                            f"cpu added/call={added_cpu * 1e6 / calls:9.1f}us"
                        )
                    fixed, per_call = _fit(points)
                    cpu_fixed, cpu_per_call = _fit(cpu_points)
                    conc_fixed, conc_per_call = _fit(conc_points)
                    fits.append(
                        {
                            "backend": backend,
                            "kind": kind,
                            "tool_ms": tool_ms,
                            "fixed_ms_per_run": rnd(None if fixed is None else fixed * 1e3),
                            "marginal_us_per_call": rnd(
                                None if per_call is None else per_call * 1e6, 1
                            ),
                            "cpu_fixed_ms_per_run": rnd(
                                None if cpu_fixed is None else cpu_fixed * 1e3
                            ),
                            "cpu_marginal_us_per_call": rnd(
                                None if cpu_per_call is None else cpu_per_call * 1e6, 1
                            ),
                            "fit": "least squares of added(N) = fixed + marginal * N over "
                            f"N in {[calls for calls, _ in points]}",
                        }
                    )
                    if conc_per_call is not None:
                        assert conc_fixed is not None
                        fits[-1]["concurrent_fixed_ms_per_run"] = rnd(conc_fixed * 1e3)
                        fits[-1]["concurrent_marginal_us_per_call"] = rnd(conc_per_call * 1e6, 1)
    log("overhead: the 10 x 5 ms cells through ainvoke")
    async_cells = run_async(settings, backends, cfg)
    return {
        "method": (
            "Same graph (agent -> tools -> agent) and scripted model; plain ToolNode on "
            "LangGraph's saver vs EffectToolNode + add_cancellation on the matching "
            "CancelSaver (each on its own fresh database). graph.invoke (sync, default "
            "durability) on a fresh thread per trial, plain and effect trials interleaved, "
            "medians; paired_* = median over trial pairs of effect/base (the pair ran back to "
            "back), with a 95% bootstrap interval. Side-effecting = irreversible without "
            "approval; read-only = read_only. "
            "added_us_per_call = (median effect - median base) / N, so it includes the "
            "per-run fixed cost amortised over the batch; 'marginal' is the slope over N. "
            "cpu = process CPU time (all threads of the benchmark process; the database "
            "server's CPU is not in it), less sensitive to other load on the machine. "
            "async_cells: the N=10, 5 ms cells again through graph.ainvoke (as a LangGraph "
            "server runs graphs) on LangGraph's async savers (InMemorySaver, "
            "AsyncSqliteSaver, AsyncPostgresSaver) vs ours (MemoryCancelSaver, "
            "AsyncSqliteCancelSaver, AsyncPostgresCancelSaver), side effects also with "
            "effect_concurrency=10. postgres_nosync: the PostgreSQL cells again on "
            "databases with synchronous_commit=off (the library's cost without the WAL "
            "flush wait)."
        ),
        "config": {**cfg, "reps": {str(k): v for k, v in cfg["reps"].items()}},
        "cells": cells,
        "fits": fits,
        "async_cells": async_cells,
    }

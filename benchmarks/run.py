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

# The targets.
RO_MAX_US = 100.0
#: 10 read-only calls of 5 ms: added wall over ToolNode, in %.
RO_BATCH_MAX_PCT = 5.0
#: 10 side-effecting calls of 5 ms with effect_concurrency=10: added wall, in %.
BATCH_MAX_PCT = 10.0
#: One at a time on PostgreSQL: per call at most this many commit floors plus the slack.
PG_FLOOR_FACTOR = 1.3
PG_FLOOR_SLACK_MS = 0.2
#: One at a time in memory (all Python), per call.
MEMORY_SE_MAX_US = 150.0
#: A run of one 0 ms side-effecting call, added over ToolNode, in commit floors.
PG_RUN_MAX_COMMITS = 2
PG_LATENCY_P99_MS = 50.0
SQLITE_LATENCY_SLACK_MS = 10.0
SCALE_MAX_GROWTH = 2.0


# =========================================================================== CLI
def parse_args(argv: list[str] | None) -> Settings:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1-minute smoke run with small sizes")
    p.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated subset of memory,sqlite,postgres",
    )
    p.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)}",
    )
    p.add_argument("--pg-dsn", default=None, help=f"PostgreSQL server DSN (default ${PG_DSN_ENV})")
    p.add_argument(
        "--scale-max",
        type=int,
        default=None,
        help="largest settled-row count for the scale section (default 1000000; --quick: 10000)",
    )
    p.add_argument(
        "--latency-trials",
        type=int,
        default=None,
        help="cancel-latency trials per backend (default 30; --quick: 3)",
    )
    p.add_argument(
        "--batches",
        default=None,
        help="per-call overhead batch sizes, comma-separated (default 1,10,100; --quick: 1,10)",
    )
    p.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions per overhead cell (default: 16/30/8 for N=1/10/100)",
    )
    p.add_argument(
        "--out",
        default=str(ROOT / "benchmarks" / "results" / "latest.json"),
        help="where to write the JSON",
    )
    a = p.parse_args(argv)
    backends = tuple(b.strip() for b in a.backends.split(",") if b.strip())
    sections = tuple(s.strip() for s in a.sections.split(",") if s.strip())
    bad = [b for b in backends if b not in BACKENDS] + [s for s in sections if s not in SECTIONS]
    if bad:
        p.error(f"unknown backend/section: {', '.join(bad)}")
    return Settings(
        quick=a.quick,
        backends=backends,
        sections=sections,
        pg_dsn=a.pg_dsn or os.environ.get(PG_DSN_ENV) or None,
        scale_max=a.scale_max or (10_000 if a.quick else 1_000_000),
        latency_trials=a.latency_trials or (3 if a.quick else 30),
        batches=tuple(int(x) for x in a.batches.split(",")) if a.batches else None,
        reps=a.reps,
        out=a.out,
    )


# =========================================================================== metadata
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

    def med(fn: Any, n: int) -> float:
        return round(time_median(fn, n) * 1e6, 2)

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


# =========================================================================== targets
def _cell(
    res: dict[str, Any], backend: str, kind: str, tool_ms: float, n: int
) -> dict[str, Any] | None:
    for c in res.get("overhead", {}).get("cells", []):
        if (c["backend"], c["kind"], c["tool_ms"], c["n_calls"]) == (backend, kind, tool_ms, n):
            return dict(c)
    return None


def _fit(res: dict[str, Any], backend: str, kind: str, tool_ms: float) -> dict[str, Any] | None:
    for f in res.get("overhead", {}).get("fits", []):
        if (f["backend"], f["kind"], f["tool_ms"]) == (backend, kind, tool_ms):
            return dict(f)
    return None


def _paired_text(cell: dict[str, Any]) -> str:
    if "paired_added_pct" not in cell:
        return ""
    low, high = cell["paired_added_pct_ci95"]
    return f"{cell['paired_added_pct']:+.1f} [{low:+.1f}, {high:+.1f}]"


#: A row that reports a cost no target covers (its detail says why).
INFO = "info"


def _paired_pct(cell: dict[str, Any], name: str) -> tuple[float, str]:
    """The paired estimate of ``name`` (trials back to back) when there is one, as a
    number and as text with its 95% interval."""
    pct = cell.get(f"paired_{name}", cell[name])
    measured = f"{pct:+.1f}%"
    if f"paired_{name}_ci95" in cell:
        low, high = cell[f"paired_{name}_ci95"]
        measured += f" (95% CI {low:+.1f}..{high:+.1f}%)"
    return pct, measured


def _status(ok: bool | str | None) -> str:
    if isinstance(ok, str):
        return ok
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def _async_cell(res: dict[str, Any], backend: str, kind: str) -> dict[str, Any] | None:
    for a in res.get("overhead", {}).get("async_cells", []):
        if a["backend"] == backend and a["kind"] == kind:
            return dict(a)
    return None


def _floor_ms(res: dict[str, Any], backend: str) -> float | None:
    floor = res.get("floor", {}).get("backends", {}).get(backend)
    return None if floor is None else float(floor["commit_ms"]["median"])


def _overhead_backends(res: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for c in res["overhead"]["cells"]:
        if c["backend"] not in seen:
            seen.append(c["backend"])
    return seen


def overhead_targets(res: dict[str, Any], add: Any) -> None:
    """The per-call and per-run cost targets, as ratios and floors of the same run."""
    batches = res["overhead"]["config"]["batches"]
    for b in _overhead_backends(res):
        f = _fit(res, b, "read_only", 0)
        m = f["marginal_us_per_call"] if f else None
        c10 = _cell(res, b, "read_only", 0, 10) or {}
        add(
            f"{b}: <=0.1 ms per read-only call (marginal)",
            f"{m} us/call" if m is not None else "n/a",
            None if m is None else m <= RO_MAX_US,
            f"amortised at N=10: {c10.get('added_us_per_call')} us/call",
        )
    for b in _overhead_backends(res):
        sync_ro = _cell(res, b, "read_only", 5, 10)
        sync_se = _cell(res, b, "side_effecting", 5, 10)
        async_ro = _async_cell(res, b, "read_only")
        async_se = _async_cell(res, b, "side_effecting")
        rows = (
            ("read-only", "invoke", sync_ro, "added_pct", RO_BATCH_MAX_PCT),
            ("read-only", "ainvoke", async_ro, "added_pct", RO_BATCH_MAX_PCT),
            (
                "side-effecting, effect_concurrency=10",
                "invoke",
                sync_se,
                "effect_concurrent_added_pct",
                BATCH_MAX_PCT,
            ),
            (
                "side-effecting, effect_concurrency=10",
                "ainvoke",
                async_se,
                "effect_concurrent_added_pct",
                BATCH_MAX_PCT,
            ),
        )
        for what, mode, cell, name, limit in rows:
            if not cell or name not in cell:
                continue
            pct, measured = _paired_pct(cell, name)
            effect_key = "effect_ms" if name == "added_pct" else "effect_concurrent_ms"
            add(
                f"{b}: <=+{limit:g}% wall, 10 x 5 ms {what} ({mode})",
                measured,
                pct <= limit,
                f"median of {cell['base_ms']['n']} interleaved pairs; medians: ToolNode "
                f"{cell['base_ms']['median']} ms, EffectToolNode {cell[effect_key]['median']} ms",
            )
        for what, sync_cell, async_cell, name in (
            ("read-only", sync_ro, async_ro, "added_pct"),
            ("side-effecting, batch at once", sync_se, async_se, "effect_concurrent_added_pct"),
        ):
            if not sync_cell or not async_cell or f"paired_{name}" not in async_cell:
                continue
            sync_pct = sync_cell.get(f"paired_{name}", sync_cell.get(name))
            high = sync_cell.get(f"paired_{name}_ci95", [sync_pct, sync_pct])[1]
            async_pct = async_cell[f"paired_{name}"]
            add(
                f"{b}: ainvoke as good as invoke, 10 x 5 ms {what}",
                f"{async_pct:+.1f}% vs {sync_pct:+.1f}%",
                async_pct <= max(high, sync_pct),
                "added wall over ToolNode through ainvoke (async savers) vs through invoke; "
                "PASS when the ainvoke figure is within the invoke figure's 95% interval "
                "or below it",
            )
    for b in _overhead_backends(res):
        f = _fit(res, b, "side_effecting", 0)
        m = f["marginal_us_per_call"] if f else None
        floor = _floor_ms(res, b)
        c1 = _cell(res, b, "side_effecting", 0, batches[0])
        if b == "memory":
            add(
                f"memory: <={MEMORY_SE_MAX_US / 1000:g} ms per side-effecting call, one at a "
                "time (marginal)",
                f"{m} us/call" if m is not None else "n/a",
                None if m is None else m <= MEMORY_SE_MAX_US,
                "slope of the added time over N="
                + "/".join(map(str, batches))
                + ", the default schedule; all Python",
            )
        if not b.startswith("postgres") or floor is None:
            continue
        limit_us = (PG_FLOOR_FACTOR * floor + PG_FLOOR_SLACK_MS) * 1000
        add(
            f"{b}: <={PG_FLOOR_FACTOR:g} x floor + {PG_FLOOR_SLACK_MS:g} ms per side-effecting "
            "call, one at a time (marginal)",
            f"{m} us/call (limit {limit_us:.0f})" if m is not None else "n/a",
            None if m is None else m <= limit_us,
            f"floor: one commit {floor} ms; slope of the added time over N="
            + "/".join(map(str, batches))
            + " (0 ms tools), the default schedule",
        )
        if c1 and batches[0] == 1:
            added_ms = float(c1["added_us_per_call"]) / 1000
            add(
                f"{b}: a run's fixed cost (1 call of 0 ms) <= {PG_RUN_MAX_COMMITS} commits",
                f"{added_ms:.2f} ms = {added_ms / floor:.1f} commits",
                added_ms <= PG_RUN_MAX_COMMITS * floor,
                f"floor: one commit {floor} ms; ToolNode {c1['base_ms']['median']} ms vs "
                f"EffectToolNode {c1['effect_ms']['median']} ms per invoke",
            )


def evaluate_targets(res: dict[str, Any], settings: Settings) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(target: str, measured: str, ok: bool | str | None, detail: str = "") -> None:
        rows.append(
            {"target": target, "measured": measured, "status": _status(ok), "detail": detail}
        )

    if "overhead" in res:
        overhead_targets(res, add)
    if "server" in res:
        srv = res["server"]
        add(
            "langgraph dev: added latency per run and per side-effecting call",
            f"+{srv['added_ms_per_run']} ms per run, "
            f"+{srv['added_ms_per_side_effecting_call']} ms per call",
            INFO,
            f"through the server (langgraph_sdk runs.wait), ledger on {srv['ledger']}; no "
            "target covers it: the per-call and per-run targets above are the library's",
        )
        stop = srv["stop_summary"]
        add(
            "langgraph dev: runs.cancel(wait=True) -> report in the thread state",
            f"median {stop['report_in_state_ms'].get('median')} ms "
            f"(final report {stop['final_report_ms'].get('median')} ms)",
            INFO,
            f"runs.cancel returned after a median {stop['cancel_returned_ms'].get('median')} "
            "ms; the first report read is the stop under way (cancelling, naming the call "
            "in flight) or the final one",
        )
    if "latency" in res:
        lat = res["latency"]["backends"]
        if "postgres" in lat:
            c = lat["postgres"]["check"]["seen_ms"]
            add(
                "PG (LISTEN/NOTIFY): cancel seen p99 < 50 ms",
                f"p99 {c.get('p99')} ms",
                None if c.get("p99") is None else c["p99"] < PG_LATENCY_P99_MS,
                f"p50 {c.get('median')} ms over {c.get('n')} trials, requested_at -> check",
            )
        if "sqlite" in lat:
            c = lat["sqlite"]["check"]["seen_ms"]
            poll = lat["sqlite"].get("poll_interval_ms") or 50.0
            limit = poll + SQLITE_LATENCY_SLACK_MS
            add(
                f"SQLite (poll {poll:g} ms): cancel seen p99 < {limit:g} ms",
                f"p99 {c.get('p99')} ms",
                None if c.get("p99") is None else c["p99"] < limit,
                f"p50 {c.get('median')} ms over {c.get('n')} trials",
            )
    if "scale" in res:
        for b, u in res["scale"]["unsettled"].items():
            first, last = u["steps"][0], u["steps"][-1]
            add(
                f"{b}: unsettled() flat within 2x ({first['settled_rows']:,} -> "
                f"{last['settled_rows']:,} rows)",
                f"x{u['growth_heavy']} heavy, x{u['growth_light']} light",
                None
                if u["growth_heavy"] is None
                else max(u["growth_heavy"], u["growth_light"] or 0) <= SCALE_MAX_GROWTH,
                f"heavy thread {first['heavy_us']['median']} -> {last['heavy_us']['median']} us",
            )
            if u.get("growth_write") is not None:
                add(
                    f"{b}: side effect's write pair flat within 2x (slowest vs fastest "
                    f"of {first['settled_rows']:,} -> {last['settled_rows']:,} rows)",
                    f"x{u['growth_write']}",
                    u["growth_write"] <= SCALE_MAX_GROWTH,
                    " -> ".join(str(s["write_pair_us"]["median"]) for s in u["steps"]) + " us",
                )
    from benchmarks.cli_startup import targets as cli_targets

    rows += cli_targets(res)
    return rows


# =========================================================================== notes
def findings(res: dict[str, Any]) -> list[str]:
    """Plain-language findings computed from the measurements (no hand-tuned numbers)."""
    notes: list[str] = []
    meta = res["meta"]
    cpus = meta.get("cpus") or 1
    load = max(meta.get("loadavg_start", [0])[0], meta.get("loadavg_end", [0])[0])
    if load > cpus:
        notes.append(
            f"Machine was busy: 1-min load average up to {load:.1f} on {cpus} CPUs during this "
            "run; wall-clock numbers carry that noise (CPU-time columns are less affected)."
        )
    prof = res.get("profile", {}).get("backends", {})
    micro = res.get("profile", {}).get("micro", {})
    for b, entry in prof.items():
        se = entry.get("side_effecting")
        prim = entry.get("ledger_primitives_us", {})
        if se:
            top = [d for d in se["breakdown"] if not d["what"].startswith("EffectToolNode (whole")]
            top_txt = "; ".join(
                f"{d['what']} {d['ms_per_invoke']} ms "
                f"({d['calls_per_invoke']}x {d['us_per_call']} us)"
                for d in top[:5]
            )
            notes.append(
                f"{b}, 10 side-effecting 0 ms calls: EffectToolNode graph {se['effect_ms']} ms vs "
                f"ToolNode {se['base_ms']} ms (+{se['added_ms']} ms: EffectToolNode alone "
                f"+{se['added_by_node_ms']} ms, "
                f"add_cancellation +{se['added_by_add_cancellation_ms']} ms). "
                f"Ledger DB work per call: {se['db_transactions_per_call']} round-trip units "
                f"(transactions + autocommit statements; {se.get('sql_statements_per_invoke')} "
                f"SQL statements per invoke of {se['n_calls']} calls). Largest inclusive "
                f"costs per invoke: {top_txt}."
            )
        if prim:
            notes.append(
                f"{b} ledger writes outside a graph, per call: side-effecting, one at a time "
                f"(plan + dispatched + committed) {prim.get('side_effecting_call_total_us')} us, "
                f"batched as EffectToolNode writes them (a tenth of plan_many + one "
                f"transition_many: outcome with the next intent) "
                f"{prim.get('side_effecting_call_batched_us')} us; read-only, one at a time "
                f"(find_effect + plan) {prim.get('read_only_call_total_us')} us, batched (a "
                f"tenth of record_many) {prim.get('read_only_call_batched_us')} us; get_run "
                f"(cancel poll) {prim.get('get_run (cancel poll)')} us."
            )
    ab = res.get("profile", {}).get("tool_path_ab") or {}
    if "handover_us_per_call" in ab:
        notes.append(
            f"Diagnostic A/B on memory, {ab['n_calls']} side-effecting 0 ms calls: EffectToolNode "
            f"{ab['as_is_ms']} ms as is (the batch in one supervised worker thread, each call "
            f"inline) vs {ab['handover_per_call_ms']} ms when each call is handed to a thread "
            f"pool and back (ToolNode: {ab['base_ms']} ms): the hand-over costs "
            f"{ab['handover_us_per_call']} us wall / {ab['handover_cpu_us_per_call']} us CPU "
            "per call; for the remainder see the per-backend breakdowns (ledger writes, "
            "per-run work)."
        )
    if micro:
        notes.append(
            f"Python-level costs on this box: asyncio.run() of an empty coroutine "
            f"{micro.get('asyncio_run_empty_us')} us (EffectToolNode's sync entry reuses "
            f"pooled loops instead); a sync tool via tool.ainvoke "
            f"(executor hop, async callbacks; EffectToolNode uses it only for a batch an "
            f"async graph keeps on its loop) "
            f"{micro.get('tool_ainvoke_sync_tool_us_per_call')} us/call vs tool.invoke "
            f"{micro.get('tool_invoke_sync_us_per_call')} us/call."
        )
    for c in res.get("overhead", {}).get("cells", []):
        if c["kind"] == "side_effecting" and c["tool_ms"] == 5 and c["n_calls"] == 10:
            notes.append(
                f"{c['backend']}, 10 x 5 ms side-effecting: {c['added_pct']:+.1f}% wall. "
                "EffectToolNode dispatches side effects one at a time in plan order by default "
                "(effect_concurrency=1) while ToolNode runs the batch in its thread pool; with "
                f"effect_concurrency=10 the same batch is {c.get('effect_concurrent_added_pct')}% "
                "over ToolNode."
            )
    lat = res.get("latency", {}).get("backends", {})
    for b, e in lat.items():
        late = (e.get("graph") or {}).get("late_dispatches") or []
        if late:
            before_obs = sum(1 for d in late if d["dispatched_before_observed"])
            in_window = sum(
                1 for d in late if d["dispatched_after_requested_at_ms"] <= d["request_call_ms"]
            )
            worst = max(d["dispatched_after_requested_at_ms"] for d in late)
            head = (
                f"{b}: the report counted dispatched_after_cancel > 0 for {len(late)} "
                f"dispatch(es), at most {worst} ms after requested_at, while request_cancel "
                f"calls took up to {max(d['request_call_ms'] for d in late)} ms; "
                f"{before_obs} of them were dispatched before the worker observed the signal, "
                f"{in_window} inside their request_cancel call."
            )
            if before_obs == len(late) == in_window:
                head += (
                    " requested_at is stamped by the requester's clock before its transaction "
                    "commits, and a guarded dispatch committing inside that window is ordered "
                    "before the cancel by the database: a timestamp artefact of the report, not "
                    "an I1 violation (stamp requested_at at commit, or count dispatches after "
                    "observed_at)."
                )
            else:
                head += " Dispatches after the observed signal: a possible I1 violation."
            notes.append(head)
        if "graph" in e:
            g = e["graph"]
            notes.append(
                f"{b} graph cancel (5 ms tool per step): requested->observed p50/p99 "
                f"{g['observed_ms'].get('median')}/{g['observed_ms'].get('p99')} ms, ->quiesced "
                f"{g['quiesced_ms'].get('median')}/{g['quiesced_ms'].get('p99')} ms, ->stream "
                f"returned {g['ended_ms'].get('median')}/{g['ended_ms'].get('p99')} ms; "
                f"dispatched_after_cancel max {g.get('dispatched_after_cancel_max')}."
            )
    hyg = res.get("scale", {}).get("hygiene", {})
    sps = hyg.get("same_process_signal") or {}
    if sps.get("cancel_not_seen_at_once"):
        notes.append(
            f"In-process signal: for {sps['cancel_not_seen_at_once']} of {sps['ledgers']} "
            "short-lived ledgers, a request_cancel through the very ledger the run uses was not "
            "seen by the next check (it waits for the poll). The hub registers its listener "
            "once per id(ledger) (runtime.signal.SignalHub._hooked); ids are reused after a ledger "
            "is garbage-collected, so a new ledger at a recycled address is never hooked."
        )
    lst = hyg.get("pg_listener_threads") or {}
    if lst and lst["listen_threads_after"] > lst["listen_threads_before"]:
        notes.append(
            f"PostgreSQL LISTEN threads leak: after opening and closing "
            f"{lst['ledgers_opened_and_closed']} ledgers, {lst['listen_threads_after']} "
            f"listener threads are alive (before: {lst['listen_threads_before']}). "
            "runtime.signal.start_pg_listener loops forever (reconnecting every 0.5 s once its "
            "database is gone) and Ledger.close() does not stop it; each keeps a connection "
            "while the database exists."
        )
    rec = res.get("recovery", {}).get("backends", {})
    for b, e in rec.items():
        if "ours" in e:
            o = e["ours"]
            notes.append(
                f"{b} recovery: process start -> reconciled, completed thread "
                f"{o['to_resumed_ms']['median']} ms median (interpreter "
                f"{o['interpreter_start_ms']['median']}, imports {o['imports_ms']['median']} "
                f"[langgraph_cancel {o['import_langgraph_cancel_ms']['median']}], open+build "
                f"{o['open_and_build_ms']['median']}, invoke(None) {o['invoke_none_ms']['median']} "
                f"ms); provider charges {o['charges_at_provider']} vs plain LangGraph "
                f"{e.get('plain', {}).get('charges_at_provider', '(not run)')} "
                "(the plain resume re-runs the tool)."
            )
    return notes


# =========================================================================== tables
def print_tables(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=200)
    if "overhead" in res:
        t = Table(
            title="Per-call overhead: ToolNode (+LangGraph saver) vs EffectToolNode "
            "+ add_cancellation (+CancelSaver); medians of graph.invoke"
        )
        for col in (
            "backend",
            "kind",
            "tool",
            "N",
            "ToolNode ms",
            "Effect ms",
            "ratio",
            "paired added % [95% CI]",
            "added us/call",
            "CPU added us/call",
            "conc. ratio",
        ):
            t.add_column(col, justify="right" if col not in ("backend", "kind") else "left")
        for c in res["overhead"]["cells"]:
            t.add_row(
                c["backend"],
                c["kind"],
                f"{c['tool_ms']:g} ms",
                str(c["n_calls"]),
                f"{c['base_ms']['median']:.2f}",
                f"{c['effect_ms']['median']:.2f}",
                f"{c['ratio']:.2f}",
                _paired_text(c),
                f"{c['added_us_per_call']:.0f}",
                f"{c['added_cpu_us_per_call']:.0f}",
                f"{c['effect_concurrent_ratio']:.2f}" if "effect_concurrent_ratio" in c else "",
            )
        con.print(t)
        if res["overhead"].get("async_cells"):
            t = Table(
                title="The same 10 x 5 ms cells through graph.ainvoke (as a LangGraph server "
                "runs graphs), on the async savers"
            )
            for col in ("backend", "kind", "ToolNode ms", "Effect ms", "paired added % [95% CI]"):
                t.add_column(col, justify="right" if col not in ("backend", "kind") else "left")
            for c in res["overhead"]["async_cells"]:
                t.add_row(
                    c["backend"],
                    c["kind"],
                    f"{c['base_ms']['median']:.2f}",
                    f"{c['effect_ms']['median']:.2f}",
                    _paired_text(c),
                )
            con.print(t)
        t = Table(title="Fit: added(N) = fixed per run + marginal x N")
        for col in (
            "backend",
            "kind",
            "tool",
            "fixed ms/run",
            "marginal us/call",
            "CPU fixed ms",
            "CPU marginal us",
            "at once: fixed ms / marginal us",
        ):
            t.add_column(col)
        for f in res["overhead"]["fits"]:
            at_once = (
                f"{f['concurrent_fixed_ms_per_run']} / {f['concurrent_marginal_us_per_call']}"
                if "concurrent_marginal_us_per_call" in f
                else ""
            )
            t.add_row(
                f["backend"],
                f["kind"],
                f"{f['tool_ms']:g} ms",
                str(f["fixed_ms_per_run"]),
                str(f["marginal_us_per_call"]),
                str(f["cpu_fixed_ms_per_run"]),
                str(f["cpu_marginal_us_per_call"]),
                at_once,
            )
        con.print(t)
    if "profile" in res:
        t = Table(
            title="Where the added time goes (10 side-effecting 0 ms calls; inclusive, "
            "nested entries overlap)"
        )
        for col in ("backend", "what", "ms/invoke", "calls/invoke", "us/call"):
            t.add_column(col)
        for b, e in res["profile"]["backends"].items():
            se = e.get("side_effecting") or {}
            t.add_row(
                b,
                f"[b]ToolNode {se.get('base_ms')} ms -> EffectToolNode {se.get('effect_ms')} ms; "
                f"{se.get('db_transactions_per_call')} ledger txn/call[/b]",
                "",
                "",
                "",
            )
            for d in se.get("breakdown", [])[:8]:
                t.add_row(
                    "",
                    d["what"],
                    str(d["ms_per_invoke"]),
                    str(d["calls_per_invoke"]),
                    str(d["us_per_call"]),
                )
        con.print(t)
    if "latency" in res:
        t = Table(title="Cancel latency: request_cancel in another process -> worker (ms)")
        for col in ("backend", "measure", "p50", "p99", "max", "n"):
            t.add_column(col)
        for b, e in res["latency"]["backends"].items():
            rows = [("check: requested_at -> seen", e["check"]["seen_ms"])]
            if "graph" in e:
                rows += [
                    ("graph: -> observed (report)", e["graph"]["observed_ms"]),
                    ("graph: -> quiesced (report)", e["graph"]["quiesced_ms"]),
                    ("graph: -> stream returned", e["graph"]["ended_ms"]),
                ]
            for name, s in rows:
                t.add_row(
                    b,
                    name,
                    str(s.get("median")),
                    str(s.get("p99")),
                    str(s.get("max")),
                    str(s.get("n")),
                )
        con.print(t)
    if "scale" in res:
        t = Table(
            title="Scale: unsettled(thread) and a write pair vs settled rows in the ledger (us)"
        )
        for col in (
            "backend",
            "settled rows",
            "load s",
            "light p50",
            "light p99",
            "heavy p50",
            "heavy p99",
            "write pair p50",
        ):
            t.add_column(col)
        for b, u in res["scale"]["unsettled"].items():
            for s in u["steps"]:
                t.add_row(
                    b,
                    f"{s['settled_rows']:,}",
                    str(s["load_s"]),
                    str(s["light_us"]["median"]),
                    str(s["light_us"]["p99"]),
                    str(s["heavy_us"]["median"]),
                    str(s["heavy_us"]["p99"]),
                    str((s.get("write_pair_us") or {}).get("median")),
                )
        con.print(t)
        t = Table(title="Ledger write throughput (plan -> dispatched -> committed per effect)")
        for col in (
            "backend",
            "threads",
            "pool",
            "transitions/s",
            "effects/s",
            "write p50 ms",
            "write p99 ms",
            "client CPU",
            "errors",
        ):
            t.add_column(col)
        for r in res["scale"]["throughput"]:
            t.add_row(
                r["backend"],
                str(r["threads"]),
                str(r["pool_max_size"]),
                str(r["transitions_per_s"]),
                str(r["effects_per_s"]),
                str(r["write_latency_ms"].get("median")),
                str(r["write_latency_ms"].get("p99")),
                str(r["client_cpu_util"]),
                str(r["error_count"]),
            )
        con.print(t)
        t = Table(title="Memory held per open run (tracemalloc, Python heap)")
        for col in ("backend", "open runs", "bytes/run", "left after drop", "top allocator"):
            t.add_column(col)
        for r in res["scale"]["memory"]:
            top = r["top_allocators"][0] if r["top_allocators"] else {}
            t.add_row(
                r["backend"],
                str(r["open_runs"]),
                str(r["bytes_per_open_run"]),
                str(r["bytes_left_per_run_after_drop"]),
                f"{top.get('file')} {top.get('bytes_per_run')} B",
            )
        con.print(t)
    if "recovery" in res:
        t = Table(title="Recovery: process start -> resumed, reconciled thread (ms, median)")
        for col in (
            "backend",
            "variant",
            "to resumed",
            "interpreter",
            "imports",
            "open+build",
            "invoke(None)",
            "charges",
            "effect",
            "run",
        ):
            t.add_column(col)
        for b, e in res["recovery"]["backends"].items():
            if "skipped" in e:
                t.add_row(b, "-", e["skipped"], "", "", "", "", "", "", "")
                continue
            for v in ("ours", "plain"):
                if v not in e:
                    continue
                x = e[v]
                t.add_row(
                    b,
                    v,
                    str(x["to_resumed_ms"]["median"]),
                    str(x["interpreter_start_ms"]["median"]),
                    str(x["imports_ms"]["median"]),
                    str(x["open_and_build_ms"]["median"]),
                    str(x["invoke_none_ms"]["median"]),
                    str(x["charges_at_provider"]),
                    str(x.get("effect_statuses")),
                    str(x.get("run_status")),
                )
        con.print(t)
    from benchmarks.cli_startup import print_table as cli_table

    cli_table(con, res)
    if "throughput" in res:
        from benchmarks.throughput import table as throughput_table

        con.print("[b]Throughput (PostgreSQL, fsync on)[/b]")
        con.print(throughput_table(res["throughput"]))
    t = Table(title="Targets")
    for col in ("target", "measured", "status", "detail"):
        t.add_column(col)
    for r in res["targets"]:
        color = {"PASS": "green", "MISS": "red", INFO: "cyan"}.get(r["status"], "yellow")
        t.add_row(r["target"], r["measured"], f"[{color}]{r['status']}[/{color}]", r["detail"])
    con.print(t)
    if res.get("notes"):
        con.print("[b]Notes[/b]")
        for n in res["notes"]:
            con.print(f" - {n}")


# =========================================================================== main
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

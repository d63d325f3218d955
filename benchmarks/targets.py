"""What the benchmark's results are held against: each target, PASS or MISS (or a cost
no target covers, reported as info), computed from the measurements alone."""

from __future__ import annotations

from typing import Any

from benchmarks.common import Settings

#: A read-only call: its marginal cost over ToolNode, in microseconds.
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


def _cell(
    res: dict[str, Any], backend: str, kind: str, tool_ms: float, calls: int
) -> dict[str, Any] | None:
    for found in res.get("overhead", {}).get("cells", []):
        if (found["backend"], found["kind"], found["tool_ms"], found["n_calls"]) == (
            backend,
            kind,
            tool_ms,
            calls,
        ):
            return dict(found)
    return None


def _fit(res: dict[str, Any], backend: str, kind: str, tool_ms: float) -> dict[str, Any] | None:
    for found in res.get("overhead", {}).get("fits", []):
        if (found["backend"], found["kind"], found["tool_ms"]) == (backend, kind, tool_ms):
            return dict(found)
    return None


def paired_text(cell: dict[str, Any]) -> str:
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
    for found in res.get("overhead", {}).get("async_cells", []):
        if found["backend"] == backend and found["kind"] == kind:
            return dict(found)
    return None


def _floor_ms(res: dict[str, Any], backend: str) -> float | None:
    floor = res.get("floor", {}).get("backends", {}).get(backend)
    return None if floor is None else float(floor["commit_ms"]["median"])


def _overhead_backends(res: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for cell in res["overhead"]["cells"]:
        if cell["backend"] not in seen:
            seen.append(cell["backend"])
    return seen


def overhead_targets(res: dict[str, Any], add: Any) -> None:
    """The per-call and per-run cost targets, as ratios and floors of the same run."""
    batches = res["overhead"]["config"]["batches"]
    for backend in _overhead_backends(res):
        fit = _fit(res, backend, "read_only", 0)
        marginal = fit["marginal_us_per_call"] if fit else None
        c10 = _cell(res, backend, "read_only", 0, 10) or {}
        add(
            f"{backend}: <=0.1 ms per read-only call (marginal)",
            f"{marginal} us/call" if marginal is not None else "n/a",
            None if marginal is None else marginal <= RO_MAX_US,
            f"amortised at N=10: {c10.get('added_us_per_call')} us/call",
        )
    for backend in _overhead_backends(res):
        sync_ro = _cell(res, backend, "read_only", 5, 10)
        sync_se = _cell(res, backend, "side_effecting", 5, 10)
        async_ro = _async_cell(res, backend, "read_only")
        async_se = _async_cell(res, backend, "side_effecting")
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
                f"{backend}: <=+{limit:g}% wall, 10 x 5 ms {what} ({mode})",
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
                f"{backend}: ainvoke as good as invoke, 10 x 5 ms {what}",
                f"{async_pct:+.1f}% vs {sync_pct:+.1f}%",
                async_pct <= max(high, sync_pct),
                "added wall over ToolNode through ainvoke (async savers) vs through invoke; "
                "PASS when the ainvoke figure is within the invoke figure's 95% interval "
                "or below it",
            )
    for backend in _overhead_backends(res):
        fit = _fit(res, backend, "side_effecting", 0)
        marginal = fit["marginal_us_per_call"] if fit else None
        floor = _floor_ms(res, backend)
        c1 = _cell(res, backend, "side_effecting", 0, batches[0])
        if backend == "memory":
            add(
                f"memory: <={MEMORY_SE_MAX_US / 1000:g} ms per side-effecting call, one at a "
                "time (marginal)",
                f"{marginal} us/call" if marginal is not None else "n/a",
                None if marginal is None else marginal <= MEMORY_SE_MAX_US,
                "slope of the added time over N="
                + "/".join(map(str, batches))
                + ", the default schedule; all Python",
            )
        if not backend.startswith("postgres") or floor is None:
            continue
        limit_us = (PG_FLOOR_FACTOR * floor + PG_FLOOR_SLACK_MS) * 1000
        add(
            f"{backend}: <={PG_FLOOR_FACTOR:g} x floor + {PG_FLOOR_SLACK_MS:g} ms per "
            "side-effecting "
            "call, one at a time (marginal)",
            f"{marginal} us/call (limit {limit_us:.0f})" if marginal is not None else "n/a",
            None if marginal is None else marginal <= limit_us,
            f"floor: one commit {floor} ms; slope of the added time over N="
            + "/".join(map(str, batches))
            + " (0 ms tools), the default schedule",
        )
        if c1 and batches[0] == 1:
            added_ms = float(c1["added_us_per_call"]) / 1000
            add(
                f"{backend}: a run's fixed cost (1 call of 0 ms) <= {PG_RUN_MAX_COMMITS} commits",
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
            seen = lat["postgres"]["check"]["seen_ms"]
            add(
                "PG (LISTEN/NOTIFY): cancel seen p99 < 50 ms",
                f"p99 {seen.get('p99')} ms",
                None if seen.get("p99") is None else seen["p99"] < PG_LATENCY_P99_MS,
                f"p50 {seen.get('median')} ms over {seen.get('n')} trials, requested_at -> check",
            )
        if "sqlite" in lat:
            seen = lat["sqlite"]["check"]["seen_ms"]
            poll = lat["sqlite"].get("poll_interval_ms") or 50.0
            limit = poll + SQLITE_LATENCY_SLACK_MS
            add(
                f"SQLite (poll {poll:g} ms): cancel seen p99 < {limit:g} ms",
                f"p99 {seen.get('p99')} ms",
                None if seen.get("p99") is None else seen["p99"] < limit,
                f"p50 {seen.get('median')} ms over {seen.get('n')} trials",
            )
    if "scale" in res:
        for backend, unsettled in res["scale"]["unsettled"].items():
            first, last = unsettled["steps"][0], unsettled["steps"][-1]
            add(
                f"{backend}: unsettled() flat within 2x ({first['settled_rows']:,} -> "
                f"{last['settled_rows']:,} rows)",
                f"x{unsettled['growth_heavy']} heavy, x{unsettled['growth_light']} light",
                None
                if unsettled["growth_heavy"] is None
                else max(unsettled["growth_heavy"], unsettled["growth_light"] or 0)
                <= SCALE_MAX_GROWTH,
                f"heavy thread {first['heavy_us']['median']} -> {last['heavy_us']['median']} us",
            )
            if unsettled.get("growth_write") is not None:
                add(
                    f"{backend}: side effect's write pair flat within 2x (slowest vs fastest "
                    f"of {first['settled_rows']:,} -> {last['settled_rows']:,} rows)",
                    f"x{unsettled['growth_write']}",
                    unsettled["growth_write"] <= SCALE_MAX_GROWTH,
                    " -> ".join(str(s["write_pair_us"]["median"]) for s in unsettled["steps"])
                    + " us",
                )
    from benchmarks.cli_startup import targets as cli_targets

    rows += cli_targets(res)
    return rows

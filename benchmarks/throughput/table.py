"""The section's results as Markdown tables."""

from __future__ import annotations

from typing import Any

from benchmarks.common import rnd
from benchmarks.throughput.constants import CALLS
from benchmarks.throughput.section import cell_key


def table(result: dict[str, Any]) -> str:
    """The section's results as Markdown tables: tools that take no time (the target),
    then tools with a latency, then one call a turn."""
    if "rows" not in result:
        return f"throughput: {result.get('skipped', 'no result')}"
    summaries = result.get("summaries") or result["cells"]
    found = {cell_key(s): s for s in summaries}
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

"""The benchmark's results printed as rich tables, the targets marked PASS or MISS."""

from __future__ import annotations

from typing import Any

from benchmarks.targets import INFO, paired_text


def print_tables(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=200)
    if "overhead" in res:
        table = Table(
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
            table.add_column(col, justify="right" if col not in ("backend", "kind") else "left")
        for cell in res["overhead"]["cells"]:
            table.add_row(
                cell["backend"],
                cell["kind"],
                f"{cell['tool_ms']:g} ms",
                str(cell["n_calls"]),
                f"{cell['base_ms']['median']:.2f}",
                f"{cell['effect_ms']['median']:.2f}",
                f"{cell['ratio']:.2f}",
                paired_text(cell),
                f"{cell['added_us_per_call']:.0f}",
                f"{cell['added_cpu_us_per_call']:.0f}",
                f"{cell['effect_concurrent_ratio']:.2f}"
                if "effect_concurrent_ratio" in cell
                else "",
            )
        con.print(table)
        if res["overhead"].get("async_cells"):
            table = Table(
                title="The same 10 x 5 ms cells through graph.ainvoke (as a LangGraph server "
                "runs graphs), on the async savers"
            )
            for col in ("backend", "kind", "ToolNode ms", "Effect ms", "paired added % [95% CI]"):
                table.add_column(col, justify="right" if col not in ("backend", "kind") else "left")
            for cell in res["overhead"]["async_cells"]:
                table.add_row(
                    cell["backend"],
                    cell["kind"],
                    f"{cell['base_ms']['median']:.2f}",
                    f"{cell['effect_ms']['median']:.2f}",
                    paired_text(cell),
                )
            con.print(table)
        table = Table(title="Fit: added(N) = fixed per run + marginal x N")
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
            table.add_column(col)
        for fit in res["overhead"]["fits"]:
            at_once = (
                f"{fit['concurrent_fixed_ms_per_run']} / {fit['concurrent_marginal_us_per_call']}"
                if "concurrent_marginal_us_per_call" in fit
                else ""
            )
            table.add_row(
                fit["backend"],
                fit["kind"],
                f"{fit['tool_ms']:g} ms",
                str(fit["fixed_ms_per_run"]),
                str(fit["marginal_us_per_call"]),
                str(fit["cpu_fixed_ms_per_run"]),
                str(fit["cpu_marginal_us_per_call"]),
                at_once,
            )
        con.print(table)
    if "profile" in res:
        table = Table(
            title="Where the added time goes (10 side-effecting 0 ms calls; inclusive, "
            "nested entries overlap)"
        )
        for col in ("backend", "what", "ms/invoke", "calls/invoke", "us/call"):
            table.add_column(col)
        for backend, entry in res["profile"]["backends"].items():
            se = entry.get("side_effecting") or {}
            table.add_row(
                backend,
                f"[b]ToolNode {se.get('base_ms')} ms -> EffectToolNode {se.get('effect_ms')} ms; "
                f"{se.get('db_transactions_per_call')} ledger txn/call[/b]",
                "",
                "",
                "",
            )
            for part in se.get("breakdown", [])[:8]:
                table.add_row(
                    "",
                    part["what"],
                    str(part["ms_per_invoke"]),
                    str(part["calls_per_invoke"]),
                    str(part["us_per_call"]),
                )
        con.print(table)
    if "latency" in res:
        table = Table(title="Cancel latency: request_cancel in another process -> worker (ms)")
        for col in ("backend", "measure", "p50", "p99", "max", "n"):
            table.add_column(col)
        for backend, entry in res["latency"]["backends"].items():
            rows = [("check: requested_at -> seen", entry["check"]["seen_ms"])]
            if "graph" in entry:
                rows += [
                    ("graph: -> observed (report)", entry["graph"]["observed_ms"]),
                    ("graph: -> quiesced (report)", entry["graph"]["quiesced_ms"]),
                    ("graph: -> stream returned", entry["graph"]["ended_ms"]),
                ]
            for name, summary in rows:
                table.add_row(
                    backend,
                    name,
                    str(summary.get("median")),
                    str(summary.get("p99")),
                    str(summary.get("max")),
                    str(summary.get("n")),
                )
        con.print(table)
    if "scale" in res:
        table = Table(
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
            table.add_column(col)
        for backend, unsettled in res["scale"]["unsettled"].items():
            for summary in unsettled["steps"]:
                table.add_row(
                    backend,
                    f"{summary['settled_rows']:,}",
                    str(summary["load_s"]),
                    str(summary["light_us"]["median"]),
                    str(summary["light_us"]["p99"]),
                    str(summary["heavy_us"]["median"]),
                    str(summary["heavy_us"]["p99"]),
                    str((summary.get("write_pair_us") or {}).get("median")),
                )
        con.print(table)
        table = Table(title="Ledger write throughput (plan -> dispatched -> committed per effect)")
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
            table.add_column(col)
        for row in res["scale"]["throughput"]:
            table.add_row(
                row["backend"],
                str(row["threads"]),
                str(row["pool_max_size"]),
                str(row["transitions_per_s"]),
                str(row["effects_per_s"]),
                str(row["write_latency_ms"].get("median")),
                str(row["write_latency_ms"].get("p99")),
                str(row["client_cpu_util"]),
                str(row["error_count"]),
            )
        con.print(table)
        table = Table(title="Memory held per open run (tracemalloc, Python heap)")
        for col in ("backend", "open runs", "bytes/run", "left after drop", "top allocator"):
            table.add_column(col)
        for row in res["scale"]["memory"]:
            top = row["top_allocators"][0] if row["top_allocators"] else {}
            table.add_row(
                row["backend"],
                str(row["open_runs"]),
                str(row["bytes_per_open_run"]),
                str(row["bytes_left_per_run_after_drop"]),
                f"{top.get('file')} {top.get('bytes_per_run')} B",
            )
        con.print(table)
    if "recovery" in res:
        table = Table(title="Recovery: process start -> resumed, reconciled thread (ms, median)")
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
            table.add_column(col)
        for backend, entry in res["recovery"]["backends"].items():
            if "skipped" in entry:
                table.add_row(backend, "-", entry["skipped"], "", "", "", "", "", "", "")
                continue
            for variant in ("ours", "plain"):
                if variant not in entry:
                    continue
                figures = entry[variant]
                table.add_row(
                    backend,
                    variant,
                    str(figures["to_resumed_ms"]["median"]),
                    str(figures["interpreter_start_ms"]["median"]),
                    str(figures["imports_ms"]["median"]),
                    str(figures["open_and_build_ms"]["median"]),
                    str(figures["invoke_none_ms"]["median"]),
                    str(figures["charges_at_provider"]),
                    str(figures.get("effect_statuses")),
                    str(figures.get("run_status")),
                )
        con.print(table)
    from benchmarks.cli_startup import print_table as cli_table

    cli_table(con, res)
    if "throughput" in res:
        from benchmarks.throughput import table as throughput_table

        con.print("[b]Throughput (PostgreSQL, fsync on)[/b]")
        con.print(throughput_table(res["throughput"]))
    table = Table(title="Targets")
    for col in ("target", "measured", "status", "detail"):
        table.add_column(col)
    for row in res["targets"]:
        color = {"PASS": "green", "MISS": "red", INFO: "cyan"}.get(row["status"], "yellow")
        table.add_row(
            row["target"], row["measured"], f"[{color}]{row['status']}[/{color}]", row["detail"]
        )
    con.print(table)
    if res.get("notes"):
        con.print("[b]Notes[/b]")
        for note in res["notes"]:
            con.print(f" - {note}")

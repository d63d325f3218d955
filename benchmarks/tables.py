"""The benchmark's results printed as rich tables, the targets marked PASS or MISS."""

from __future__ import annotations

from typing import Any

from benchmarks.targets import INFO, paired_text


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
                paired_text(c),
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
                    paired_text(c),
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

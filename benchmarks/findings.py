"""Plain-language findings drawn from the benchmark's measurements."""

from __future__ import annotations

from typing import Any


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
    for backend, entry in prof.items():
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
                f"{backend}, 10 side-effecting 0 ms calls: EffectToolNode graph "
                f"{se['effect_ms']} ms vs "
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
                f"{backend} ledger writes outside a graph, per call: side-effecting, one at a time "
                f"(plan + dispatched + committed) {prim.get('side_effecting_call_total_us')} us, "
                f"batched as EffectToolNode writes them (a tenth of plan_many + one "
                f"transition_many: outcome with the next intent) "
                f"{prim.get('side_effecting_call_batched_us')} us; read-only, one at a time "
                f"(find_effect + plan) {prim.get('read_only_call_total_us')} us, batched (a "
                f"tenth of record_many) {prim.get('read_only_call_batched_us')} us; get_run "
                f"(cancel poll) {prim.get('get_run (cancel poll)')} us."
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
    for cell in res.get("overhead", {}).get("cells", []):
        if cell["kind"] == "side_effecting" and cell["tool_ms"] == 5 and cell["n_calls"] == 10:
            notes.append(
                f"{cell['backend']}, 10 x 5 ms side-effecting: {cell['added_pct']:+.1f}% wall. "
                "EffectToolNode dispatches side effects one at a time in plan order by default "
                "(effect_concurrency=1) while ToolNode runs the batch in its thread pool; with "
                "effect_concurrency=10 the same batch is "
                f"{cell.get('effect_concurrent_added_pct')}% "
                "over ToolNode."
            )
    lat = res.get("latency", {}).get("backends", {})
    for backend, measured in lat.items():
        late = (measured.get("graph") or {}).get("late_dispatches") or []
        if late:
            before_obs = sum(1 for d in late if d["dispatched_before_observed"])
            in_window = sum(
                1 for d in late if d["dispatched_after_requested_at_ms"] <= d["request_call_ms"]
            )
            worst = max(d["dispatched_after_requested_at_ms"] for d in late)
            head = (
                f"{backend}: the report counted dispatched_after_cancel > 0 for {len(late)} "
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
        if "graph" in measured:
            graph = measured["graph"]
            notes.append(
                f"{backend} graph cancel (5 ms tool per step): requested->observed p50/p99 "
                f"{graph['observed_ms'].get('median')}/{graph['observed_ms'].get('p99')} ms, "
                "->quiesced "
                f"{graph['quiesced_ms'].get('median')}/{graph['quiesced_ms'].get('p99')} ms, "
                "->stream "
                f"returned {graph['ended_ms'].get('median')}/{graph['ended_ms'].get('p99')} ms; "
                f"dispatched_after_cancel max {graph.get('dispatched_after_cancel_max')}."
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
    for backend, measured in rec.items():
        if "ours" in measured:
            ours = measured["ours"]
            notes.append(
                f"{backend} recovery: process start -> reconciled, completed thread "
                f"{ours['to_resumed_ms']['median']} ms median (interpreter "
                f"{ours['interpreter_start_ms']['median']}, imports {ours['imports_ms']['median']} "
                f"[langgraph_cancel {ours['import_langgraph_cancel_ms']['median']}], open+build "
                f"{ours['open_and_build_ms']['median']}, "
                f"invoke(None) {ours['invoke_none_ms']['median']} "
                f"ms); provider charges {ours['charges_at_provider']} vs plain LangGraph "
                f"{measured.get('plain', {}).get('charges_at_provider', '(not run)')} "
                "(the plain resume re-runs the tool)."
            )
    return notes

"""Smoke test of the benchmark harness: it runs end to end and writes every section.

No timing assertions: the benchmarks measure, they never pass or fail on a number.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_benchmarks_quick_run_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    backends = "memory,sqlite"
    if os.environ.get("LANGGRAPH_CANCEL_TEST_PG_DSN"):
        backends += ",postgres"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--backends",
            backends,
            "--batches",
            "1,3",
            "--reps",
            "1",
            "--scale-max",
            "1000",
            "--latency-trials",
            "2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())

    run = data["meta"]["backends_run"]
    for when in ("start", "end"):
        speed = data["meta"][f"machine_speed_{when}"]
        assert set(speed) == {"python_us", "sqlite_us", "thread_hop_us"}
        assert all(v > 0 for v in speed.values())
    assert {"memory", "sqlite"} <= set(run)
    for section in SECTIONS:
        assert section in data, f"missing section {section}"
    if "postgres" in run:
        assert [row["workers"] for row in data["throughput"]["rows"]] == [1, 2, 4]
        # A quick run measures the target's shape alone: three calls a turn, no latency.
        assert {(cell["calls"], cell["tool_ms"]) for cell in data["throughput"]["cells"]} == {
            (3, 0.0)
        }
        assert data["throughput"]["rows_with_one_call"] == []
        assert all(c["runs_per_s"] > 0 for c in data["throughput"]["cells"])
        # The invariants' lower bound runs beside plain and ours, one call at a time:
        # each call's commit and the run's last one are the commits it adds.
        assert {c["variant"] for c in data["throughput"]["cells"]} == {"plain", "bound", "effect"}
        for row in data["throughput"]["rows"]:
            assert row["bound_runs_per_s"] > 0
            assert row["bound_slower_pct"] is not None and row["slower_than_bound_pct"] is not None
        bound_cells = [c for c in data["throughput"]["cells"] if c["variant"] == "bound"]
        assert all(c["ledger_rows_per_run_by_table"] == {"bound_effects": 3.0} for c in bound_cells)
        for cell in data["throughput"]["cells"]:
            # Figures of the server's statements where it counts them, else none.
            spent = cell["statements"]
            assert spent is None or spent["ms_per_run"]["checkpoints"] > 0
            assert (spent is None) == (cell["ledger_statement_ms_per_run"] is None)
            if spent is not None and cell["variant"] == "effect":
                assert spent["ms_per_run"]["ledger"] > 0 and spent["costliest_ledger"]
            # The workers' sessions, sampled while they ran: ours hold several each.
            assert cell["max_connections"] >= cell["mean_connections"] >= 0
            if cell["variant"] == "effect":
                assert cell["max_connections"] >= cell["workers"]
        steps = data["throughput"]["step_costs"]
        assert steps["ledger_operation"]["client_cpu_us"] > 0
        assert steps["single_row_commit"]["wall_us"] > 0
    else:
        assert data["throughput"] == {"skipped": "needs PostgreSQL"}
    assert data["targets"], "no target rows"
    assert all(t["status"] in ("PASS", "MISS", "n/a", "info") for t in data["targets"])
    # A row that is no target says why in its detail.
    assert all(t["detail"] for t in data["targets"] if t["status"] == "info")
    assert isinstance(data["notes"], list)

    cells = data["overhead"]["cells"]
    assert {(c["backend"], c["kind"], c["n_calls"]) for c in cells} >= {
        (b, k, n) for b in run for k in ("read_only", "side_effecting") for n in (1, 3)
    }
    for cell in cells:
        assert cell["base_ms"]["n"] == 1 and cell["effect_ms"]["n"] == 1
        low, high = cell["paired_added_pct_ci95"]
        assert low <= cell["paired_added_pct"] <= high
    # Side effects are also fitted with the whole batch at once (effect_concurrency=N).
    fits = data["overhead"]["fits"]
    for backend in run:
        for tool_ms in (0, 5):
            (fit,) = [
                f
                for f in fits
                if (f["backend"], f["kind"], f["tool_ms"]) == (backend, "side_effecting", tool_ms)
            ]
            assert isinstance(fit["concurrent_marginal_us_per_call"], float)
    # PostgreSQL runs twice: the server's synchronous_commit, and off (the library alone).
    overhead_backends = [*run, "postgres_nosync"] if "postgres" in run else run
    floors = data["floor"]["backends"]
    assert set(floors) == {b for b in overhead_backends if b != "memory"}
    assert all(f["commit_ms"]["median"] > 0 for f in floors.values())
    if "postgres" in run:
        for backend in ("postgres", "postgres_nosync"):
            assert any(
                t["target"].startswith(f"{backend}: a run's fixed cost") for t in data["targets"]
            )
            assert any(t["target"].startswith(f"{backend}: <=1.3 x floor") for t in data["targets"])
    assert any(t["target"].startswith("memory: <=0.15 ms") for t in data["targets"])
    # The 10 x 5 ms cells again through ainvoke, on every backend run.
    acells = data["overhead"]["async_cells"]
    assert {(c["backend"], c["kind"]) for c in acells} == {
        (b, k) for b in overhead_backends for k in ("read_only", "side_effecting")
    }
    assert all(c["n_calls"] == 10 and c["effect_ms"]["n"] == 1 for c in acells)
    assert all(
        "paired_effect_concurrent_added_pct" in c for c in acells if c["kind"] == "side_effecting"
    )
    # The same agent through a real langgraph dev server, and a stop through it.
    served = data["server"]
    assert [c["n_calls"] for c in served["cells"]] == [1, 10]
    assert all(c["plain_ms"]["n"] == c["ours_ms"]["n"] > 0 for c in served["cells"])
    (stop,) = served["stop"]
    assert stop["report_in_state_ms"] is not None, stop
    assert stop["report_status_first_seen"] in ("cancelling", "cancelled")
    assert stop["final_report_ms"] is not None
    assert set(data["profile"]["backends"]) == set(run)
    assert set(data["latency"]["backends"]) == set(run)
    for backend in run:
        assert data["latency"]["backends"][backend]["check"]["seen_ms"]["n"] == 2
    assert set(data["scale"]["unsettled"]) == set(run)
    for unsettled in data["scale"]["unsettled"].values():
        assert (
            all(s["write_pair_us"]["n"] for s in unsettled["steps"]) and "growth_write" in unsettled
        )
    assert data["scale"]["memory"] and data["scale"]["throughput"]
    assert "same_process_signal" in data["scale"]["hygiene"]
    rec = data["recovery"]["backends"]
    assert "skipped" in rec["memory"]
    # The point of recovery: the resumed thread reconciled instead of charging twice.
    assert rec["sqlite"]["ours"]["charges_at_provider"] == [1]
    assert rec["sqlite"]["ours"]["effect_statuses"] == ["committed"]
    assert "Targets" in proc.stdout  # the rich tables went to stdout


def test_paired_ratio_is_the_median_pair_with_its_interval() -> None:
    from benchmarks.common import paired_ratio

    base = [10.0, 20.0, 10.0, 40.0, 10.0]
    # A slow phase of the machine (trials 2 and 4) moves both variants of a pair.
    other = [11.0, 22.0, 11.0, 44.0, 12.0]
    est = paired_ratio(base, other)
    assert est is not None
    mid, low, high = est
    assert mid == pytest.approx(1.1)
    assert low == pytest.approx(1.1) and high == pytest.approx(1.2)
    assert paired_ratio([], []) is None
    assert paired_ratio(base, other) == est  # the same samples, the same interval


def test_the_servers_statement_time_is_told_apart_by_family() -> None:
    from benchmarks.throughput import statement_family, statement_summary
    from langgraph_cancel.ledger import sql as ledger_sql

    def as_counted(text: str) -> str:
        # pg_stat_statements shows $1, $2, ... where the ledger wrote %(name)s.
        numbers = iter(range(1, 1000))
        return re.sub(r"%\(\w+\)s", lambda _: f"${next(numbers)}", text)

    transition = ledger_sql.PG_TRANSITION_EFFECT.format(statuses="$1, $2", guard="")
    finish = ledger_sql.FINISH_RUN.format(allowed="'running'")
    finish_releasing = ledger_sql.PG_FINISH_RUN_RELEASING.format(finish=finish)
    rows: list[dict[str, Any]] = [
        {"query": as_counted(transition), "calls": 20, "ms": 4.0},
        {"query": as_counted(ledger_sql.PG_TRANSITION_EFFECTS), "calls": 10, "ms": 2.0},
        {"query": "INSERT INTO lgc_runs (run_id) VALUES ($1)", "calls": 10, "ms": 1.0},
        {"query": as_counted(finish_releasing), "calls": 10, "ms": 0.5},
        {"query": "INSERT INTO checkpoint_writes (thread_id) VALUES ($1)", "calls": 70, "ms": 3.5},
        {"query": "SELECT count(*) FROM pg_stat_activity", "calls": 4, "ms": 0.2},
    ]
    assert [statement_family(row["query"]) for row in rows] == [
        "ledger",
        "ledger",
        "ledger",
        "ledger",
        "checkpoints",
        "other",
    ]
    summary = statement_summary(rows, runs=10)
    assert summary["ms_per_run"] == {"ledger": 0.75, "checkpoints": 0.35, "other": 0.02}
    assert summary["statements_per_run"] == {"ledger": 5.0, "checkpoints": 7.0, "other": 0.4}
    # The ledger's statements by the name of the constant they were made from (a
    # template whose placeholder comes early by its text before it); one that matches
    # none by its own beginning.
    assert summary["costliest_ledger"] == [
        {"statement": "PG_TRANSITION_EFFECT", "per_run": 2.0, "us_per_call": 200.0},
        {"statement": "PG_TRANSITION_EFFECTS", "per_run": 1.0, "us_per_call": 200.0},
        {
            "statement": "insert into lgc_runs (run_id) values (?)",
            "per_run": 1.0,
            "us_per_call": 100.0,
        },
        {"statement": "PG_FINISH_RUN_RELEASING", "per_run": 1.0, "us_per_call": 50.0},
    ]


def test_a_gap_between_variants_is_the_median_of_each_rounds_own_gap() -> None:
    from benchmarks.throughput import round_gaps

    def cell(variant: str, round_no: int, runs_per_s: float) -> dict[str, Any]:
        return {
            "variant": variant,
            "workers": 1,
            "tool_ms": 0.0,
            "calls": 3,
            "round": round_no,
            "runs_per_s": runs_per_s,
        }

    # The machine slows down in the second round: both variants move together there.
    cells = [
        cell("plain", 0, 100.0),
        cell("effect", 0, 80.0),
        cell("plain", 1, 50.0),
        cell("effect", 1, 45.0),
        cell("plain", 2, 100.0),
        cell("effect", 2, 70.0),
        # Another worker count, and a round without plain: neither counts.
        {**cell("effect", 0, 1.0), "workers": 2},
        cell("effect", 3, 10.0),
    ]
    assert round_gaps(cells, (1, 0.0, 3), "effect", "plain") == [20.0, 10.0, 30.0]
    assert round_gaps(cells, (1, 0.0, 3), "bound", "plain") == []


def test_the_bound_variants_statements_count_as_the_ledgers() -> None:
    from benchmarks import bound
    from benchmarks.throughput import statement_family

    for statement in (bound.INSERT_INTENT, bound.RECORD_OUTCOME):
        assert statement_family(statement) == "ledger"


def test_the_profiles_timers_reach_every_phase_of_a_side_effecting_run() -> None:
    from benchmarks.agent import SIDE_EFFECT, build_graph, make_tool, run_once, scripted_model
    from benchmarks.profile import Recorder, instrument, targets
    from langgraph_cancel.checkpointers.memory import MemoryCancelSaver

    originals = {(owner, attr): owner.__dict__[attr] for owner, attr, _label in targets()}
    saver = MemoryCancelSaver()
    saver.setup()
    rec = Recorder()
    with instrument(rec):
        graph = build_graph([make_tool(SIDE_EFFECT, 0)], scripted_model(3), saver, effectful=True)
        run_once(graph, 3 + 3)
    assert {
        "invocation start (run row, lease, heartbeat thread)",
        "invocation end (close run, get_state, release lease)",
        "EffectToolNode (whole node, sync entry)",
        "EffectToolNode: plan the batch, first intents",
        "EffectToolNode: side effects (supervised worker)",
        "tool execution (the handler, in the worker thread)",
        "ledger.start_run_and_unsettled",
        "ledger.plan_many_and_begin",
        "ledger.transition_many",
        "ledger.finish_run",
    } <= set(rec.calls)
    assert rec.calls["tool execution (the handler, in the worker thread)"] == 3
    # The timers are gone again.
    assert all(owner.__dict__[attr] is fn for (owner, attr), fn in originals.items())

"""A real server: the same agent served by ``langgraph dev``, driven by ``langgraph_sdk``.

Two graphs from ``benchmarks/served.py`` in one server: plain ``ToolNode`` and
``EffectToolNode`` + ``add_cancellation`` (its ledger in ``$LANGGRAPH_CANCEL_DB``:
a database on the benchmark's PostgreSQL, else a SQLite file). Each trial is a
``runs.wait`` on a new thread, plain and ours interleaved, with 1 and 10
side-effecting calls of 5 ms: the added latency per run (N = 1) and per
side-effecting call (the slope from N = 1 to N = 10), as a client of the server
sees it. Then the stop: a run of slow calls is stopped with ``runs.cancel(...,
wait=True)``, and the thread state is read until it holds the cancellation
report, timed from the ``runs.cancel`` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import Settings, fresh_pg_db, log, median, rnd, summary
from langgraph_cancel import EffectStatus, Ledger
from langgraph_cancel.errors import UnknownThreadError

ROOT = Path(__file__).resolve().parent.parent
SERVED = ROOT / "benchmarks" / "served.py"
CALLS = (1, 10)
TOOL_MS = 5.0
#: The stopped run: calls this long, one at a time, stopped during the first.
STOP_CALLS, STOP_MS = 4, 400.0


def _server_util() -> Any:
    """``tests/server_util.py``: how the suite starts and stops ``langgraph dev``."""
    tests_dir = str(ROOT / "tests")
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    return importlib.import_module("server_util")


@contextlib.contextmanager
def _ledger_url(settings: Settings, backends: list[str]) -> Iterator[str]:
    if "postgres" in backends and settings.pg_dsn:
        with fresh_pg_db(settings.pg_dsn, "server") as url:
            yield url
        return
    yield "sqlite:///" + str(Path(settings.workdir) / "server-ledger.db")


def _config(workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "langgraph.json"
    path.write_text(
        json.dumps(
            {
                "dependencies": [str(ROOT)],
                "graphs": {"plain": f"{SERVED}:plain_graph", "ours": f"{SERVED}:effect_graph"},
                "env": {},
            }
        )
    )
    return path


def _ask(calls: int, ms: float) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"calls={calls} ms={ms:g}"}]}


async def _timed_run(client: Any, graph: str, calls: int) -> float:
    thread = (await client.threads.create())["thread_id"]
    t0 = time.perf_counter()
    out = await client.runs.wait(thread, graph, input=_ask(calls, TOOL_MS))
    took = time.perf_counter() - t0
    if len(out["messages"]) != calls + 3:
        raise RuntimeError(f"{graph}: {len(out['messages'])} messages for {calls} calls")
    return took


async def _report_state(client: Any, thread: str) -> dict[str, Any] | None:
    values = (await client.threads.get_state(thread))["values"]
    report = values.get("cancellation_report") if isinstance(values, dict) else None
    return report if isinstance(report, dict) else None


def _in_flight(ledger: Ledger, thread: str) -> bool:
    with contextlib.suppress(UnknownThreadError):
        return any(e.status is EffectStatus.DISPATCHED for e in ledger.effects(thread))
    return False


async def _stop_once(client: Any, ledger: Ledger) -> dict[str, Any]:
    """One stopped run: from ``runs.cancel`` to the report in the thread state."""
    thread = (await client.threads.create())["thread_id"]
    run = await client.runs.create(thread, "ours", input=_ask(STOP_CALLS, STOP_MS))
    deadline = time.perf_counter() + 30
    while not await asyncio.to_thread(_in_flight, ledger, thread):
        if time.perf_counter() > deadline:
            raise RuntimeError("the stopped run's first call never went out")
        await asyncio.sleep(0.01)
    await asyncio.sleep(STOP_MS / 4000.0)  # a quarter into the call
    t0 = time.perf_counter()
    await client.runs.cancel(thread, run["run_id"], action="interrupt", wait=True)
    returned = time.perf_counter() - t0
    first: float | None = None
    first_status = None
    final: float | None = None
    deadline = t0 + 30
    while time.perf_counter() < deadline:
        report = await _report_state(client, thread)
        now = time.perf_counter() - t0
        if report is not None and first is None:
            first, first_status = now, report["status"]
        if report is not None and report["status"] == "cancelled":
            final = now
            break
        await asyncio.sleep(0.01)
    return {
        "cancel_returned_ms": rnd(returned * 1e3, 1),
        "report_in_state_ms": rnd(None if first is None else first * 1e3, 1),
        "report_status_first_seen": first_status,
        "final_report_ms": rnd(None if final is None else final * 1e3, 1),
    }


async def _measure(url: str, ledger: Ledger, reps: int, stops: int) -> dict[str, Any]:
    from langgraph_sdk import get_client

    client = get_client(url=url)
    for graph in ("plain", "ours"):  # warm: graph import, first thread, connections
        await _timed_run(client, graph, 1)
    samples: dict[tuple[str, int], list[float]] = {}
    for rep in range(reps):
        for calls in CALLS:
            order = ("plain", "ours") if rep % 2 == 0 else ("ours", "plain")
            for graph in order:
                took = await _timed_run(client, graph, calls)
                samples.setdefault((graph, calls), []).append(took)
    stopped = [await _stop_once(client, ledger) for _ in range(stops)]
    cells = []
    added: dict[int, float] = {}
    for calls in CALLS:
        plain = median(samples[("plain", calls)])
        ours = median(samples[("ours", calls)])
        assert plain is not None and ours is not None
        added[calls] = ours - plain
        cells.append(
            {
                "n_calls": calls,
                "plain_ms": summary(samples[("plain", calls)], scale=1e3),
                "ours_ms": summary(samples[("ours", calls)], scale=1e3),
                "added_ms": rnd((ours - plain) * 1e3),
            }
        )
    low, high = CALLS
    per_call = (added[high] - added[low]) / (high - low)
    return {
        "cells": cells,
        "added_ms_per_run": rnd(added[low] * 1e3),
        "added_ms_per_side_effecting_call": rnd(per_call * 1e3),
        "stop": stopped,
        "stop_summary": {
            key: summary([s[key] for s in stopped if s[key] is not None])
            for key in ("cancel_returned_ms", "report_in_state_ms", "final_report_ms")
        },
    }


def run(settings: Settings, backends: list[str]) -> dict[str, Any]:
    """The section's JSON."""
    reps, stops = (2, 1) if settings.quick else (12, 5)
    util = _server_util()
    workdir = Path(settings.workdir) / "server"
    with _ledger_url(settings, backends) as ledger_url:
        env = {"LANGGRAPH_CANCEL_DB": ledger_url}
        with util.langgraph_dev(_config(workdir), workdir=workdir, env=env) as server:
            log(
                f"  langgraph dev up in {server.started_in:.1f}s; ledger {ledger_url.split(':')[0]}"
            )
            ledger = Ledger.from_url(ledger_url)
            try:
                out = asyncio.run(_measure(server.url, ledger, reps, stops))
            finally:
                ledger.close()
    log(
        f"  server: +{out['added_ms_per_run']} ms per run, "
        f"+{out['added_ms_per_side_effecting_call']} ms per side-effecting call; "
        f"runs.cancel -> report in state {out['stop_summary']['report_in_state_ms']}"
    )
    return {
        "method": (
            "langgraph dev serving the same agent twice (plain ToolNode; EffectToolNode + "
            "add_cancellation, ledger in LANGGRAPH_CANCEL_DB), driven by langgraph_sdk: "
            f"runs.wait on a new thread per trial, plain and ours interleaved, {reps} trials "
            f"per cell, N = {CALLS} side-effecting calls of {TOOL_MS:g} ms (one at a time, "
            "the default). added_ms_per_run: the N=1 difference of medians; per call: the "
            f"slope from N={CALLS[0]} to N={CALLS[1]}. stop: a run of {STOP_CALLS} calls of "
            f"{STOP_MS:g} ms stopped with runs.cancel(wait=True) during the first; times from "
            "the runs.cancel call to its return, to a cancellation_report in the thread "
            "state (status cancelling or cancelled), and to the final (cancelled) one."
        ),
        "ledger": ledger_url.split(":")[0],
        "reps": reps,
        **out,
    }

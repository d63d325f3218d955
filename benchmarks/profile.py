"""Where the added time goes: wall-time attribution, ledger primitives and cProfile.

Nothing here changes the library: functions are wrapped with timers for the
duration of the measurement (inclusive times, so nested entries overlap) and
restored afterwards.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import cProfile
import functools
import gc
import inspect
import itertools
import pstats
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.agent import (
    READ_ONLY,
    SIDE_EFFECT,
    build_graph,
    make_tool,
    run_once,
    savers,
    scripted_model,
)
from benchmarks.common import Settings, log, median, rnd, time_median, write_pair

Patch = tuple[Any, str, str]
_ROOT = str(Path(__file__).resolve().parent.parent) + "/"


class Recorder:
    """Accumulates inclusive wall time and call counts per label."""

    def __init__(self) -> None:
        self.total: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()

    def clear(self) -> None:
        self.total.clear()
        self.calls.clear()

    def add(self, label: str, dt: float) -> None:
        self.total[label] += dt
        self.calls[label] += 1


def _wrap(fn: Any, label: str, rec: Recorder) -> Any:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                rec.add(label, time.perf_counter() - t0)

        return awrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            rec.add(label, time.perf_counter() - t0)

    return wrapper


class _CountingCursor:
    """Proxy of a ledger cursor that counts the SQL statements sent through it."""

    def __init__(self, cur: Any, rec: Recorder) -> None:
        self._cur = cur
        self._rec = rec

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._cur.execute(*args, **kwargs)
        finally:
            self._rec.add("ledger SQL statements", time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


def _wrap_cm(fn: Any, label: str, rec: Recorder) -> Any:
    """Wrap a context-manager factory (a DB transaction): time from enter to exit."""

    @functools.wraps(fn)
    @contextlib.contextmanager
    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        t0 = time.perf_counter()
        try:
            with fn(*args, **kwargs) as value:
                yield _CountingCursor(value, rec)
        finally:
            rec.add(label, time.perf_counter() - t0)

    return wrapper


#: The ledger operations a run's path takes, timed each under ``ledger.<name>``.
LEDGER_OPERATIONS = (
    "start_run_and_unsettled",
    "start_run",
    "get_run",
    "latest_run",
    "acquire_lease",
    "release_lease",
    "heartbeat",
    "plan",
    "plan_many",
    "plan_many_and_begin",
    "record_many",
    "transition",
    "transition_many",
    "find_effect",
    "find_effects",
    "get_effect",
    "unsettled",
    "finish_run",
    "mark_observed",
    "run_effects",
    "request_cancel",
    "effects",
)


def targets() -> list[Patch]:
    """What ``instrument`` times: (owner, attribute, label), each defined on its owner.

    Raises:
        LookupError: A target is gone (the library changed shape): the breakdown would
            silently lose it, so the benchmark stops instead.
    """
    import langgraph_cancel.execution.drivers as drivers
    import langgraph_cancel.lifecycle as lifecycle
    import langgraph_cancel.nodes.entry as entry
    import langgraph_cancel.nodes.tool_node as tn
    from langgraph_cancel.ledger.core import Ledger

    patches: list[Patch] = [
        (lifecycle.Invocation, "__init__", "invocation start (run row, lease, heartbeat thread)"),
        (lifecycle.Invocation, "end", "invocation end (close run, get_state, release lease)"),
        (entry, "reconcile_thread", "reconcile node: reconcile_thread"),
        (tn.EffectToolNode, "_func", "EffectToolNode (whole node, sync entry)"),
        (tn.EffectToolNode, "_sort", "EffectToolNode: classify and order the calls"),
        (tn.EffectToolNode, "_prepare", "EffectToolNode: plan the batch, first intents"),
        (tn.EffectToolNode, "_reads", "EffectToolNode: reads (a thread pool, as ToolNode's)"),
        (tn.EffectToolNode, "_effects", "EffectToolNode: side effects (supervised worker)"),
        (drivers, "_call", "tool execution (the handler, in the worker thread)"),
    ]
    for name in LEDGER_OPERATIONS:
        # The class among the ledger's aggregates that defines the method.
        defining = next((cls for cls in Ledger.__mro__ if name in cls.__dict__), Ledger)
        patches.append((defining, name, f"ledger.{name}"))
    for owner, attr, _label in patches:
        if attr not in getattr(owner, "__dict__", {}):
            where = getattr(owner, "__name__", owner)
            raise LookupError(f"{where}.{attr} is gone: nothing to time")
    return patches


@contextlib.contextmanager
def instrument(rec: Recorder) -> Iterator[None]:
    """Wrap the library's interesting functions with timers; undo on exit."""
    from langgraph_cancel.ledger import backends, postgres

    saved: list[tuple[Any, str, Any]] = []
    for owner, attr, label in targets():
        original = owner.__dict__[attr]
        saved.append((owner, attr, original))
        setattr(owner, attr, _wrap(original, label, rec))
    units = {
        "transaction": "ledger DB transactions",
        "statement": "ledger DB autocommit statements",
    }
    for cls in (backends.SqliteBackend, postgres.PostgresBackend):
        for attr, label in units.items():
            if cls is not None and attr in cls.__dict__:
                original = cls.__dict__[attr]
                saved.append((cls, attr, original))
                setattr(cls, attr, _wrap_cm(original, label, rec))
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


# --------------------------------------------------------------------------- micro costs
def _micro(reps: int) -> dict[str, Any]:
    tool_ = make_tool(READ_ONLY, 0)

    async def noop() -> None:
        return None

    def t_asyncio_run() -> None:
        asyncio.run(noop())

    async def ainvoke_10() -> None:
        for index in range(10):
            await tool_.ainvoke({"i": index})

    def t_sync_10() -> None:
        for index in range(10):
            tool_.invoke({"i": index})

    loop_cost = time_median(t_asyncio_run, reps)
    ainv = time_median(lambda: asyncio.run(ainvoke_10()), reps)
    sync = time_median(t_sync_10, reps)
    return {
        "asyncio_run_empty_us": rnd(loop_cost * 1e6, 1),
        "tool_invoke_sync_us_per_call": rnd(sync / 10 * 1e6, 1),
        "tool_ainvoke_sync_tool_us_per_call": rnd((ainv - loop_cost) / 10 * 1e6, 1),
        "note": (
            "What the sync entry avoids: EffectToolNode runs a sync graph's batch on a "
            "pooled private loop (not asyncio.run() per node execution) and calls a sync "
            "tool with tool.invoke (not tool.ainvoke, a thread hop and async callbacks per "
            "call); ToolNode's sync path calls tool.invoke in its executor."
        ),
    }


def _ledger_primitives(ledger: Any, reps: int) -> dict[str, Any]:
    """Median µs of the ledger writes one call costs, outside any graph."""
    thread = f"prim-{uuid.uuid4().hex[:8]}"
    run = ledger.start_run(thread)
    times: dict[str, list[float]] = collections.defaultdict(list)
    for index in range(reps):
        call = f"p{index}"
        t0 = time.perf_counter()
        rec, _ = ledger.plan(
            thread_id=thread,
            run_id=run.run_id,
            tool_call_id=call,
            tool="work",
            kind="irreversible",
            args={"i": index},
            seq=index,
            owner="bench",
            actor="bench",
        )
        t1 = time.perf_counter()
        ledger.transition(rec.effect_id, "dispatched", actor="bench", owner="bench")
        t2 = time.perf_counter()
        ledger.transition(
            rec.effect_id,
            "committed",
            expected=["dispatched"],
            actor="bench",
            result={"content": "ok", "status": "success"},
        )
        t3 = time.perf_counter()
        ledger.find_effect(thread, f"r{index}")
        t4 = time.perf_counter()
        ledger.plan(
            thread_id=thread,
            run_id=run.run_id,
            tool_call_id=f"r{index}",
            tool="work",
            kind="read_only",
            args={"i": index},
            seq=index,
            status="committed",
            result={"content": "ok", "status": "success"},
            owner="bench",
            actor="bench",
        )
        t5 = time.perf_counter()
        ledger.get_run(run.run_id)
        t6 = time.perf_counter()
        times["plan (intent row, planned)"].append(t1 - t0)
        times["transition -> dispatched (guarded CAS)"].append(t2 - t1)
        times["transition -> committed"].append(t3 - t2)
        times["find_effect (read-only replay check)"].append(t4 - t3)
        times["plan (read-only outcome, committed)"].append(t5 - t4)
        times["get_run (cancel poll)"].append(t6 - t5)
    _batched_primitives(ledger, reps, times)
    out = {k: rnd((median(v) or 0) * 1e6, 1) for k, v in times.items()}
    out["side_effecting_call_total_us"] = rnd(
        sum(
            median(times[k]) or 0
            for k in (
                "plan (intent row, planned)",
                "transition -> dispatched (guarded CAS)",
                "transition -> committed",
            )
        )
        * 1e6,
        1,
    )
    # What EffectToolNode writes per call: a tenth of the batch's plan_many (N=10), and
    # one transition_many carrying the previous outcome with this call's intent.
    out["side_effecting_call_batched_us"] = rnd(
        (
            (median(times["plan_many (10 intent rows), per row"]) or 0)
            + (median(times["transition_many (outcome + next intent)"]) or 0)
        )
        * 1e6,
        1,
    )
    out["read_only_call_batched_us"] = rnd(
        (median(times["record_many (10 read outcomes), per row"]) or 0) * 1e6, 1
    )
    out["read_only_call_total_us"] = rnd(
        sum(
            median(times[k]) or 0
            for k in ("find_effect (read-only replay check)", "plan (read-only outcome, committed)")
        )
        * 1e6,
        1,
    )
    return out


def _batched_primitives(ledger: Any, reps: int, times: dict[str, list[float]]) -> None:
    """The batch writes EffectToolNode makes, timed on their own (10 calls a batch)."""
    from langgraph_cancel.types import EffectKind, EffectStatus, NewEffect

    thread = f"prim-batch-{uuid.uuid4().hex[:8]}"
    run = ledger.start_run(thread)
    for batch in range(max(1, reps // 10)):
        calls = [f"b{batch}-{i}" for i in range(10)]
        t0 = time.perf_counter()
        entries = ledger.plan_many(
            thread_id=thread,
            run_id=run.run_id,
            items=[
                NewEffect(c, "work", EffectKind.IRREVERSIBLE, {"i": i}, seq=i)
                for i, c in enumerate(calls)
            ],
            owner="bench",
            actor="bench",
        )
        times["plan_many (10 intent rows), per row"].append((time.perf_counter() - t0) / 10)
        ids = [e[0].effect_id for e in entries if isinstance(e, tuple)]
        ledger.transition(ids[0], "dispatched", actor="bench", owner="bench")
        for prev, nxt in itertools.pairwise(ids):
            t1 = time.perf_counter()
            write_pair(ledger, prev, nxt)
            times["transition_many (outcome + next intent)"].append(time.perf_counter() - t1)
        t2 = time.perf_counter()
        ledger.record_many(
            thread_id=thread,
            run_id=run.run_id,
            items=[
                NewEffect(
                    f"{c}-r",
                    "work",
                    EffectKind.READ_ONLY,
                    {"i": i},
                    seq=i,
                    status=EffectStatus.COMMITTED,
                    result={"content": "ok", "status": "success"},
                )
                for i, c in enumerate(calls)
            ],
            owner="bench",
            actor="bench",
        )
        times["record_many (10 read outcomes), per row"].append((time.perf_counter() - t2) / 10)


def _top_cprofile(graph: Any, calls: int, expect: int, runs: int) -> list[dict[str, Any]]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(runs):
        run_once(graph, expect)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        name = filename.split("site-packages/")[-1].replace(_ROOT, "")
        rows.append((tt, ct, nc, f"{name}:{line}({func})"))
    rows.sort(reverse=True)
    return [
        {
            "function": name,
            "calls_per_invoke": rnd(nc / runs, 1),
            "tottime_ms_per_invoke": rnd(tt / runs * 1e3),
            "cumtime_ms_per_invoke": rnd(ct / runs * 1e3),
        }
        for tt, ct, nc, name in rows[:15]
    ]


def run(settings: Settings, backends_: list[str]) -> dict[str, Any]:
    """Attribution per backend for the side-effecting and read-only N=10, 0 ms cells."""
    reps = settings.reps or (2 if settings.quick else 8)
    calls = 10
    out: dict[str, Any] = {
        "method": (
            "EffectToolNode graph, N=10 calls of a 0 ms tool, invoked repeatedly with the "
            "library's functions wrapped by timers (inclusive wall time per invoke; nested "
            "entries overlap: ledger.* runs inside the EffectToolNode entry). Ledger "
            "primitives are timed directly on the same backend outside any graph."
        ),
        "micro": _micro(5 if settings.quick else 30),
        "backends": {},
    }
    for backend in backends_:
        log(f"profile: {backend}")
        entry: dict[str, Any] = {}
        with savers(backend, settings) as (base_saver, cancel_saver):
            entry["ledger_primitives_us"] = _ledger_primitives(cancel_saver.ledger, reps * 4)
            for kind in (SIDE_EFFECT, READ_ONLY):
                tools = [make_tool(kind, 0)]
                g_base = build_graph(tools, scripted_model(calls), base_saver, effectful=False)
                g_eff = build_graph(tools, scripted_model(calls), cancel_saver, effectful=True)
                g_node = build_graph(
                    tools, scripted_model(calls), cancel_saver, effectful=True, cancellation=False
                )
                expect = calls + 3
                for graph in (g_base, g_eff, g_node):
                    run_once(graph, expect)
                walls: dict[str, list[float]] = {"base": [], "effect": [], "node_only": []}
                for _ in range(reps):
                    for name, graph in (("base", g_base), ("effect", g_eff), ("node_only", g_node)):
                        gc.collect()
                        walls[name].append(run_once(graph, expect)[0])
                rec = Recorder()
                with instrument(rec):
                    # Built under the timers: a node binds its methods as it is made.
                    g_timed = build_graph(
                        tools, scripted_model(calls), cancel_saver, effectful=True
                    )
                    run_once(g_timed, expect)
                    rec.clear()
                    for _ in range(reps):
                        run_once(g_timed, expect)
                breakdown = sorted(
                    (
                        {
                            "what": label,
                            "ms_per_invoke": rnd(total / reps * 1e3),
                            "calls_per_invoke": rnd(rec.calls[label] / reps, 1),
                            "us_per_call": rnd(total / rec.calls[label] * 1e6, 1),
                        }
                        for label, total in rec.total.items()
                    ),
                    key=lambda d: -float(d["ms_per_invoke"] or 0),
                )
                base_ms = (median(walls["base"]) or 0) * 1e3
                eff_ms = (median(walls["effect"]) or 0) * 1e3
                node_ms = (median(walls["node_only"]) or 0) * 1e3
                entry[kind] = {
                    "n_calls": calls,
                    "base_ms": rnd(base_ms),
                    "effect_ms": rnd(eff_ms),
                    "effect_node_only_ms": rnd(node_ms),
                    "added_ms": rnd(eff_ms - base_ms),
                    "added_by_node_ms": rnd(node_ms - base_ms),
                    "added_by_add_cancellation_ms": rnd(eff_ms - node_ms),
                    "db_transactions_per_call": rnd(
                        (
                            rec.calls["ledger DB transactions"]
                            + rec.calls["ledger DB autocommit statements"]
                        )
                        / reps
                        / calls,
                        2,
                    ),
                    "db_transactions_per_invoke": rnd(
                        rec.calls["ledger DB transactions"] / reps, 1
                    ),
                    "db_autocommit_statements_per_invoke": rnd(
                        rec.calls["ledger DB autocommit statements"] / reps, 1
                    ),
                    "sql_statements_per_invoke": rnd(rec.calls["ledger SQL statements"] / reps, 1),
                    "breakdown": breakdown,
                    "cprofile_top_tottime": _top_cprofile(g_eff, calls, expect, max(2, reps // 3)),
                }
                log(
                    f"  {backend:8s} {kind:14s} base={base_ms:7.2f}ms effect={eff_ms:7.2f}ms "
                    f"node-only={node_ms:7.2f}ms txn/call="
                    f"{entry[kind]['db_transactions_per_call']}"
                )
        out["backends"][backend] = entry
    return out

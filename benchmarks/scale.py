"""Scale: ``Ledger.unsettled(thread)`` and a side effect's write pair against settled
history, concurrent write throughput, and memory held per open run."""

from __future__ import annotations

import contextlib
import gc
import json
import threading
import time
import tracemalloc
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Settings,
    ledger_url,
    log,
    plan_work,
    ratio,
    rnd,
    summary,
    write_pair,
)

SETTLED = ["committed"] * 7 + ["failed", "dropped", "compensated"]
UNSETTLED_PER_THREAD = 10
HEAVY_EVERY = 10  # every 10th bulk row belongs to the "heavy" thread
ROWS_PER_BULK_THREAD = 1000


MEMORY_SCALE_CAP = 100_000


def sizes_for(settings: Settings, backend: str | None = None) -> list[int]:
    """10^3, 10^5, 10^6 (capped by --scale-max; --quick: 10^3, 10^4).

    memory:// is the same SQLite engine in RAM: it stops at 10^5.
    """
    top = settings.scale_max
    if backend == "memory":
        top = min(top, MEMORY_SCALE_CAP)
    base = [1_000, 10_000] if settings.quick else [1_000, 100_000, 1_000_000]
    out = [s for s in base if s <= top]
    if top not in out and top > (out[-1] if out else 0):
        out.append(top)
    return out or [top]


# --------------------------------------------------------------------------- bulk load
_COLUMNS = (
    "effect_id",
    "thread_id",
    "run_id",
    "tool_call_id",
    "tool",
    "kind",
    "status",
    "idempotency_key",
    "args",
    "seq",
    "result",
    "error",
    "owner",
    "next_action",
    "approval",
    "version",
    "last_token",
    "created_at",
    "updated_at",
    "dispatched_at",
    "settled_at",
)


def _rows(start: int, stop: int, heavy: str, ts: str) -> Any:
    result = json.dumps({"content": "ok", "status": "success"})
    for index in range(start, stop):
        thread = heavy if index % HEAVY_EVERY == 0 else f"bulk-{index // ROWS_PER_BULK_THREAD}"
        status = SETTLED[index % len(SETTLED)]
        yield (
            f"{thread}:b{index}",
            thread,
            f"run-{thread}",
            f"b{index}",
            "work",
            "irreversible" if index % 3 else "read_only",
            status,
            f"bulk-key-{index}",
            json.dumps({"i": index}),
            index,
            result,
            None,
            "bench",
            None,
            None,
            3,
            None,
            ts,
            ts,
            ts,
            ts,
        )


def _load_sqlite(ledger: Any, start: int, stop: int, heavy: str) -> None:
    """executemany on the ledger's own connection; secondary indexes rebuilt afterwards."""
    backend = ledger.backend
    ts = datetime.now(UTC).isoformat(timespec="microseconds")
    sql = (
        f"INSERT INTO lgc_effects ({', '.join(_COLUMNS)}) VALUES "
        f"({', '.join('?' for _ in _COLUMNS)})"
    )
    chunk = 100_000
    with backend._lock:  # the ledger's own connection (the only one for memory://)
        conn = backend._conn
        indexes = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' "
            "AND tbl_name = 'lgc_effects' AND sql IS NOT NULL"
        ).fetchall()
        conn.execute("PRAGMA cache_size = -262144")  # 256 MiB while loading
        for name, _sql in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        for lo in range(start, stop, chunk):
            conn.execute("BEGIN")
            conn.executemany(sql, _rows(lo, min(stop, lo + chunk), heavy, ts))
            conn.execute("COMMIT")
        for _name, index_sql in indexes:
            conn.execute(index_sql)
        conn.execute("PRAGMA cache_size = -2000")


def _load_pg(url: str, start: int, stop: int, heavy: str) -> None:
    """COPY; secondary indexes dropped first and rebuilt from their own definitions."""
    import psycopg

    ts = datetime.now(UTC).isoformat(timespec="microseconds")
    with psycopg.connect(url, autocommit=False) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        rows = conn.execute(
            "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.tablename = 'lgc_effects' "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)"
        ).fetchall()
        for name, _def in rows:
            conn.execute(f'DROP INDEX "{name}"')
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY lgc_effects ({', '.join(_COLUMNS)}) FROM STDIN") as copy,
        ):
            for row in _rows(start, stop, heavy, ts):
                copy.write_row(row)
        for _name, indexdef in rows:
            conn.execute(indexdef)
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE lgc_effects")


def _explain(ledger: Any, thread: str) -> str:
    from langgraph_cancel.ledger import sql as ledger_sql

    backend = ledger.backend
    if backend.dialect == "sqlite":
        with backend._lock:
            rows = backend._conn.execute(
                "EXPLAIN QUERY PLAN " + backend.sql(ledger_sql.SELECT_UNSETTLED),
                {"thread_id": thread},
            ).fetchall()
        return " | ".join(str(tuple(r)[-1]) for r in rows)
    import psycopg

    with psycopg.connect(backend.conninfo) as conn:
        cur = psycopg.ClientCursor(conn)
        cur.execute("EXPLAIN " + ledger_sql.SELECT_UNSETTLED, {"thread_id": thread})
        return " | ".join(r[0].strip() for r in cur.fetchall())


def _seed_thread(ledger: Any, thread: str) -> None:
    run = ledger.start_run(thread)
    for index in range(UNSETTLED_PER_THREAD):
        ledger.plan(
            thread_id=thread,
            run_id=run.run_id,
            tool_call_id=f"u{index}",
            tool="work",
            kind="irreversible",
            args={"i": index},
            seq=index,
            owner="bench",
            actor="bench",
        )


def _seed_writer(ledger: Any, thread: str, count: int) -> list[str]:
    """``n`` planned side effects on a thread, the first dispatched: a write pair walks them."""
    from langgraph_cancel.ledger import derive_effect_id
    from langgraph_cancel.types import EffectStatus

    run = ledger.start_run(thread)
    plan_work(ledger, thread, run.run_id, count, "w")
    ids = [derive_effect_id(thread, f"w{i}") for i in range(count)]
    ledger.transition(ids[0], EffectStatus.DISPATCHED, owner="bench", actor="bench")
    return ids


def unsettled_scale(settings: Settings, backend: str) -> dict[str, Any]:
    """unsettled() of a thread with no history and of one holding 10% of all rows.

    One fresh database per size, measured in interleaved rounds (size A, B, C, A,
    B, C, ...) so that a change of load on the machine hits every size alike.
    """
    from langgraph_cancel.ledger import Ledger

    sizes = sizes_for(settings, backend)
    calls = 50 if settings.quick else 200
    light, heavy = "light-thread", "heavy-thread"
    steps: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        ledgers = []
        writers: list[list[str]] = []
        for size in sizes:
            url = stack.enter_context(ledger_url(backend, settings, f"scale{size}"))
            ledger = Ledger.from_url(url)
            stack.callback(ledger.close)
            _seed_thread(ledger, light)
            _seed_thread(ledger, heavy)
            writers.append(_seed_writer(ledger, "writer-thread", calls + 6))
            t0 = time.perf_counter()
            if backend == "postgres":
                _load_pg(url, 0, size, heavy)
            else:
                _load_sqlite(ledger, 0, size, heavy)
            load_s = time.perf_counter() - t0
            log(f"  {backend:8s} loaded {size:>9,d} settled rows in {load_s:6.1f}s")
            ledgers.append(ledger)
            steps.append(
                {
                    "settled_rows": size,
                    "heavy_thread_settled_rows": (size + HEAVY_EVERY - 1) // HEAVY_EVERY,
                    "load_s": rnd(load_s, 2),
                }
            )
        times: list[dict[str, list[float]]] = [
            {"light": [], "heavy": [], "write": []} for _ in sizes
        ]
        for position, ledger in enumerate(ledgers):
            for index in range(5):
                ledger.unsettled(light)
                ledger.unsettled(heavy)
                write_pair(ledger, writers[position][index], writers[position][index + 1])
        for index in range(5, 5 + calls):
            for position, ledger in enumerate(ledgers):
                for name, thread in (("light", light), ("heavy", heavy)):
                    t1 = time.perf_counter()
                    got = ledger.unsettled(thread)
                    times[position][name].append(time.perf_counter() - t1)
                    assert len(got) == UNSETTLED_PER_THREAD, len(got)
                t1 = time.perf_counter()
                write_pair(ledger, writers[position][index], writers[position][index + 1])
                times[position]["write"].append(time.perf_counter() - t1)
        for position, ledger in enumerate(ledgers):
            steps[position]["light_us"] = summary(times[position]["light"], scale=1e6, digits=1)
            steps[position]["heavy_us"] = summary(times[position]["heavy"], scale=1e6, digits=1)
            steps[position]["write_pair_us"] = summary(
                times[position]["write"], scale=1e6, digits=1
            )
            steps[position]["plan"] = _explain(ledger, heavy)
            log(
                f"  {backend:8s} rows={sizes[position]:>9,d} unsettled light="
                f"{steps[position]['light_us']['median']}us "
                f"heavy={steps[position]['heavy_us']['median']}us"
                f" write pair={steps[position]['write_pair_us']['median']}us"
            )
    first, last = steps[0], steps[-1]
    writes = [s["write_pair_us"]["median"] for s in steps]
    return {
        "steps": steps,
        "growth_light": rnd(ratio(last["light_us"]["median"], first["light_us"]["median"]), 2),
        "growth_heavy": rnd(ratio(last["heavy_us"]["median"], first["heavy_us"]["median"]), 2),
        # The slowest size against the fastest: a plan that scans the table is worst at
        # the sizes below the one where the planner turns to the index, not at the largest.
        "growth_write": rnd(ratio(max(writes), min(writes)), 2),
    }


# --------------------------------------------------------------------------- throughput
def throughput(
    settings: Settings, backend: str, *, threads: int, pool: int | None
) -> dict[str, Any]:
    """``threads`` OS threads, each on its own thread id: plan -> dispatched -> committed."""
    from langgraph_cancel.ledger import Ledger

    duration = 1.0 if settings.quick else 5.0
    with ledger_url(backend, settings, "tput") as url:
        if backend == "postgres" and pool is not None:
            from langgraph_cancel.ledger import PostgresBackend

            ledger = Ledger(PostgresBackend(url, min_size=min(pool, 4), max_size=pool))
            ledger.setup()
        else:
            ledger = Ledger.from_url(url)
        runs = [ledger.start_run(f"tp-{operations}") for operations in range(threads)]
        barrier = threading.Barrier(threads + 1)
        stop = threading.Event()
        counts = [0] * threads
        lat: list[list[float]] = [[] for _ in range(threads)]
        errors: list[str] = []

        def work(position: int) -> None:
            run = runs[position]
            barrier.wait()
            operations = 0
            try:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    rec, _ = ledger.plan(
                        thread_id=run.thread_id,
                        run_id=run.run_id,
                        tool_call_id=f"w{operations}",
                        tool="work",
                        kind="irreversible",
                        args={"i": operations},
                        seq=operations,
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
                    counts[position] += 3
                    if operations % 4 == 0:
                        lat[position].extend((t1 - t0, t2 - t1, t3 - t2))
                    operations += 1
            except Exception as exc:  # reported in the JSON
                errors.append(f"{type(exc).__name__}: {exc}")

        workers = [threading.Thread(target=work, args=(position,)) for position in range(threads)]
        for worker in workers:
            worker.start()
        barrier.wait()
        c0 = time.process_time()
        t0 = time.perf_counter()
        time.sleep(duration)
        stop.set()
        for worker in workers:
            worker.join()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        ledger.close()
    total = sum(counts)
    return {
        "backend": backend,
        "threads": threads,
        "pool_max_size": pool
        if pool is not None
        else ("default" if backend == "postgres" else None),
        "seconds": rnd(wall, 2),
        "writes": total,
        "transitions_per_s": rnd(total / wall, 1),
        "effects_per_s": rnd(total / 3 / wall, 1),
        "write_latency_ms": summary([x for xs in lat for x in xs], scale=1e3, digits=2),
        "client_cpu_util": rnd(cpu / wall, 2),
        "errors": errors[:5],
        "error_count": len(errors),
    }


# --------------------------------------------------------------------------- memory
def memory_per_run(settings: Settings, backend: str) -> dict[str, Any]:
    """tracemalloc around N open run scopes (what a live invocation holds in-process)."""
    from langgraph_cancel.ledger import Ledger
    from langgraph_cancel.runtime import drop_scope, scope_for

    runs = 100 if settings.quick else 1000
    with ledger_url(backend, settings, "mem") as url:
        ledger = Ledger.from_url(url)
        warm = scope_for({"configurable": {"thread_id": "warm"}}, ledger=ledger)
        drop_scope(warm)
        gc.collect()
        tracemalloc.start(10)
        before = tracemalloc.take_snapshot()
        b0 = tracemalloc.get_traced_memory()[0]
        scopes = [
            scope_for({"configurable": {"thread_id": f"mem-{uuid.uuid4().hex[:8]}"}}, ledger=ledger)
            for _ in range(runs)
        ]
        gc.collect()
        b1 = tracemalloc.get_traced_memory()[0]
        after = tracemalloc.take_snapshot()
        for scope in scopes:
            drop_scope(scope)
        del scopes
        gc.collect()
        b2 = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        top = after.compare_to(before, "filename")[:6]
        ledger.close()
    return {
        "backend": backend,
        "open_runs": runs,
        "bytes_per_open_run": round((b1 - b0) / runs),
        "bytes_left_per_run_after_drop": round((b2 - b0) / runs),
        "top_allocators": [
            {
                "file": str(st.traceback[0].filename)
                .split("site-packages/")[-1]
                .replace(str(Path(__file__).resolve().parent.parent) + "/", ""),
                "bytes_per_run": round(st.size_diff / runs),
            }
            for st in top
        ],
        "note": "Python heap only (tracemalloc); database rows and SQLite's C heap excluded.",
    }


# --------------------------------------------------------------------------- hygiene
def same_process_signal(trials: int = 50) -> dict[str, Any]:
    """Is a cancel requested through a ledger seen at once by a run in the same process?

    Each of ``n`` short-lived ledgers (memory://) starts a run, checks once (which sets
    the poll clock), requests a cancel through the same ledger object and checks again
    at once: without the in-process listener the second check waits for the next poll.
    """
    import gc as _gc

    from langgraph_cancel.ledger import Ledger
    from langgraph_cancel.runtime import drop_scope, scope_for

    missed = 0
    for trial in range(trials):
        ledger = Ledger.from_url("memory://")
        scope = scope_for({"configurable": {"thread_id": f"hyg-{trial}"}}, ledger=ledger)
        scope.cancel_called()
        ledger.request_cancel(f"hyg-{trial}", reason="hygiene", requested_by="bench")
        if not scope.cancel_called():
            missed += 1
        drop_scope(scope)
        ledger.close()
        del ledger, scope
        _gc.collect()
    return {
        "ledgers": trials,
        "cancel_not_seen_at_once": missed,
        "note": (
            "same-process request_cancel through the ledger the run uses; a miss falls back "
            "to the poll interval"
        ),
    }


def pg_listener_threads(settings: Settings, count: int = 3) -> dict[str, Any]:
    """LISTEN threads alive after opening, using and closing ``n`` PostgreSQL ledgers."""
    from langgraph_cancel.ledger import Ledger
    from langgraph_cancel.runtime import drop_scope, scope_for

    def listeners() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "langgraph-cancel-listen")

    before = listeners()
    for index in range(count):
        with ledger_url("postgres", settings, "listen") as url:
            ledger = Ledger.from_url(url)
            scope = scope_for({"configurable": {"thread_id": f"lst-{index}"}}, ledger=ledger)
            drop_scope(scope)
            ledger.close()
    time.sleep(0.5)
    return {
        "ledgers_opened_and_closed": count,
        "listen_threads_before": before,
        "listen_threads_after": listeners(),
        "note": "threads named langgraph-cancel-listen still alive after Ledger.close()",
    }


def run(settings: Settings, backends: list[str]) -> dict[str, Any]:
    """The scale section."""
    out: dict[str, Any] = {
        "method": (
            "unsettled(thread) median of repeated calls on a thread with 10 unsettled effects "
            "and no history ('light') and on one that also owns 10% of all settled rows "
            "('heavy'); the write pair: transition_many of one outcome (committed) with the "
            "next effect's intent (dispatched), what EffectToolNode writes per side effect; "
            "one fresh database per size, sizes measured in interleaved rounds. "
            "Settled rows bulk-loaded straight into lgc_effects (executemany on SQLite, COPY "
            "on PostgreSQL) with the secondary indexes dropped and rebuilt from their own "
            "definitions after the load (then VACUUM ANALYZE on PostgreSQL). Throughput: N OS "
            "threads each driving its own thread id through plan -> dispatched -> committed "
            "(3 ledger writes, each committed on its own) for a fixed time."
        ),
        "sizes": {b: sizes_for(settings, b) for b in backends},
        "unsettled": {},
        "throughput": [],
        "memory": [],
    }
    for backend in backends:
        log(f"scale: unsettled on {backend}")
        out["unsettled"][backend] = unsettled_scale(settings, backend)
    threads = 10 if settings.quick else 50
    for backend in backends:
        if backend == "memory":
            continue
        pools: list[int | None] = [None, threads] if backend == "postgres" else [None]
        for pool in pools:
            log(f"scale: throughput {backend} threads={threads} pool={pool or 'default'}")
            row = throughput(settings, backend, threads=threads, pool=pool)
            out["throughput"].append(row)
            log(
                f"  {row['transitions_per_s']} transitions/s, p50 write "
                f"{row['write_latency_ms'].get('median')} ms, errors {row['error_count']}"
            )
    log("scale: hygiene (same-process signal, PostgreSQL LISTEN threads)")
    out["hygiene"] = {"same_process_signal": same_process_signal()}
    if "postgres" in backends:
        out["hygiene"]["pg_listener_threads"] = pg_listener_threads(settings)
    log(f"  {out['hygiene']}")
    for backend in backends:
        log(f"scale: memory per open run on {backend}")
        row = memory_per_run(settings, backend)
        out["memory"].append(row)
        log(f"  {row['bytes_per_open_run']} bytes per open run")
    return out


__all__ = ["run"]

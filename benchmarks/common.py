"""Shared helpers: statistics, backends (fresh databases), timing and the run context."""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

BACKENDS: tuple[str, ...] = ("memory", "sqlite", "postgres")
#: PostgreSQL with synchronous_commit=off (the overhead section runs it beside "postgres",
#: which commits with the server's setting: on, under ./scripts/bench).
PG_NOSYNC = "postgres_nosync"


def is_postgres(backend: str) -> bool:
    """Whether ``backend`` is one of the PostgreSQL variants."""
    return backend in ("postgres", PG_NOSYNC)


PG_DSN_ENV = "LANGGRAPH_CANCEL_TEST_PG_DSN"


# --------------------------------------------------------------------------- statistics
def median(xs: Sequence[float]) -> float | None:
    """The median, or None for no samples."""
    return statistics.median(xs) if xs else None


def percentile(xs: Sequence[float], percent: float) -> float | None:
    """Nearest-rank percentile (``percent`` in 0..100): p99 of 30 samples is the maximum,
    honestly."""
    if not xs:
        return None
    ordered = sorted(xs)
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(xs: Sequence[float], *, scale: float = 1.0, digits: int = 3) -> dict[str, Any]:
    """n, median, p90, p99, min, max of ``xs`` multiplied by ``scale``."""
    if not xs:
        return {"n": 0}
    ys = [x * scale for x in xs]

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, digits)

    return {
        "n": len(ys),
        "median": rounded(median(ys)),
        "p90": rounded(percentile(ys, 90)),
        "p99": rounded(percentile(ys, 99)),
        "min": rounded(min(ys)),
        "max": rounded(max(ys)),
    }


def paired_ratio(
    base: Sequence[float], other: Sequence[float], *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float] | None:
    """Median of the per-trial ratios ``other[i] / base[i]`` and its 95% bootstrap interval.

    The trials were interleaved, so trial ``i`` of each variant ran back to back:
    the pair shares whatever the machine was doing then, and a slow phase of the
    machine moves both. A percentile bootstrap over the pairs (fixed seed: the
    same samples give the same interval) says how far the median could move.

    Returns:
        ``(median, low, high)``, or None without pairs.
    """
    ratios = [o / b for b, o in zip(base, other, strict=False) if b > 0]
    if not ratios:
        return None
    rng = random.Random(seed)
    count = len(ratios)
    meds = sorted(statistics.median(rng.choices(ratios, k=count)) for _ in range(resamples))
    low = meds[int(0.025 * (resamples - 1))]
    high = meds[int(0.975 * (resamples - 1))]
    return statistics.median(ratios), low, high


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """a / b, or None."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def time_median(fn: Callable[[], Any], reps: int) -> float:
    """The median wall time of ``n`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rnd(value: float | None, digits: int = 3) -> float | None:
    """Round, keeping None."""
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------- settings
@dataclass
class Settings:
    """What to run and how much of it."""

    quick: bool = False
    backends: tuple[str, ...] = BACKENDS
    sections: tuple[str, ...] = ("overhead", "profile", "latency", "scale", "recovery")
    pg_dsn: str | None = None
    scale_max: int = 1_000_000
    out: str = "benchmarks/results/latest.json"
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="lgc-bench-"))
    latency_trials: int = 30
    batches: tuple[int, ...] | None = None
    reps: int | None = None
    verbose: bool = True

    @property
    def has_pg(self) -> bool:
        """True when PostgreSQL is selected and reachable by DSN."""
        return "postgres" in self.backends and bool(self.pg_dsn)


def log(msg: str) -> None:
    """Progress line on stderr (the table goes to stdout)."""
    import sys

    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- PostgreSQL
def with_dbname(dsn: str, dbname: str) -> str:
    """A ``postgresql://`` URL for database ``dbname`` on the server of ``dsn``."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        return urlunsplit(("postgresql", parts.netloc, "/" + quote(dbname), parts.query, ""))
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params: dict[str, Any] = {k: v for k, v in conninfo_to_dict(dsn).items() if v is not None}
    params["dbname"] = dbname
    return make_conninfo("", **params)


def _admin(dsn: str, statement: str, dbname: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL(statement).format(sql.Identifier(dbname)))


@contextlib.contextmanager
def fresh_pg_db(dsn: str, tag: str = "x", *, synchronous_commit: bool = True) -> Iterator[str]:
    """A new, empty database on the server (dropped with FORCE afterwards).

    ``synchronous_commit=False``: every session on it commits without waiting for
    the WAL flush (the library's own cost, the disk's taken out).
    """
    dbname = f"lgc_bench_{tag}_{uuid.uuid4().hex[:8]}"
    _admin(dsn, "CREATE DATABASE {}", dbname)
    if not synchronous_commit:
        _admin(dsn, "ALTER DATABASE {} SET synchronous_commit = off", dbname)
    try:
        yield with_dbname(dsn, dbname)
    finally:
        for _ in range(10):
            try:
                _admin(dsn, "DROP DATABASE IF EXISTS {} WITH (FORCE)", dbname)
                break
            except Exception:
                time.sleep(0.5)


def pg_server_info(dsn: str) -> dict[str, Any]:
    """Version and the settings that decide what a commit costs."""
    import psycopg

    out: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        out["server_version"] = row[0] if row else None
        for name in (
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "max_connections",
            "shared_buffers",
            "wal_sync_method",
        ):
            row = conn.execute(f"SHOW {name}").fetchone()
            out[name] = row[0] if row else None
    return out


def pg_ping(dsn: str) -> str | None:
    """None when the server answers, else the error text."""
    try:
        import psycopg

        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
        return None
    except Exception as exc:  # reported, not raised: PostgreSQL is then skipped
        return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- backends
@contextlib.contextmanager
def ledger_url(backend: str, settings: Settings, tag: str) -> Iterator[str]:
    """A fresh ledger URL on ``backend``: memory, a SQLite file in a temp dir, a new PG db."""
    if backend == "memory":
        yield "memory://"
    elif backend == "sqlite":
        directory = tempfile.mkdtemp(prefix=f"{tag}-", dir=settings.workdir)
        yield "sqlite:///" + os.path.join(directory, "ledger.db")
    elif backend == "postgres":
        assert settings.pg_dsn
        with fresh_pg_db(settings.pg_dsn, tag) as url:
            yield url
    else:  # pragma: no cover - validated by the CLI
        raise ValueError(backend)


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` took (perf_counter)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def plan_work(ledger: Any, thread_id: str, run_id: str, count: int, prefix: str) -> Any:
    """Plan ``count`` irreversible ``work`` calls (``{prefix}{i}``) in a run, as the
    benchmarks' agents do: ``Ledger.plan_many``'s answer."""
    from langgraph_cancel.types import EffectKind, NewEffect

    return ledger.plan_many(
        thread_id=thread_id,
        run_id=run_id,
        items=[
            NewEffect(
                tool_call_id=f"{prefix}{i}",
                tool="work",
                kind=EffectKind.IRREVERSIBLE,
                args={"i": i},
                seq=i,
            )
            for i in range(count)
        ],
        owner="bench",
        actor="bench",
    )


def write_pair(ledger: Any, done: str, then: str) -> None:
    """What EffectToolNode writes per side effect: one outcome with the next intent."""
    from langgraph_cancel.types import EffectStatus, TransitionRequest

    ledger.transition_many(
        [
            TransitionRequest(
                effect_id=done,
                to=EffectStatus.COMMITTED,
                expected=frozenset({EffectStatus.DISPATCHED}),
                actor="bench",
                result={"content": "ok", "status": "success"},
            ),
            TransitionRequest(
                effect_id=then,
                to=EffectStatus.DISPATCHED,
                expected=frozenset({EffectStatus.PLANNED}),
                actor="bench",
                owner="bench",
            ),
        ]
    )

"""The commit floor: what one durable write costs on this machine, measured in the same run.

The ledger's per-call targets are stated against it: a side effect needs its intent
durable before the call (one commit) and its outcome after (one more, or shared
with the next intent), so no design beats one commit round trip per call.

- PostgreSQL: a single-row ``INSERT`` in autocommit, one round trip each, on a
  database committing with ``synchronous_commit`` on (the headline: every commit
  waits for the WAL flush, fsync on) and on one with it off (no flush wait).
- SQLite: the same ``INSERT`` committed in WAL mode at ``synchronous=NORMAL``
  (what the library's SQLite ledger uses).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from typing import Any

from benchmarks.common import PG_NOSYNC, Settings, fresh_pg_db, log, summary

CREATE = "CREATE TABLE floor (id integer PRIMARY KEY, note text NOT NULL)"
INSERT_PG = "INSERT INTO floor (id, note) VALUES (%s, %s)"
INSERT_SQLITE = "INSERT INTO floor (id, note) VALUES (?, ?)"


def _trials(settings: Settings) -> int:
    return 40 if settings.quick else 400


def _pg_commits(dsn: str, trials: int, *, synchronous_commit: bool) -> list[float]:
    import psycopg

    tag = "floor" if synchronous_commit else "floornosync"
    with (
        fresh_pg_db(dsn, tag, synchronous_commit=synchronous_commit) as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        conn.execute(CREATE)
        samples = []
        for index in range(trials + 10):
            t0 = time.perf_counter()
            conn.execute(INSERT_PG, (index, "commit floor"))
            if index >= 10:  # the first ones warm the connection and the plan cache
                samples.append(time.perf_counter() - t0)
        return samples


def _sqlite_commits(settings: Settings, trials: int) -> list[float]:
    directory = tempfile.mkdtemp(prefix="floor-", dir=settings.workdir)
    conn = sqlite3.connect(os.path.join(directory, "floor.db"), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(CREATE)
        samples = []
        for index in range(trials + 10):
            t0 = time.perf_counter()
            conn.execute(INSERT_SQLITE, (index, "commit floor"))
            if index >= 10:
                samples.append(time.perf_counter() - t0)
        return samples
    finally:
        conn.close()


def run(settings: Settings, backends: list[str]) -> dict[str, Any]:
    """The floor per backend; ``commit_ms`` summaries keyed by backend."""
    trials = _trials(settings)
    floors: dict[str, Any] = {}
    if "sqlite" in backends:
        floors["sqlite"] = {"commit_ms": summary(_sqlite_commits(settings, trials), scale=1e3)}
    if "postgres" in backends:
        assert settings.pg_dsn
        for name, sync_commit in (("postgres", True), (PG_NOSYNC, False)):
            samples = _pg_commits(settings.pg_dsn, trials, synchronous_commit=sync_commit)
            floors[name] = {"commit_ms": summary(samples, scale=1e3)}
    for name, floor in floors.items():
        log(f"  floor {name:16s} one commit: median {floor['commit_ms']['median']} ms")
    return {
        "method": (
            "one single-row INSERT committed on its own, timed from the client, median of "
            f"{trials}: PostgreSQL in autocommit on a fresh database with "
            "synchronous_commit on ('postgres') and off ('postgres_nosync'); SQLite in WAL "
            "mode at synchronous=NORMAL"
        ),
        "backends": floors,
    }

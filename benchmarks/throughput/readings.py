"""What the parent reads from the server around a cell: activity samples, commits,
WAL, the database's size, the ledger's rows, the server's time per statement
(``pg_stat_statements``) and its processes' CPU time."""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from benchmarks.bound import TABLE as BOUND_TABLE
from benchmarks.common import rnd

LEDGER_TABLES = (
    "lgc_runs",
    "lgc_effects",
    "lgc_transitions",
    "lgc_leases",
    "lgc_lease_takeovers",
    BOUND_TABLE,
)


#: Transactions one ``commits_and_wal`` reading commits.
READING_COMMITS = 2


def sample_activity(url: str, stop: threading.Event, samples: list[dict[str, int]]) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'),"
                " count(*) FILTER (WHERE state = 'active'),"
                " count(*), count(*) FILTER (WHERE wait_event_type IN ('IO', 'LWLock'))"
                " FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchone()
            if row is not None:
                samples.append(
                    {"lock_waits": row[0], "active": row[1], "connections": row[2], "io": row[3]}
                )
            stop.wait(0.05)


def db_bytes(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


def commits_and_wal(url: str) -> tuple[int, int, int]:
    """Transactions committed in the database so far, the server's WAL position, and
    the WAL flushes to disk the server has done (``pg_stat_wal.wal_sync``)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT xact_commit, pg_current_wal_lsn() - '0/0'::pg_lsn,"
            " (SELECT wal_sync FROM pg_stat_wal)"
            " FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


def ledger_rows(url: str) -> dict[str, int]:
    import psycopg

    rows: dict[str, int] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for table in LEDGER_TABLES:
            exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
            if exists and exists[0]:
                found = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                rows[table] = int(found[0]) if found else 0
    return rows


#: The families of statements the server's time is told apart by (``pg_stat_statements``).
STATEMENT_FAMILIES = ("ledger", "checkpoints", "other")


def statement_family(query: str) -> str:
    """Which family a statement belongs to: the ledger's (its tables are ``lgc_*``, the
    ``bound`` variant's its own),
    LangGraph's checkpoint saver's, or anything else (this section's own readings)."""
    text = query.lower()
    if "lgc_" in text or BOUND_TABLE in text:
        return "ledger"
    if "checkpoint" in text:
        return "checkpoints"
    return "other"


def statements_ready(url: str) -> bool:
    """Whether the server counts statements (``pg_stat_statements`` preloaded): the
    extension is created in the database and its counts for it are cleared."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute(
                "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                " WHERE datname = current_database()), 0)"
            )
    except psycopg.Error:
        return False
    return True


def statement_times(url: str) -> list[dict[str, Any]]:
    """The server's time per statement in this database since ``statements_ready``:
    execution and planning, in ms, with the calls."""
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT query, calls, total_exec_time + total_plan_time AS ms"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
            " WHERE datname = current_database())"
        ).fetchall()


def statement_summary(rows: list[dict[str, Any]], runs: int) -> dict[str, Any]:
    """Per run: the server's statement time (ms) and statements by family, and the
    ledger's costliest statements (time per run and per call)."""
    time_ms = dict.fromkeys(STATEMENT_FAMILIES, 0.0)
    calls = dict.fromkeys(STATEMENT_FAMILIES, 0)
    by_name: dict[str, list[float]] = {}
    for row in rows:
        family = statement_family(row["query"])
        time_ms[family] += float(row["ms"])
        calls[family] += int(row["calls"])
        if family == "ledger":
            spent = by_name.setdefault(ledger_statement_name(row["query"]), [0.0, 0.0])
            spent[0] += int(row["calls"])
            spent[1] += float(row["ms"])
    costliest = sorted(by_name.items(), key=lambda item: -item[1][1])[:6]
    return {
        "ms_per_run": {family: rnd(ms / runs, 3) for family, ms in time_ms.items()},
        "statements_per_run": {family: rnd(n / runs, 2) for family, n in calls.items()},
        "costliest_ledger": [
            {
                "statement": name,
                "per_run": rnd(count / runs, 2),
                "us_per_call": rnd(ms * 1000 / max(count, 1), 0),
            }
            for name, (count, ms) in costliest
        ],
    }


#: How many leading characters a statement must share with a constant to be named by
#: it; a template's text before its first placeholder, at least ``MATCHED_HEAD``.
MATCHED_START = 60
MATCHED_HEAD = 15


def _shape(text: str) -> str:
    """A statement with its parameters blanked and its spacing made one blank."""
    return " ".join(re.sub(r"%\(\w+\)s|\$\d+", "?", text).lower().split())


def _common_start(first: str, second: str) -> int:
    """How many leading characters two strings share."""
    return next(
        (at for at, (one, other) in enumerate(zip(first, second, strict=False)) if one != other),
        min(len(first), len(second)),
    )


def ledger_statement_name(query: str) -> str:
    """The name of the ledger's SQL constant (``ledger/sql.py``) a statement the server
    counted was made from: the constant whose text starts the same way the longest
    (templates are filled in before they run, so only their beginning is compared; a
    template whose whole text before its first placeholder matches counts as a match
    however short that text). The statement's own beginning when none matches."""
    from langgraph_cancel.ledger import sql as ledger_sql

    shape = _shape(query)
    best, best_length = "", 0
    for name, text in vars(ledger_sql).items():
        if not (name.isupper() and isinstance(text, str)):
            continue
        template = _shape(text)
        length = _common_start(shape, template)
        if "{" in template and length == template.index("{") >= MATCHED_HEAD:
            length = max(length, MATCHED_START)
        if length > best_length:
            best, best_length = name, length
    return best if best_length >= MATCHED_START else shape[:MATCHED_START]


def server_cpu_s() -> float | None:
    """CPU seconds used so far by this machine's PostgreSQL processes (None: none here).

    A backend that has exited counts too: the postmaster, which reaps it, holds its
    time as its children's (``cutime``, ``cstime``).
    """
    ticks = os.sysconf("SC_CLK_TCK")
    total, found = 0.0, False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read().split(b"\0", 1)[0]
            if not (command.startswith(b"postgres") or command.endswith(b"/postgres")):
                continue
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a process that ended meanwhile
        total += sum(int(value) for value in fields[11:15]) / ticks
        found = True
    return total if found else None

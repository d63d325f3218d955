"""Database access for the ledger: the ``Backend`` base, SQLite, and opening a URL.

Two dialects share every statement they can (see ``sql.py``): SQLite (memory and
file, here) and PostgreSQL (psycopg 3, in ``postgres.py``). What differs between
them (the planning insert, the compare-and-set, a batch of either) is an operation
of the backend, from its dialect's mixin in ``dialects.py``, as DBOS splits its
system database: the ledger asks its backend and never branches on the dialect.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Literal, Protocol

from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from langgraph_cancel.ledger import schema
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.dialects import DialectStatements, SqliteStatements, json_text
from langgraph_cancel.ledger.retry import is_transient, raise_transient, transient_retry

Dialect = Literal["sqlite", "postgres"]


class Cursor(Protocol):
    """The part of a DB-API cursor the ledger uses, with dict rows."""

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> Any: ...
    def executemany(self, sql: str, params: Sequence[dict[str, Any]]) -> Any: ...
    def fetchone(self) -> dict[str, Any] | None: ...
    def fetchall(self) -> list[dict[str, Any]]: ...


class Backend(DialectStatements):
    """A database the ledger can run transactions on."""

    dialect: Dialect
    url: str

    def transaction(self) -> Any:  # pragma: no cover - interface
        """A context manager yielding a ``Cursor`` inside one transaction."""
        raise NotImplementedError

    def statement(self) -> Any:
        """A context manager yielding a ``Cursor`` for one self-contained statement.

        PostgreSQL runs it in autocommit (no BEGIN/COMMIT round trips); SQLite
        runs it in a transaction like any other write.
        """
        return self.transaction()

    def all_rows(
        self, statements: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[list[dict[str, Any]]]:
        """Run statements in order, in one round trip: the rows of each.

        Each sees what the ones before it wrote. SQLite runs them in one
        transaction; PostgreSQL in one pipeline.
        """
        with self.transaction() as cur:
            out: list[list[dict[str, Any]]] = []
            for sql, params in statements:
                cur.execute(sql, params)
                out.append(cur.fetchall())
            return out

    def first_rows(
        self, statements: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[dict[str, Any] | None]:
        """``all_rows``, keeping the first row of each statement (or None)."""
        return [rows[0] if rows else None for rows in self.all_rows(statements)]

    def read(self) -> Any:
        """A context manager yielding a ``Cursor`` for one self-contained ``SELECT``.

        A single statement sees one snapshot in both dialects, so no transaction
        is opened (PostgreSQL: no BEGIN/COMMIT round trips; SQLite: no write lock).
        """
        return self.statement()

    def close(self) -> None:  # pragma: no cover - interface
        """Release connections."""
        raise NotImplementedError

    def sql(self, statement: str) -> str:
        """The statement in this dialect's placeholder style."""
        return statement

    def json_in(self, value: Any) -> Any:
        """Adapt a JSON-able value for a JSON column."""
        if value is None:
            return None
        return json.dumps(value, default=str, sort_keys=True)

    def json_out(self, value: Any) -> Any:
        """Read a JSON column."""
        if value is None or not isinstance(value, str | bytes):
            return value
        return json.loads(value)

    def ts_in(self, value: datetime | None) -> Any:
        """Adapt a datetime for a timestamp column."""
        return value

    def ts_out(self, value: Any) -> datetime | None:
        """Read a timestamp column."""
        return value  # type: ignore[no-any-return]

    @property
    def migrations(self) -> list[list[str]]:
        """The append-only schema migrations of this dialect."""
        raise NotImplementedError  # pragma: no cover


class CallersHandle:
    """The caller's pool or connection a ledger backend uses or serves beside.

    ``closed`` once it has been seen open and is closed again: a pool made with
    ``open=False`` and not opened yet is not closed, it is still to come.
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        # Whether ``target`` was ever seen open (here or by ``closed``); only then
        # does its closing count.
        self._seen_open = not target.closed

    @property
    def closed(self) -> bool:
        """Whether the caller has closed it (after it was open)."""
        if not self.target.closed:
            self._seen_open = True
            return False
        return self._seen_open


def enable_wal(conn: sqlite3.Connection, *, timeout: float = 30.0) -> None:
    """Put a file database in WAL mode, waiting out other processes doing the same.

    Switching a fresh file to WAL needs its exclusive lock, and SQLite answers
    "database is locked" at once to all but one of several processes that try
    together (its busy handler is not called there, to avoid a deadlock). So
    the switch is retried, with jitter, for up to ``timeout`` seconds. Once the
    file is in WAL mode the pragma is a no-op that takes no lock.

    Args:
        conn: A connection to a file database.
        timeout: Seconds to keep trying before the lock error is raised.
    """
    for attempt in Retrying(
        retry=retry_if_exception(
            lambda exc: isinstance(exc, sqlite3.OperationalError) and is_transient(exc)
        ),
        stop=stop_after_delay(timeout),
        wait=wait_exponential(multiplier=0.005, max=0.25) + wait_random(0, 0.01),
        reraise=True,
    ):
        with attempt:
            conn.execute("PRAGMA journal_mode = WAL")


class SqliteBackend(SqliteStatements, Backend):
    """SQLite: an in-memory database or one file in WAL mode.

    One connection per backend, serialized by a lock; writers across processes
    are serialized by SQLite itself (``BEGIN IMMEDIATE`` plus a busy timeout).
    """

    dialect: Dialect = "sqlite"

    def __init__(self, path: str, *, url: str | None = None, busy_timeout_ms: int = 30_000) -> None:
        self.path = path
        # Each in-memory database is its own world: give it a URL of its own. Not from
        # uuid.uuid4: tests that make it deterministic must see the ids they expect.
        self.url = url or (
            f"sqlite:///{path}" if path != ":memory:" else f"memory://{secrets.token_hex(6)}"
        )
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(
            path, check_same_thread=False, isolation_level=None, timeout=busy_timeout_ms / 1000
        )
        self._conn.row_factory = sqlite3.Row
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if path != ":memory:":
            enable_wal(self._conn, timeout=busy_timeout_ms / 1000)
            self._conn.execute("PRAGMA synchronous = NORMAL")
        self._sql_cache: dict[str, str] = {}
        self._depth = 0

    @property
    def migrations(self) -> list[list[str]]:
        return schema.SQLITE_MIGRATIONS

    def sql(self, statement: str) -> str:
        cached = self._sql_cache.get(statement)
        if cached is None:
            cached = self._sql_cache[statement] = ledger_sql.to_sqlite(statement)
        return cached

    def ts_in(self, value: datetime | None) -> Any:
        return None if value is None else value.isoformat(timespec="microseconds")

    def ts_out(self, value: Any) -> datetime | None:
        if value is None or isinstance(value, datetime):
            return value
        return datetime.fromisoformat(value)

    @contextmanager
    def transaction(self) -> Iterator[Cursor]:
        with self._lock:
            if self._depth:  # nested use within one transaction
                self._depth += 1
                try:
                    yield _SqliteCursor(self._conn.cursor(), self)
                finally:
                    self._depth -= 1
                return
            self._conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield _SqliteCursor(self._conn.cursor(), self)
            except BaseException:
                self._depth = 0
                self._conn.execute("ROLLBACK")
                raise
            self._depth = 0
            self._conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[Cursor]:
        with self._lock:
            yield _SqliteCursor(self._conn.cursor(), self)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class _SqliteCursor:
    __slots__ = ("_backend", "_cur")

    def __init__(self, cur: sqlite3.Cursor, backend: SqliteBackend) -> None:
        self._cur = cur
        self._backend = backend

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        return self._cur.execute(self._backend.sql(sql), params or {})

    def executemany(self, sql: str, params: Sequence[dict[str, Any]]) -> Any:
        return self._cur.executemany(self._backend.sql(sql), params)

    def fetchone(self) -> dict[str, Any] | None:
        row = self._cur.fetchone()
        return None if row is None else dict(row)

    def fetchall(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._cur.fetchall()]


def parse_url(url: str) -> tuple[Literal["memory", "sqlite", "postgres"], str]:
    """What a ledger URL names, without opening it: the kind and its path or conninfo.

    Raises:
        InvalidURLError: For anything but ``memory://``, ``sqlite:///path`` or
            ``postgresql://...`` (or a bare ``*.db`` path).
    """
    from langgraph_cancel.errors import InvalidURLError

    if not isinstance(url, str) or not url:
        raise InvalidURLError(f"not a database URL: {url!r}")
    if url in ("memory://", "memory", ":memory:", "sqlite://", "sqlite:///:memory:"):
        return "memory", ":memory:"
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        return ("sqlite", path) if path else ("memory", ":memory:")
    if url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        return "postgres", url.replace("postgresql+psycopg://", "postgresql://", 1)
    if "://" not in url and url.endswith((".db", ".sqlite", ".sqlite3")):
        return "sqlite", url
    raise InvalidURLError(
        f"unsupported database URL {url!r}: use memory://, sqlite:///path/to/file.db "
        "or postgresql://user@host:port/dbname"
    )


__all__ = [
    "Backend",
    "CallersHandle",
    "Cursor",
    "Dialect",
    "SqliteBackend",
    "enable_wal",
    "is_transient",
    "json_text",
    "parse_url",
    "raise_transient",
    "transient_retry",
]

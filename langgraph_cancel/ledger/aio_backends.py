"""Database access for the async ledger: the same statements, awaited on the caller's loop.

Three backends, as ``backends.py`` and ``postgres.py`` have for the sync ledger:

- ``AsyncMemoryBackend`` wraps a sync in-memory ``SqliteBackend`` (the very same
  database, shared with the sync ledger): an in-memory statement does no I/O, so
  it runs inline on the loop, without a thread.
- ``AsyncSqliteBackend`` is a file in WAL mode through aiosqlite, as LangGraph's
  ``AsyncSqliteSaver`` (one connection, its own thread, one transaction at a time).
- ``AsyncPostgresBackend`` (in ``aio_postgres.py``) is psycopg 3's
  ``AsyncConnectionPool`` (or one ``AsyncConnection``), autocommit statements and
  pipelines as the sync backend.

What differs between the dialects is a method of the backend, awaited by the
ledger, as the sync backends have them.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from langgraph_cancel.ledger import schema
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.backends import Dialect, SqliteBackend
from langgraph_cancel.ledger.dialects import DialectStatements, SqliteStatements
from langgraph_cancel.ledger.retry import atransient_retry, is_transient

if TYPE_CHECKING:
    import aiosqlite


class AsyncCursor(Protocol):
    """The part of an async DB-API cursor the async ledger uses, with dict rows."""

    async def execute(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        """Run one statement."""
        ...

    async def executemany(self, sql: str, params: Sequence[dict[str, Any]]) -> Any:
        """Run one statement per parameter set."""
        ...

    async def fetchone(self) -> dict[str, Any] | None:
        """The next row of the last statement, or None."""
        ...

    async def fetchall(self) -> list[dict[str, Any]]:
        """The remaining rows of the last statement."""
        ...


class AsyncBackend(DialectStatements):
    """A database the async ledger can run transactions on."""

    dialect: Dialect
    url: str

    def transaction(self) -> AbstractAsyncContextManager[AsyncCursor]:  # pragma: no cover
        """An async context manager yielding an ``AsyncCursor`` inside one transaction."""
        raise NotImplementedError

    def statement(self) -> AbstractAsyncContextManager[AsyncCursor]:
        """A cursor for one self-contained statement (PostgreSQL: autocommit)."""
        return self.transaction()

    def read(self) -> AbstractAsyncContextManager[AsyncCursor]:
        """A cursor for one self-contained ``SELECT`` (no transaction opened)."""
        return self.statement()

    async def all_rows(
        self, statements: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[list[dict[str, Any]]]:
        """Run statements in order, in one round trip where the dialect can: the rows of each."""
        async with self.transaction() as cur:
            out: list[list[dict[str, Any]]] = []
            for sql, params in statements:
                await cur.execute(sql, params)
                out.append(await cur.fetchall())
            return out

    async def first_rows(
        self, statements: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[dict[str, Any] | None]:
        """``all_rows``, keeping the first row of each statement (or None)."""
        return [rows[0] if rows else None for rows in await self.all_rows(statements)]

    async def aclose(self) -> None:  # pragma: no cover - interface
        """Release connections."""
        raise NotImplementedError

    @property
    def migrations(self) -> list[list[str]]:  # pragma: no cover - interface
        """The append-only schema migrations of this dialect."""
        raise NotImplementedError

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


class _SqliteDialect(SqliteStatements, AsyncBackend):
    """SQLite's statements, placeholders, timestamps (text, ISO 8601) and its way of
    writing effects: a transaction of plain statements."""

    dialect: Dialect = "sqlite"

    @property
    def migrations(self) -> list[list[str]]:
        return schema.SQLITE_MIGRATIONS

    def ts_in(self, value: datetime | None) -> Any:
        return None if value is None else value.isoformat(timespec="microseconds")

    def ts_out(self, value: Any) -> datetime | None:
        if value is None or isinstance(value, datetime):
            return value
        return datetime.fromisoformat(value)


class _InlineCursor:
    """An in-memory SQLite cursor behind the async interface: every await is immediate."""

    __slots__ = ("_cur",)

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    async def execute(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        return self._cur.execute(sql, params)

    async def executemany(self, sql: str, params: Sequence[dict[str, Any]]) -> Any:
        return self._cur.executemany(sql, params)

    async def fetchone(self) -> dict[str, Any] | None:
        row: dict[str, Any] | None = self._cur.fetchone()
        return row

    async def fetchall(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._cur.fetchall()
        return rows


class AsyncMemoryBackend(_SqliteDialect):
    """The in-memory database of a sync ``SqliteBackend``, awaited inline on the loop.

    Shares the sync backend's connection, so the sync and async ledgers on it see
    one database. Nothing here suspends: a transaction's statements run back to
    back, so no other coroutine interleaves with them.

    Args:
        backend: A sync backend on ``:memory:``.
    """

    def __init__(self, backend: SqliteBackend) -> None:
        if backend.path != ":memory:":
            raise ValueError("AsyncMemoryBackend wraps an in-memory SqliteBackend only")
        self.sync = backend
        self.url = backend.url

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncCursor]:
        with self.sync.transaction() as cur:
            yield _InlineCursor(cur)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncCursor]:
        with self.sync.read() as cur:
            yield _InlineCursor(cur)

    async def aclose(self) -> None:
        """Nothing of its own to close: the sync backend owns the connection."""


class _AiosqliteCursor:
    """A statement's rows fetched with the statement: one hop to aiosqlite's thread, not two."""

    __slots__ = ("_conn", "_rows", "_sql")

    def __init__(self, conn: aiosqlite.Connection, sql: Callable[[str], str]) -> None:
        self._conn = conn
        self._sql = sql
        self._rows: list[sqlite3.Row] = []

    async def execute(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        self._rows = list(await self._conn.execute_fetchall(self._sql(sql), params or {}))

    async def executemany(self, sql: str, params: Sequence[dict[str, Any]]) -> Any:
        await self._conn.executemany(self._sql(sql), params)
        self._rows = []

    async def fetchone(self) -> dict[str, Any] | None:
        if not self._rows:
            return None
        return dict(self._rows.pop(0))

    async def fetchall(self) -> list[dict[str, Any]]:
        rows, self._rows = self._rows, []
        return [dict(r) for r in rows]


class AsyncSqliteBackend(_SqliteDialect):
    """A SQLite file in WAL mode through aiosqlite: one connection, one transaction at a time.

    Writers of other processes (and the sync ledger on the same file) are
    serialized by SQLite itself: ``BEGIN IMMEDIATE`` plus a busy timeout.
    Open it with ``await AsyncSqliteBackend.open(path)``.

    Args:
        conn: An open aiosqlite connection (autocommit: ``isolation_level=None``).
        path: Its file.
        url: The ledger URL naming it (default: ``sqlite:///<path>``).
    """

    def __init__(self, conn: aiosqlite.Connection, path: str, *, url: str | None = None) -> None:
        self.conn = conn
        self.path = path
        self.url = url or f"sqlite:///{path}"
        self._lock = asyncio.Lock()
        # The cursor of the transaction the current task is inside of, for nested use.
        self._current: contextvars.ContextVar[_AiosqliteCursor | None] = contextvars.ContextVar(
            f"lgc_aiosqlite_tx_{id(self)}", default=None
        )
        self._sql_cache: dict[str, str] = {}

    @classmethod
    async def open(
        cls, path: str, *, url: str | None = None, busy_timeout_ms: int = 30_000
    ) -> AsyncSqliteBackend:
        """Connect to ``path`` (a file), in WAL mode with ``synchronous = NORMAL``."""
        import aiosqlite

        if path == ":memory:":
            raise ValueError("an in-memory database is AsyncMemoryBackend's (shared, no thread)")
        pending = aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout_ms / 1000)
        # aiosqlite's worker thread lives until the connection is closed, and its last
        # call keeps the connection alive: a ledger nobody closed would hold the process
        # open at exit. Committed work is on disk (WAL), so the thread need not be waited for.
        worker = getattr(pending, "_thread", pending)
        if isinstance(worker, threading.Thread):
            worker.daemon = True
        conn = await pending
        try:
            conn.row_factory = sqlite3.Row
            await conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            await _enable_wal(conn, within=busy_timeout_ms / 1000)
            await conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            await conn.close()
            raise
        return cls(conn, path, url=url)

    def sql(self, statement: str) -> str:
        """The statement with SQLite's placeholders (cached)."""
        cached = self._sql_cache.get(statement)
        if cached is None:
            cached = self._sql_cache[statement] = ledger_sql.to_sqlite(statement)
        return cached

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncCursor]:
        current = self._current.get()
        if current is not None:  # nested use within one transaction
            yield current
            return
        async with self._lock:
            await self.conn.execute("BEGIN IMMEDIATE")
            cur = _AiosqliteCursor(self.conn, self.sql)
            token = self._current.set(cur)
            try:
                yield cur
            except BaseException:
                self._current.reset(token)
                # Shielded: a cancelled task must not leave the connection mid-transaction.
                await asyncio.shield(self.conn.execute("ROLLBACK"))
                raise
            self._current.reset(token)
            try:
                await asyncio.shield(self.conn.execute("COMMIT"))
            except sqlite3.Error:
                # A failed COMMIT leaves the transaction open: end it before the retry.
                await asyncio.shield(self.conn.execute("ROLLBACK"))
                raise

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncCursor]:
        current = self._current.get()
        if current is not None:
            yield current
            return
        async with self._lock:
            yield _AiosqliteCursor(self.conn, self.sql)

    async def aclose(self) -> None:
        await self.conn.close()


async def _enable_wal(conn: aiosqlite.Connection, *, within: float) -> None:
    """``backends.enable_wal`` on aiosqlite: the switch retried while another process holds
    it, for up to ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    delay = 0.005
    while True:
        try:
            await conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not is_transient(exc) or loop.time() >= deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)


__all__ = [
    "AsyncBackend",
    "AsyncCursor",
    "AsyncMemoryBackend",
    "AsyncSqliteBackend",
    "atransient_retry",
]

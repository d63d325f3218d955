"""Database access for the async ledger: the same statements, awaited on the caller's loop.

Three backends, as ``backends.py`` has for the sync ledger:

- ``AsyncMemoryBackend`` wraps a sync in-memory ``SqliteBackend`` (the very same
  database, shared with the sync ledger): an in-memory statement does no I/O, so
  it runs inline on the loop, without a thread.
- ``AsyncSqliteBackend`` is a file in WAL mode through aiosqlite, as LangGraph's
  ``AsyncSqliteSaver`` (one connection, its own thread, one transaction at a time).
- ``AsyncPostgresBackend`` is psycopg 3's ``AsyncConnectionPool`` (or one
  ``AsyncConnection``), autocommit statements and pipelines as the sync backend.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    before_sleep_log,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from langgraph_cancel.errors import TransientDatabaseError
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.backends import (
    Dialect,
    SqliteBackend,
    is_transient,
    json_text,
    raise_transient,
)

if TYPE_CHECKING:
    import aiosqlite
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

logger = logging.getLogger("langgraph_cancel.ledger")

T = TypeVar("T")
P = ParamSpec("P")


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


def _give_up(state: RetryCallState) -> Any:
    """Out of retries: one typed error, the driver's own as its cause."""
    exc = state.outcome.exception() if state.outcome is not None else None
    if exc is None:  # pragma: no cover - tenacity only calls this after a failure
        raise TransientDatabaseError("database unavailable after retries")
    raise raise_transient(exc, 1 + state.attempt_number) from exc


def atransient_retry(
    attempts: int = 6,
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """``transient_retry`` for coroutines: the whole transaction again on a transient fault.

    The first attempt is a plain await; tenacity's ``AsyncRetrying`` takes over
    after a transient fault (its waits are ``asyncio.sleep``, the loop stays free).
    A fault that outlives the retries is raised as ``TransientDatabaseError``.
    """

    def decorate(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(fn)
        async def first_then_retrying(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                logger.warning("Retrying %s at once as it raised %r.", fn.__qualname__, exc)
            retrying = AsyncRetrying(
                retry=retry_if_exception(is_transient),
                stop=stop_after_attempt(attempts - 1),
                wait=wait_exponential(multiplier=0.02, min=0.01, max=1.0),
                before_sleep=before_sleep_log(logger, logging.WARNING),
                retry_error_callback=_give_up,
                reraise=True,
            )
            result: T = await retrying(fn, *args, **kwargs)
            return result

        return first_then_retrying

    return decorate


class AsyncBackend:
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


class _SqliteDialect(AsyncBackend):
    """SQLite's statements, placeholders and timestamps (text, ISO 8601)."""

    dialect: Dialect = "sqlite"

    @property
    def migrations(self) -> list[list[str]]:
        return q.SQLITE_MIGRATIONS

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
        conn = await aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout_ms / 1000)
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
            cached = self._sql_cache[statement] = q.to_sqlite(statement)
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


class AsyncPostgresBackend(AsyncBackend):
    """PostgreSQL through psycopg 3's async API: a pool (preferred), one connection, or a URL.

    Open one on a URL with ``await AsyncPostgresBackend.open(url)``; the pool is
    then this backend's own, with the sync backend's connection settings.

    Args:
        conn: An ``AsyncConnectionPool`` or an ``AsyncConnection`` (autocommit).
        conninfo: The connection string (with its password), for side connections.
        owns: Close the pool with the backend.
    """

    dialect: Dialect = "postgres"

    def __init__(
        self,
        conn: AsyncConnection[Any] | AsyncConnectionPool[Any],
        *,
        conninfo: str,
        owns: bool = False,
    ) -> None:
        from psycopg_pool import AsyncConnectionPool as _Pool

        self.closed = False
        self.conninfo = conninfo
        self.url = conninfo
        self._owns = owns
        self._pool: AsyncConnectionPool[Any] | None = conn if isinstance(conn, _Pool) else None
        self._conn: AsyncConnection[Any] | None = None if isinstance(conn, _Pool) else conn
        self._lock = asyncio.Lock()

    @classmethod
    async def open(
        cls, conninfo: str, *, min_size: int = 1, max_size: int = 8
    ) -> AsyncPostgresBackend:
        """A backend with a pool of its own on ``conninfo``."""
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool as _Pool

        pool: AsyncConnectionPool[Any] = _Pool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                # As the sync backend: prepared generic plans, index probes only.
                "prepare_threshold": 0,
                "options": "-c plan_cache_mode=force_generic_plan -c enable_seqscan=off",
            },
            open=False,
            name="langgraph-cancel-ledger-async",
        )
        await pool.open()
        return cls(pool, conninfo=conninfo, owns=True)

    @property
    def migrations(self) -> list[list[str]]:
        return q.POSTGRES_MIGRATIONS

    def json_in(self, value: Any) -> Any:
        if value is None:
            return None
        from psycopg.types.json import Jsonb

        return Jsonb(value, dumps=json_text)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection for one use: from the pool, or the one connection under its lock."""
        if self._pool is not None:
            # Not pool.connection(): its ``async with conn`` ends a transaction these
            # autocommit statements never open; putconn still discards a broken one.
            conn = await self._pool.getconn()
            try:
                yield conn
            finally:
                await self._pool.putconn(conn)
            return
        assert self._conn is not None
        async with self._lock:
            yield self._conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncCursor]:
        from psycopg.rows import dict_row

        async with self._connection() as conn, conn.transaction():
            yield conn.cursor(row_factory=dict_row)

    @asynccontextmanager
    async def statement(self) -> AsyncIterator[AsyncCursor]:
        from psycopg.rows import dict_row

        async with self._connection() as conn:
            yield conn.cursor(row_factory=dict_row)

    async def all_rows(
        self, statements: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[list[dict[str, Any]]]:
        from psycopg.pq import ExecStatus
        from psycopg.rows import dict_row

        async def rows(cur: Any) -> list[dict[str, Any]]:
            # A statement without RETURNING has no rows to fetch (psycopg would raise).
            res = cur.pgresult
            if res is not None and res.status == ExecStatus.TUPLES_OK:
                fetched: list[dict[str, Any]] = await cur.fetchall()
                return fetched
            return []

        if len(statements) == 1:  # no pipeline to set up for one statement
            ((sql, params),) = statements
            async with self.statement() as cur:
                await cur.execute(sql, params)
                return [await rows(cur)]
        async with self._connection() as conn:
            cursors = []
            async with conn.pipeline():
                for sql, params in statements:
                    cur = conn.cursor(row_factory=dict_row)
                    await cur.execute(sql, params)
                    cursors.append(cur)
            return [await rows(cur) for cur in cursors]

    async def listen(self, channel: str) -> AsyncIterator[str]:
        """The payloads of ``NOTIFY channel``, from a connection of its own, until closed.

        Reconnects after a lost connection (notifications sent meanwhile are missed:
        the cancel signal's poll covers them).
        """
        import psycopg

        while not self.closed:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.conninfo, autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {channel}")
                    while not self.closed:
                        async for note in conn.notifies(timeout=1.0):
                            yield note.payload
            except psycopg.OperationalError:
                logger.debug("cancel listener reconnecting", exc_info=True)
                await asyncio.sleep(0.5)

    async def aclose(self) -> None:
        self.closed = True
        if self._owns and self._pool is not None:
            await self._pool.close()


__all__ = [
    "AsyncBackend",
    "AsyncCursor",
    "AsyncMemoryBackend",
    "AsyncPostgresBackend",
    "AsyncSqliteBackend",
    "atransient_retry",
]

"""The async ledger on PostgreSQL through psycopg 3's async pool or one connection.

The sync ``PostgresBackend``'s statements and connection settings, awaited on the
caller's loop (a write that need not wait for the disk as there, in the same round
trip); ``listen`` follows ``NOTIFY`` on a connection of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from langgraph_cancel.ledger import schema
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.aio_backends import AsyncBackend, AsyncCursor
from langgraph_cancel.ledger.backends import CallersHandle, Dialect
from langgraph_cancel.ledger.dialects import PostgresStatements, json_text
from langgraph_cancel.ledger.flush import commits_before_flush
from langgraph_cancel.ledger.postgres import in_pipeline_mode, ledger_session_kwargs

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

logger = logging.getLogger("langgraph_cancel.ledger")


class AsyncPostgresBackend(PostgresStatements, AsyncBackend):
    """PostgreSQL through psycopg 3's async API: a pool (preferred), one connection, or a URL.

    Open one on a URL with ``await AsyncPostgresBackend.open(url)``; the pool is
    then this backend's own, with the sync backend's connection settings.

    Args:
        conn: An ``AsyncConnectionPool`` or an ``AsyncConnection`` (autocommit).
        conninfo: The connection string (with its password), for side connections.
        owns: Close the pool with the backend.
        follows: For an own pool, the caller's pool or connection it serves beside:
            once the caller has closed that, the backend counts as closed.
        lock: For one connection, the lock its other users take (a saver's), held
            for each statement and transaction so theirs never run inside the
            ledger's; default: a lock of this backend's own. A connection in
            pipeline mode is synced before each use and after it, as the sync
            backend's.
    """

    dialect: Dialect = "postgres"

    def __init__(
        self,
        conn: AsyncConnection[Any] | AsyncConnectionPool[Any],
        *,
        conninfo: str,
        owns: bool = False,
        follows: Any = None,
        lock: AbstractAsyncContextManager[Any] | None = None,
    ) -> None:
        from psycopg_pool import AsyncConnectionPool as _Pool

        # Set by ``aclose``; ``closed`` also reads the caller's pool or connection.
        self._closed = False
        #: The caller's pool or connection a pool of this backend's own serves beside.
        self.follows = follows
        self.conninfo = conninfo
        self.url = conninfo
        self._owns = owns
        self._pool: AsyncConnectionPool[Any] | None = conn if isinstance(conn, _Pool) else None
        self._conn: AsyncConnection[Any] | None = None if isinstance(conn, _Pool) else conn
        # What the caller closes, and this backend with it (nothing, for an own pool
        # serving nobody's).
        used = follows if owns else conn
        self._callers = CallersHandle(used) if used is not None else None
        self._lock = lock if lock is not None else asyncio.Lock()

    @classmethod
    async def open(
        cls, conninfo: str, *, min_size: int = 1, max_size: int = 8, follows: Any = None
    ) -> AsyncPostgresBackend:
        """A backend with a pool of its own on ``conninfo`` (beside ``follows``, the
        caller's pool or connection, if given: closed once that is)."""
        from psycopg_pool import AsyncConnectionPool as _Pool

        pool: AsyncConnectionPool[Any] = _Pool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            # As the sync backend: prepared generic plans, index probes only.
            kwargs=ledger_session_kwargs(),
            open=False,
            name="langgraph-cancel-ledger-async",
        )
        await pool.open()
        return cls(pool, conninfo=conninfo, owns=True, follows=follows)

    @property
    def closed(self) -> bool:
        """Closed by ``aclose``, or the caller's pool or connection it uses was closed
        (``listen`` ends then too)."""
        return self._closed or (self._callers is not None and self._callers.closed)

    @property
    def migrations(self) -> list[list[str]]:
        return schema.POSTGRES_MIGRATIONS

    def json_in(self, value: Any) -> Any:
        if value is None:
            return None
        from psycopg.types.json import Jsonb

        return Jsonb(value, dumps=json_text)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection for one use: from the pool, or the one connection under its lock."""
        pool = self._pool
        if pool is not None:
            # Not pool.connection(): its ``async with conn`` ends a transaction these
            # autocommit statements never open; putconn still discards a broken one.
            conn = await pool.getconn()
            try:
                yield conn
            finally:
                await pool.putconn(conn)
            return
        assert self._conn is not None
        async with self._lock:
            if not in_pipeline_mode(self._conn):
                yield self._conn
                return
            # Synced as the nested block begins and ends, as in the sync backend.
            async with self._conn.pipeline():
                yield self._conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncCursor]:
        from psycopg.rows import dict_row

        async with self._connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            if commits_before_flush():
                await cur.execute(ledger_sql.PG_COMMIT_BEFORE_FLUSH)
            yield cur

    @asynccontextmanager
    async def statement(self) -> AsyncIterator[AsyncCursor]:
        from psycopg.rows import dict_row

        async with self._connection() as conn:
            if commits_before_flush():
                yield AsyncCommitBeforeFlushCursor(conn)
            else:
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
                if commits_before_flush():  # one implicit transaction up to the sync
                    await conn.execute(ledger_sql.PG_COMMIT_BEFORE_FLUSH)
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
        # Closed beside the caller's pool or connection: let the own pool's connections go.
        if self.follows is not None:
            await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        if self._owns and self._pool is not None:
            await self._pool.close()


class AsyncCommitBeforeFlushCursor:
    """``CommitBeforeFlushCursor``, awaited: each statement after
    ``PG_COMMIT_BEFORE_FLUSH`` in one pipeline, one round trip."""

    def __init__(self, conn: AsyncConnection[Any]) -> None:
        from psycopg.rows import dict_row

        self._conn = conn
        self._cursor = conn.cursor(row_factory=dict_row)

    @property
    def pgresult(self) -> Any:
        """The last statement's result (for telling a statement without rows apart)."""
        return self._cursor.pgresult

    async def execute(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        """Run one statement; its rows are read once it has committed."""
        if ledger_sql.PG_SET_COMMIT_BEFORE_FLUSH in sql:  # it makes the setting itself
            await self._cursor.execute(sql, params)
            return self
        async with self._conn.pipeline():
            await self._conn.execute(ledger_sql.PG_COMMIT_BEFORE_FLUSH)
            await self._cursor.execute(sql, params)
        return self

    async def executemany(self, sql: str, params: Sequence[dict[str, Any]]) -> Any:
        """Run one statement over several parameter sets, in one transaction."""
        async with self._conn.pipeline():
            await self._conn.execute(ledger_sql.PG_COMMIT_BEFORE_FLUSH)
            await self._cursor.executemany(sql, params)
        return self

    async def fetchone(self) -> dict[str, Any] | None:
        """The statement's next row."""
        row: dict[str, Any] | None = await self._cursor.fetchone()
        return row

    async def fetchall(self) -> list[dict[str, Any]]:
        """The statement's remaining rows."""
        rows: list[dict[str, Any]] = await self._cursor.fetchall()
        return rows


__all__ = ["AsyncCommitBeforeFlushCursor", "AsyncPostgresBackend"]

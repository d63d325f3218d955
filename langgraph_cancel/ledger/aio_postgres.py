"""The async ledger on PostgreSQL through psycopg 3's async pool or one connection.

The sync ``PostgresBackend``'s statements and connection settings, awaited on the
caller's loop; ``listen`` follows ``NOTIFY`` on a connection of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.aio_backends import AsyncBackend, AsyncCursor
from langgraph_cancel.ledger.backends import Dialect, json_text
from langgraph_cancel.ledger.decisions import CasJob, CasOutcome
from langgraph_cancel.ledger.flush import commits_before_flush
from langgraph_cancel.ledger.postgres import SETUP_LOCK_KEY, ledger_session_kwargs
from langgraph_cancel.ledger.records import effect_record
from langgraph_cancel.types import EffectRecord, NewEffect, utcnow

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

logger = logging.getLogger("langgraph_cancel.ledger")


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
        # As the sync backend's: opened on the first write that may commit before the
        # WAL flush (``langgraph_cancel.ledger.flush``), on a backend that owns its pool.
        self._unflushed: AsyncConnectionPool[Any] | None = None
        self._unflushed_lock = asyncio.Lock()
        self._max_size = self._pool.max_size if self._pool is not None else 1

    @classmethod
    async def open(
        cls, conninfo: str, *, min_size: int = 1, max_size: int = 8
    ) -> AsyncPostgresBackend:
        """A backend with a pool of its own on ``conninfo``."""
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
        pool = await self._pool_for_write()
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

    # ------------------------------------------------- dialect-specific work
    async def lock_for_setup(self, cur: AsyncCursor) -> None:
        await cur.execute(f"SELECT pg_advisory_xact_lock({SETUP_LOCK_KEY})")

    async def announce_cancel(self, cur: AsyncCursor, thread_id: str, run_id: str) -> None:
        await cur.execute(q.NOTIFY_CANCEL, d.cancel_notice(thread_id, run_id))

    async def insert_effect(self, params: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """One autocommit statement; a writable CTE carries the audit row."""
        async with self.statement() as cur:
            await cur.execute(q.PG_INSERT_EFFECT, params)
            row = await cur.fetchone()
            if row is not None:
                return row, True
            await cur.execute(q.SELECT_EFFECT, {"effect_id": params["effect_id"]})
            existing = await cur.fetchone()
            assert existing is not None
            return existing, False

    async def insert_effects(
        self,
        thread_id: str,
        run_id: str,
        unique: dict[str, NewEffect],
        *,
        owner: str | None,
        actor: str,
        read_back: bool,
    ) -> dict[str, tuple[EffectRecord, bool]]:
        """One statement for the whole batch; rows recorded before are read back after it."""
        rows = d.pg_plan_rows(thread_id, run_id, unique)
        params = {
            # One JSON document, not an array per column: psycopg quotes every array
            # element in Python, which cost more than the server's insert.
            "rows": json_text(rows),
            "thread_id": thread_id,
            "run_id": run_id,
            "owner": owner,
            "actor": actor,
            "now": self.ts_in(utcnow()),
        }
        found: dict[str, tuple[EffectRecord, bool]] = {}
        async with self.statement() as cur:
            await cur.execute(q.PG_INSERT_EFFECTS, params)
            if not read_back:
                return found
            for row in await cur.fetchall():
                found[row["tool_call_id"]] = (effect_record(row, self), True)
            missing = [r["effect_id"] for r in rows if r["tool_call_id"] not in found]
            if missing:
                await cur.execute(q.PG_SELECT_EFFECTS_ANY, {"ids": missing})
                for row in await cur.fetchall():
                    found[row["tool_call_id"]] = (effect_record(row, self), False)
        return found

    async def effect_rows(self, effect_ids: list[str]) -> list[dict[str, Any]]:
        async with self.read() as cur:
            await cur.execute(q.PG_SELECT_EFFECTS_ANY, {"ids": effect_ids})
            return await cur.fetchall()

    async def compare_and_set(self, job: CasJob) -> CasOutcome:
        """One autocommit statement; a writable CTE carries the audit row."""
        req, (allowed, guard), token = job
        async with self.statement() as cur:
            await cur.execute(
                *d.cas_statement(q.PG_TRANSITION_EFFECT, req, allowed, guard, token, utcnow(), self)
            )
            row = await cur.fetchone()
            if row is not None:
                return row, None
            await cur.execute(q.SELECT_EFFECT, {"effect_id": req.effect_id})
            return None, await cur.fetchone()

    async def compare_and_set_many(self, jobs: Sequence[CasJob]) -> list[CasOutcome]:
        """The compare-and-sets in one statement, then one read of those that did not apply.

        One statement rather than a pipeline of one per request: psycopg's pipeline
        costs more client CPU than the server spends on the rows.
        """
        if len(jobs) == 1:  # the one-row statement runs faster than a row set
            return [await self.compare_and_set(jobs[0])]
        moved: list[dict[str, Any] | None] = [None] * len(jobs)
        async with self.statement() as cur:
            await cur.execute(
                q.PG_TRANSITION_EFFECTS,
                {
                    "rows": json_text(d.pg_transition_rows(jobs)),
                    "ids": [req.effect_id for req, _, _ in jobs],
                    "now": self.ts_in(utcnow()),
                },
            )
            for row in await cur.fetchall():
                moved[row["n"]] = row
        lost = [req.effect_id for (req, _, _), row in zip(jobs, moved, strict=True) if row is None]
        current = {row["effect_id"]: row for row in await self.effect_rows(lost)} if lost else {}
        return [
            (row, None) if row is not None else (None, current.get(req.effect_id))
            for (req, _, _), row in zip(jobs, moved, strict=True)
        ]

    async def _pool_for_write(self) -> AsyncConnectionPool[Any] | None:
        """The pool for the statement about to run: inside ``commit_before_flush``, the
        one whose sessions commit before the WAL flush, opened on first use (see
        ``PostgresBackend``)."""
        if not (self._owns and commits_before_flush()) or self.closed:
            return self._pool
        async with self._unflushed_lock:
            if self._unflushed is None:
                from psycopg_pool import AsyncConnectionPool as _Pool

                pool: AsyncConnectionPool[Any] = _Pool(
                    self.conninfo,
                    min_size=1,
                    max_size=self._max_size,
                    kwargs=ledger_session_kwargs("-c synchronous_commit=off"),
                    open=False,
                    name="langgraph-cancel-ledger-async-unflushed",
                )
                await pool.open()
                self._unflushed = pool
            return self._unflushed

    async def aclose(self) -> None:
        self.closed = True
        if self._owns and self._pool is not None:
            await self._pool.close()
        unflushed, self._unflushed = self._unflushed, None
        if unflushed is not None:
            await unflushed.close()


__all__ = ["AsyncPostgresBackend"]

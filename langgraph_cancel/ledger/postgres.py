"""The ledger on PostgreSQL through psycopg 3: a pool, one connection, or a URL.

Statements that write an effect carry their audit row in a writable CTE, so each
write is one autocommit statement; batches are one statement over a JSON
document of rows (``dialects.PostgresStatements``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.backends import Backend, Cursor, Dialect
from langgraph_cancel.ledger.dialects import PostgresStatements, json_text
from langgraph_cancel.ledger.flush import commits_before_flush

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg_pool import ConnectionPool


class PostgresBackend(PostgresStatements, Backend):
    """PostgreSQL through psycopg 3: a pool (preferred), one connection, or a URL."""

    dialect: Dialect = "postgres"

    def __init__(
        self,
        conn: str | Connection[Any] | ConnectionPool[Any],
        *,
        min_size: int = 1,
        max_size: int = 8,
    ) -> None:
        from psycopg import Connection as _Connection
        from psycopg_pool import ConnectionPool as _Pool

        self._owns = False
        self.closed = False
        self._lock: threading.RLock | None = None
        self._max_size = max_size
        # Opened on the first write that may commit before the WAL flush (see
        # ``langgraph_cancel.ledger.flush``), on a backend that owns its pool.
        self._unflushed: _Pool[Any] | None = None
        self._unflushed_lock = threading.Lock()
        if isinstance(conn, str):
            self.url = conn
            self._pool: _Pool[Any] | None = _Pool(
                conn,
                min_size=min_size,
                max_size=max_size,
                kwargs=ledger_session_kwargs(),
                open=True,
                name="langgraph-cancel-ledger",
            )
            self._conn: _Connection[Any] | None = None
            self._owns = True
        elif isinstance(conn, _Pool):
            self._pool = conn
            self._conn = None
            self.url = str(conn.conninfo)
        else:
            self._pool = None
            self._conn = conn
            self._lock = threading.RLock()
            self.url = conn.info.dsn
        self.conninfo = full_conninfo(conn)

    @property
    def migrations(self) -> list[list[str]]:
        return ledger_sql.POSTGRES_MIGRATIONS

    def json_in(self, value: Any) -> Any:
        if value is None:
            return None
        from psycopg.types.json import Jsonb

        return Jsonb(value, dumps=json_text)

    @contextmanager
    def transaction(self) -> Iterator[Cursor]:
        from psycopg.rows import dict_row

        pool = self._pool_for_write()
        if pool is not None:
            with pool.connection() as conn, conn.transaction():
                yield conn.cursor(row_factory=dict_row)
            return
        assert self._conn is not None and self._lock is not None
        with self._lock, self._conn.transaction():
            yield self._conn.cursor(row_factory=dict_row)

    @contextmanager
    def statement(self) -> Iterator[Cursor]:
        from psycopg.rows import dict_row

        pool = self._pool_for_write()
        if pool is not None:
            # Not pool.connection(): its ``with conn`` ends a transaction these
            # autocommit statements never open; putconn still discards a broken one.
            conn = pool.getconn()
            try:
                yield conn.cursor(row_factory=dict_row)
            finally:
                pool.putconn(conn)
            return
        assert self._conn is not None and self._lock is not None
        with self._lock:
            yield self._conn.cursor(row_factory=dict_row)

    @contextmanager
    def pipeline(self) -> Iterator[Callable[[str, dict[str, Any]], Cursor]]:
        """Run self-contained statements in one round trip (psycopg pipeline mode).

        Yields ``execute(sql, params) -> cursor``; the cursors' rows can be read
        once the block has exited (the pipeline has synced).
        """
        from psycopg.rows import dict_row

        def run(conn: Any) -> Callable[[str, dict[str, Any]], Cursor]:
            def execute(sql: str, params: dict[str, Any]) -> Cursor:
                cur = conn.cursor(row_factory=dict_row)
                cur.execute(sql, params)
                return cast(Cursor, cur)

            return execute

        pool = self._pool_for_write()
        if pool is not None:
            with pool.connection() as conn, conn.pipeline():
                yield run(conn)
            return
        assert self._conn is not None and self._lock is not None
        with self._lock, self._conn.pipeline():
            yield run(self._conn)

    def all_rows(
        self, statements: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[list[dict[str, Any]]]:
        from psycopg.pq import ExecStatus

        def rows(cur: Any) -> list[dict[str, Any]]:
            # A statement without RETURNING has no rows to fetch (psycopg would raise).
            res = cur.pgresult
            return cur.fetchall() if res is not None and res.status == ExecStatus.TUPLES_OK else []

        if len(statements) == 1:  # no pipeline to set up for one statement
            ((sql, params),) = statements
            with self.statement() as cur:
                cur.execute(sql, params)
                return [rows(cur)]
        with self.pipeline() as execute:
            cursors = [execute(sql, params) for sql, params in statements]
        return [rows(cur) for cur in cursors]

    def _pool_for_write(self) -> ConnectionPool[Any] | None:
        """The pool for the statement about to run: inside ``commit_before_flush``, the
        one whose sessions commit before the WAL flush (``synchronous_commit=off``),
        opened on first use. Only a backend that owns its pool has one; on the
        caller's pool or connection every commit waits as the server says."""
        if not (self._owns and commits_before_flush()) or self.closed:
            return self._pool
        with self._unflushed_lock:
            if self._unflushed is None:
                from psycopg_pool import ConnectionPool as _Pool

                self._unflushed = _Pool(
                    self.url,
                    min_size=1,
                    max_size=self._max_size,
                    kwargs=ledger_session_kwargs("-c synchronous_commit=off"),
                    open=True,
                    name="langgraph-cancel-ledger-unflushed",
                )
            return self._unflushed

    def close(self) -> None:
        self.closed = True
        if self._owns and self._pool is not None:
            self._pool.close()
        with self._unflushed_lock:
            unflushed, self._unflushed = self._unflushed, None
        if unflushed is not None:
            unflushed.close()


def ledger_session_kwargs(more_options: str = "") -> dict[str, Any]:
    """How the ledger's own pools open their sessions, sync and async (``more_options``:
    more ``-c name=value`` settings)."""
    from psycopg.rows import dict_row

    return {
        "autocommit": True,
        "row_factory": dict_row,
        # Every ledger statement is an index probe: prepare it once and keep the
        # generic plan (planning the CTE writes costs more than running them). A
        # generic plan made while a table is still small is a sequential scan, kept
        # as the table grows until the next ANALYZE: no ledger query wants one, so
        # the planner avoids them.
        "prepare_threshold": 0,
        "options": " ".join(
            ("-c plan_cache_mode=force_generic_plan -c enable_seqscan=off", more_options)
        ).strip(),
    }


def full_conninfo(conn: Any) -> str:
    """A connection string including the password, for opening side connections."""
    if isinstance(conn, str):
        return conn
    try:
        from psycopg_pool import ConnectionPool as _Pool

        if isinstance(conn, _Pool):
            return str(conn.conninfo)
    except ImportError:  # pragma: no cover
        pass
    info = conn.info
    dsn: str = info.dsn
    password = getattr(info, "password", None)
    if password and "password=" not in dsn:
        dsn = f"{dsn} password={password}"
    return dsn


__all__ = ["PostgresBackend", "full_conninfo"]

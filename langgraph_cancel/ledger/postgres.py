"""The ledger on PostgreSQL through psycopg 3: a pool, one connection, or a URL.

Statements that write an effect carry their audit row in a writable CTE, so each
write is one autocommit statement; batches are one statement over a JSON
document of rows (``dialects.PostgresStatements``). A write that need not wait for
the disk (``langgraph_cancel.ledger.flush``) turns ``synchronous_commit`` off for its
own transaction, on the same connections as every other: the ledger's hot writes in
their own statement, any other after ``PG_COMMIT_BEFORE_FLUSH`` in one round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, cast

from langgraph_cancel.ledger import schema
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.backends import Backend, CallersHandle, Cursor, Dialect
from langgraph_cancel.ledger.dialects import PostgresStatements, json_text
from langgraph_cancel.ledger.flush import commits_before_flush

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg_pool import ConnectionPool


class PostgresBackend(PostgresStatements, Backend):
    """PostgreSQL through psycopg 3: a pool (preferred), one connection, or a URL.

    Args:
        conn: The caller's ``ConnectionPool`` or ``Connection`` (autocommit), used as
            it is; or a connection string, for a pool of this backend's own.
        min_size: The own pool's least number of connections (0: none until used).
        max_size: The own pool's most connections.
        follows: For an own pool, the caller's pool or connection it serves beside:
            once the caller has closed that, the backend counts as closed.
        lock: For one connection, the lock its other users take (a saver's), held
            for each statement and transaction so theirs never run inside the
            ledger's; default: a lock of this backend's own. A connection in
            pipeline mode (a saver's ``pipe``, given when it was built or set later)
            is synced before each use, so the ledger's transaction takes in none of
            the caller's statements, and after it, so the ledger's writes are
            committed when the use ends.
    """

    dialect: Dialect = "postgres"

    def __init__(
        self,
        conn: str | Connection[Any] | ConnectionPool[Any],
        *,
        min_size: int = 1,
        max_size: int = 8,
        follows: Any = None,
        lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        from psycopg import Connection as _Connection
        from psycopg_pool import ConnectionPool as _Pool

        self._owns = False
        # Set by ``close``; ``closed`` also reads the caller's pool or connection.
        self._closed = False
        #: The caller's pool or connection a pool of this backend's own serves beside.
        self.follows = follows
        self._lock: AbstractContextManager[Any] | None = None
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
            self._lock = lock if lock is not None else threading.RLock()
            self.url = conn.info.dsn
        self.conninfo = full_conninfo(conn)
        # What the caller closes, and this backend with it (nothing, for an own pool
        # serving nobody's).
        used = follows if self._owns else conn
        self._callers = CallersHandle(used) if used is not None else None

    @property
    def closed(self) -> bool:
        """Closed by ``close``, or the caller's pool or connection it uses was closed
        (what runs beside it, the cancel listener, ends then too)."""
        return self._closed or (self._callers is not None and self._callers.closed)

    @property
    def callers(self) -> Any:
        """The caller's pool or connection this backend uses or serves beside (None
        for an own pool serving nobody's): what a pool opened beside it follows."""
        return self._callers.target if self._callers is not None else None

    @property
    def migrations(self) -> list[list[str]]:
        return schema.POSTGRES_MIGRATIONS

    def json_in(self, value: Any) -> Any:
        if value is None:
            return None
        from psycopg.types.json import Jsonb

        return Jsonb(value, dumps=json_text)

    @contextmanager
    def _connection(self) -> Iterator[Connection[Any]]:
        """A connection for one use: from the pool, or the one connection under its lock."""
        if self._pool is not None:
            # Not pool.connection(): its ``with conn`` would end a transaction, and these
            # autocommit statements open none (``transaction`` ends its own); putconn
            # still discards a broken connection.
            conn = self._pool.getconn()
            try:
                yield conn
            finally:
                self._pool.putconn(conn)
            return
        assert self._conn is not None and self._lock is not None
        with self._lock:
            if not in_pipeline_mode(self._conn):
                yield self._conn
                return
            # A nested pipeline block syncs what is pending as it begins and sends a
            # sync of its own as it ends (an error inside stays the one raised).
            with self._conn.pipeline():
                yield self._conn

    @contextmanager
    def transaction(self) -> Iterator[Cursor]:
        from psycopg.rows import dict_row

        with self._connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            if commits_before_flush():
                cur.execute(ledger_sql.PG_COMMIT_BEFORE_FLUSH)
            yield cur

    @contextmanager
    def statement(self) -> Iterator[Cursor]:
        from psycopg.rows import dict_row

        with self._connection() as conn:
            if commits_before_flush():
                yield CommitBeforeFlushCursor(conn)
            else:
                yield conn.cursor(row_factory=dict_row)

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

        with self._connection() as conn, conn.pipeline():
            # One implicit transaction up to the sync: the setting covers its commit.
            if commits_before_flush():
                conn.execute(ledger_sql.PG_COMMIT_BEFORE_FLUSH)
            yield run(conn)

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

    def close(self) -> None:
        self._closed = True
        if self._owns and self._pool is not None:
            self._pool.close()


def in_pipeline_mode(conn: Any) -> bool:
    """Whether the psycopg connection ``conn`` (sync or async) is in pipeline mode."""
    from psycopg import pq

    return bool(conn.pgconn.pipeline_status != pq.PipelineStatus.OFF)


class CommitBeforeFlushCursor:
    """A cursor whose statements commit before their WAL is on disk, each in its own
    implicit transaction: ``PG_COMMIT_BEFORE_FLUSH`` and the statement in one pipeline,
    one round trip (an autocommit session's statement, with that commit's setting)."""

    def __init__(self, conn: Connection[Any]) -> None:
        from psycopg.rows import dict_row

        self._conn = conn
        self._cursor = conn.cursor(row_factory=dict_row)

    @property
    def pgresult(self) -> Any:
        """The last statement's result (for telling a statement without rows apart)."""
        return self._cursor.pgresult

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        """Run one statement; its rows are read once it has committed."""
        if ledger_sql.PG_SET_COMMIT_BEFORE_FLUSH in sql:  # it makes the setting itself
            self._cursor.execute(sql, params)
            return self
        with self._conn.pipeline():
            self._conn.execute(ledger_sql.PG_COMMIT_BEFORE_FLUSH)
            self._cursor.execute(sql, params)
        return self

    def executemany(self, sql: str, params: Sequence[dict[str, Any]]) -> Any:
        """Run one statement over several parameter sets, in one transaction."""
        with self._conn.pipeline():
            self._conn.execute(ledger_sql.PG_COMMIT_BEFORE_FLUSH)
            self._cursor.executemany(sql, params)
        return self

    def fetchone(self) -> dict[str, Any] | None:
        """The statement's next row."""
        row: dict[str, Any] | None = self._cursor.fetchone()
        return row

    def fetchall(self) -> list[dict[str, Any]]:
        """The statement's remaining rows."""
        rows: list[dict[str, Any]] = self._cursor.fetchall()
        return rows


def ledger_session_kwargs() -> dict[str, Any]:
    """How the ledger's own pools open their sessions, sync and async."""
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
        "options": "-c plan_cache_mode=force_generic_plan -c enable_seqscan=off",
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


__all__ = ["CommitBeforeFlushCursor", "PostgresBackend", "full_conninfo"]

"""Database access for the ledger: one transaction at a time, retried when transient.

Two dialects share every statement (see ``sql.py``): SQLite (memory and file)
and PostgreSQL (psycopg 3, a connection, a pool or a connection string).
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast

from tenacity import (
    RetryCallState,
    Retrying,
    before_sleep_log,
    retry,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from langgraph_cancel.errors import TransientDatabaseError
from langgraph_cancel.ledger import sql as q

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg_pool import ConnectionPool

logger = logging.getLogger("langgraph_cancel.ledger")

Dialect = Literal["sqlite", "postgres"]
T = TypeVar("T")


class Cursor(Protocol):
    """The part of a DB-API cursor the ledger uses, with dict rows."""

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> Any: ...
    def executemany(self, sql: str, params: Sequence[dict[str, Any]]) -> Any: ...
    def fetchone(self) -> dict[str, Any] | None: ...
    def fetchall(self) -> list[dict[str, Any]]: ...


def is_transient(exc: BaseException) -> bool:
    """True for faults worth retrying: lost connections, lock and serialization conflicts.

    Integrity errors (a duplicate key, a check constraint) are never transient.
    """
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return "locked" in text or "busy" in text
    try:
        import psycopg
        from psycopg import errors as pge
        from psycopg_pool import PoolClosed, PoolTimeout
    except ImportError:  # pragma: no cover - postgres extra not installed
        return False
    if isinstance(exc, pge.IntegrityError | pge.RaiseException | PoolClosed):
        return False  # PoolClosed: the ledger was closed; waiting will not reopen it
    if isinstance(exc, pge.SerializationFailure | pge.DeadlockDetected | PoolTimeout):
        return True
    return isinstance(exc, psycopg.OperationalError)


def _give_up_after(earlier: int) -> Callable[[RetryCallState], Any]:
    def give_up(state: RetryCallState) -> Any:
        """Out of retries: one typed error, the driver's own as its cause."""
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is None:  # pragma: no cover - tenacity only calls this after a failure
            raise TransientDatabaseError("database unavailable after retries")
        raise raise_transient(exc, earlier + state.attempt_number) from exc

    return give_up


def transient_retry(attempts: int = 6) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Retry a whole transaction on transient faults, with backoff, logged.

    The first attempt is a plain call (the retry machinery costs more than a
    ledger read); tenacity takes over after a transient fault. A fault that
    outlives the retries is raised as ``TransientDatabaseError`` (the driver's
    error is its ``__cause__``); an outer retry does not retry it again. Any
    other error is raised as it is, at once.
    """

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        retrying = retry(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(attempts - 1),
            wait=wait_exponential(multiplier=0.02, min=0.01, max=1.0),
            before_sleep=before_sleep_log(logger, logging.WARNING),
            retry_error_callback=_give_up_after(1),
            reraise=True,
        )(fn)

        @functools.wraps(fn)
        def first_then_retrying(*args: Any, **kwargs: Any) -> T:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                logger.warning("Retrying %s at once as it raised %r.", fn.__qualname__, exc)
            return retrying(*args, **kwargs)

        return first_then_retrying

    return decorate


class Backend:
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


class SqliteBackend(Backend):
    """SQLite: an in-memory database or one file in WAL mode.

    One connection per backend, serialized by a lock; writers across processes
    are serialized by SQLite itself (``BEGIN IMMEDIATE`` plus a busy timeout).
    """

    dialect: Dialect = "sqlite"

    def __init__(self, path: str, *, url: str | None = None, busy_timeout_ms: int = 30_000) -> None:
        self.path = path
        # Each in-memory database is its own world: give it a URL of its own.
        self.url = url or (
            f"sqlite:///{path}" if path != ":memory:" else f"memory://{uuid.uuid4().hex[:12]}"
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
        return q.SQLITE_MIGRATIONS

    def sql(self, statement: str) -> str:
        cached = self._sql_cache.get(statement)
        if cached is None:
            cached = self._sql_cache[statement] = q.to_sqlite(statement)
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


class PostgresBackend(Backend):
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
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool as _Pool

        self._owns = False
        self.closed = False
        self._lock: threading.RLock | None = None
        if isinstance(conn, str):
            self.url = conn
            self._pool: _Pool[Any] | None = _Pool(
                conn,
                min_size=min_size,
                max_size=max_size,
                kwargs={
                    "autocommit": True,
                    "row_factory": dict_row,
                    # Every ledger statement is an index probe: prepare it once and
                    # keep the generic plan (planning the CTE writes costs more than
                    # running them). A generic plan made while a table is still small
                    # is a sequential scan, kept as the table grows until the next
                    # ANALYZE: no ledger query wants one, so the planner avoids them.
                    "prepare_threshold": 0,
                    "options": "-c plan_cache_mode=force_generic_plan -c enable_seqscan=off",
                },
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
        self.conninfo = _full_conninfo(conn)

    @property
    def migrations(self) -> list[list[str]]:
        return q.POSTGRES_MIGRATIONS

    def json_in(self, value: Any) -> Any:
        if value is None:
            return None
        from psycopg.types.json import Jsonb

        return Jsonb(value, dumps=json_text)

    @contextmanager
    def transaction(self) -> Iterator[Cursor]:
        from psycopg.rows import dict_row

        if self._pool is not None:
            with self._pool.connection() as conn, conn.transaction():
                yield conn.cursor(row_factory=dict_row)
            return
        assert self._conn is not None and self._lock is not None
        with self._lock, self._conn.transaction():
            yield self._conn.cursor(row_factory=dict_row)

    @contextmanager
    def statement(self) -> Iterator[Cursor]:
        from psycopg.rows import dict_row

        if self._pool is not None:
            # Not pool.connection(): its ``with conn`` ends a transaction these
            # autocommit statements never open; putconn still discards a broken one.
            conn = self._pool.getconn()
            try:
                yield conn.cursor(row_factory=dict_row)
            finally:
                self._pool.putconn(conn)
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

        if self._pool is not None:
            with self._pool.connection() as conn, conn.pipeline():
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

    def close(self) -> None:
        self.closed = True
        if self._owns and self._pool is not None:
            self._pool.close()


def json_text(value: Any) -> str:
    """JSON for a JSONB column; what JSON cannot hold is kept as its string.

    Bound as text and cast in the statement (``%(rows)s::jsonb``), a document costs
    psycopg less client time than a ``Jsonb`` wrapper does.
    """
    return json.dumps(value, default=str)


def _full_conninfo(conn: Any) -> str:
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


def backend_from_url(url: str) -> Backend:
    """Open the backend a URL names: ``memory://``, ``sqlite:///path``, ``postgresql://...``."""
    from langgraph_cancel.errors import InvalidURLError

    kind, target = parse_url(url)
    if kind == "memory":
        return SqliteBackend(":memory:")
    if kind == "sqlite":
        return SqliteBackend(
            target, url=url if url.startswith("sqlite:///") else f"sqlite:///{url}"
        )
    try:
        return PostgresBackend(target)
    except ImportError as exc:  # pragma: no cover - extra missing
        raise InvalidURLError(
            "PostgreSQL support needs the extra: pip install 'langgraph-cancel[postgres]'"
        ) from exc


def raise_transient(exc: BaseException, attempts: int | None = None) -> TransientDatabaseError:
    """Wrap a fault that outlived its retries."""
    tries = f" ({attempts} attempts)" if attempts else ""
    return TransientDatabaseError(f"database unavailable after retries{tries}: {exc}")

"""``PostgresCancelSaver`` and ``AsyncPostgresCancelSaver``: production, many workers.

Checkpoints (the official ``PostgresSaver`` tables) and the ledger live in the
same database; cancel requests are announced with ``NOTIFY lgc_cancel``.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, nullcontext
from typing import Any, cast

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_cancel.checkpointers.base import LedgerOwner, ThreadedAsyncMixin, close_on_loop
from langgraph_cancel.checkpointers.durable import NotesSavedCheckpoints
from langgraph_cancel.ledger import Ledger, PostgresBackend
from langgraph_cancel.ledger.aio import AsyncLedger, bind_async_twin, unbind_async_twin
from langgraph_cancel.ledger.aio_postgres import AsyncPostgresBackend

#: Advisory lock key serializing checkpoint migrations across workers.
_SETUP_LOCK = 7231900119
_TRY_LOCK = "SELECT pg_try_advisory_lock(%s)"


def _pool_closed_with(saver: object, conn: Any) -> PostgresBackend:
    """A sync ledger pool of the saver's own beside the caller's ``conn`` (an async
    connection or an async pool): opened empty (a connection is made at the ledger's
    first use), and closed with the saver or, once the caller has closed ``conn``, by
    its cancel listener."""
    backend = PostgresBackend(_conninfo(conn), min_size=0, max_size=4, follows=conn)
    weakref.finalize(saver, backend.close)
    return backend


def _unlocked_on_pool(saver: PostgresSaver | AsyncPostgresSaver) -> None:
    """Drop the saver-wide lock around each use of the connection when it is a pool.

    LangGraph's savers take one lock per saver around every checkpoint read and
    write, which a single connection needs. A pool hands each use a connection of
    its own, so there the lock only queues a process's concurrent runs behind one
    another (LangGraph's own ``_cursor`` is the lock's one user). A saver on a pool
    never runs in pipeline mode: LangGraph refuses a pipeline with a pool.
    """
    if isinstance(saver.conn, ConnectionPool | AsyncConnectionPool):
        # nullcontext serves ``with`` and ``async with`` alike, and any number of users.
        saver.lock = cast(Any, nullcontext())


def _conninfo(conn: Any) -> str:
    if isinstance(conn, ConnectionPool | AsyncConnectionPool):
        return str(conn.conninfo)
    info = conn.info
    dsn: str = info.dsn
    password = getattr(info, "password", None)
    if password and "password=" not in dsn:
        dsn = f"{dsn} password={password}"
    return dsn


class PostgresCancelSaver(NotesSavedCheckpoints, ThreadedAsyncMixin, PostgresSaver, LedgerOwner):
    """LangGraph's ``PostgresSaver`` plus the ledger, in the same database.

    Args:
        conn: A psycopg ``Connection`` (autocommit, dict rows) or ``ConnectionPool``.
            On a pool, each checkpoint read or write takes a connection of its own
            and no saver-wide lock, so the runs of one process proceed side by side
            (``PostgresSaver`` queues them behind one lock even on a pool).
        pipe: An optional pipeline (single connection only).
        ledger: The ledger to use; default: one on the same pool or connection (on a
            connection its statements take the saver's lock, as the checkpoints' do;
            with ``pipe``, each use of the connection begins and ends with a sync of
            the pipeline), so the saver holds no session the caller does not.
        serde: Checkpoint serializer.
    """

    def __init__(
        self,
        conn: Connection[Any] | ConnectionPool[Any],
        pipe: Any = None,
        serde: SerializerProtocol | None = None,
        *,
        ledger: Ledger | None = None,
    ) -> None:
        super().__init__(conn, pipe=pipe, serde=serde)
        _unlocked_on_pool(self)
        if ledger is None:
            if isinstance(conn, ConnectionPool):
                backend = PostgresBackend(conn)
            else:
                backend = PostgresBackend(conn, lock=self.lock)
            ledger = Ledger(backend)
        self.ledger = ledger

    @classmethod
    @contextmanager
    def from_conn_string(
        cls, conn_string: str, *, pipeline: bool = False
    ) -> Iterator[PostgresCancelSaver]:
        """Open a saver on a connection string, closing everything at exit.

        Args:
            conn_string: ``postgresql://user@host:port/db``.
            pipeline: Use a psycopg pipeline for checkpoint writes.
        """
        with Connection.connect(
            conn_string, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn:
            ledger = Ledger(PostgresBackend(conn_string, max_size=4))
            try:
                if pipeline:
                    with conn.pipeline() as pipe:
                        yield cls(conn, pipe, ledger=ledger)
                else:
                    yield cls(conn, ledger=ledger)
            finally:
                ledger.close()

    def setup(self) -> None:
        """Run the checkpoint migrations and the ledger migrations (idempotent).

        Safe for many workers starting at once on a fresh database: LangGraph's
        own migrations are not (two concurrent ``CREATE TABLE IF NOT EXISTS``
        collide on ``pg_type``), so they run under an advisory lock.
        """
        with Connection.connect(_conninfo(self.conn), autocommit=True) as lock:
            # Poll, never block: a session waiting inside pg_advisory_lock() holds a
            # snapshot, and the holder's CREATE INDEX CONCURRENTLY would wait for it.
            while True:
                row = lock.execute(_TRY_LOCK, (_SETUP_LOCK,)).fetchone()
                if row is not None and row[0]:
                    break
                time.sleep(0.05)
            super().setup()
        self.setup_ledger()

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and its ledger rows."""
        super().delete_thread(thread_id)
        self.ledger.delete_thread(thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``PostgresSaver.prune``; ``"delete"`` deletes the threads' ledger rows too,
        as ``delete_thread`` does (``"keep_latest"`` keeps them all)."""
        super().prune(thread_ids, strategy=strategy)
        if strategy == "delete":
            for thread_id in thread_ids:
                self.ledger.delete_thread(thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``prune`` in a worker thread, for async graphs, as the other async methods."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


class AsyncPostgresCancelSaver(NotesSavedCheckpoints, AsyncPostgresSaver, LedgerOwner):
    """LangGraph's ``AsyncPostgresSaver`` plus the ledger, in the same database.

    Async graphs on it do their ledger I/O through an ``AsyncLedger`` on their own
    loop, opened by ``setup()`` or ``from_conn_string``: on the caller's
    ``AsyncConnectionPool`` or ``AsyncConnection`` (on a connection under the saver's
    lock, as the checkpoints, syncing a pipeline before and after). A small sync pool
    of its own, empty until used, serves the sync parts of the package; it closes with
    the saver (or at the end of ``from_conn_string``).

    Args:
        conn: A psycopg ``AsyncConnection`` or ``AsyncConnectionPool``. On a pool,
            each checkpoint read or write takes a connection of its own and no
            saver-wide lock, so the runs on one event loop proceed side by side
            (``AsyncPostgresSaver`` queues them behind one lock even on a pool).
        pipe: An optional pipeline (single connection only).
        serde: Checkpoint serializer.
        ledger: The ledger to use; default: one on the same database, as above.
    """

    def __init__(
        self,
        conn: AsyncConnection[Any] | AsyncConnectionPool[Any],
        pipe: Any = None,
        serde: SerializerProtocol | None = None,
        *,
        ledger: Ledger | None = None,
    ) -> None:
        super().__init__(conn, pipe=pipe, serde=serde)
        _unlocked_on_pool(self)
        #: The caller's pool or connection, which the async ledger shares when the
        #: ledger is ours.
        self._shared = conn if ledger is None else None
        self.ledger = ledger if ledger is not None else Ledger(_pool_closed_with(self, conn))
        #: The ledger the graph's loop awaits (opened by ``setup()`` or ``aopen_ledger()``).
        self.async_ledger: AsyncLedger | None = None
        self._ledger_lock = asyncio.Lock()

    async def aopen_ledger(self) -> AsyncLedger:
        """Open the async ledger on this loop (once) and bind it to the sync one.

        On the caller's ``AsyncConnectionPool`` or ``AsyncConnection`` it uses that,
        as the checkpoints do; otherwise it opens connections of its own, closed by
        ``aclose_ledger()`` (``from_conn_string`` calls it) or, at the latest, with
        the saver.
        """
        async with self._ledger_lock:
            if self.async_ledger is None:
                shared = self._shared
                if shared is not None:
                    lock = None if isinstance(shared, AsyncConnectionPool) else self.lock
                    twin = AsyncLedger(
                        AsyncPostgresBackend(shared, conninfo=_conninfo(shared), lock=lock)
                    )
                    twin.url = self.ledger.url
                    await twin.asetup()
                else:
                    twin = await AsyncLedger.twin_of(self.ledger)
                    weakref.finalize(self, close_on_loop, twin, asyncio.get_running_loop())
                # The same database: the sync ledger need not check it again.
                self.ledger.note_set_up()
                bind_async_twin(self.ledger, twin)
                self.async_ledger = twin
            return self.async_ledger

    async def aclose_ledger(self) -> None:
        """Close the async ledger (the sync one is closed by its opener)."""
        twin, self.async_ledger = self.async_ledger, None
        if twin is not None:
            unbind_async_twin(self.ledger, twin)
            await twin.aclose()

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls,
        conn_string: str,
        *,
        pipeline: bool = False,
        serde: SerializerProtocol | None = None,
    ) -> AsyncIterator[AsyncPostgresCancelSaver]:
        """Open a saver on a connection string, closing everything at exit."""
        async with await AsyncConnection.connect(
            conn_string, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn:
            ledger = Ledger(PostgresBackend(conn_string, max_size=4))
            saver: AsyncPostgresCancelSaver | None = None
            try:
                if pipeline:
                    async with conn.pipeline() as pipe:
                        saver = cls(conn, pipe, serde, ledger=ledger)
                        await saver.aopen_ledger()
                        yield saver
                else:
                    saver = cls(conn, serde=serde, ledger=ledger)
                    await saver.aopen_ledger()
                    yield saver
            finally:
                if saver is not None:
                    await saver.aclose_ledger()
                ledger.close()

    async def setup(self) -> None:
        """Run the checkpoint migrations and the ledger migrations (idempotent).

        Serialized across workers with an advisory lock, as ``PostgresCancelSaver.setup``.
        """
        async with await AsyncConnection.connect(_conninfo(self.conn), autocommit=True) as lock:
            while True:
                row = await (await lock.execute(_TRY_LOCK, (_SETUP_LOCK,))).fetchone()
                if row is not None and row[0]:
                    break
                await asyncio.sleep(0.05)
            await super().setup()
        twin = await self.aopen_ledger()
        await twin.asetup()

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and its ledger rows."""
        await super().adelete_thread(thread_id)
        await self._forget_in_ledger(thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``AsyncPostgresSaver.aprune`` (``prune`` calls it too); ``"delete"`` deletes
        the threads' ledger rows too, as ``adelete_thread`` does."""
        await super().aprune(thread_ids, strategy=strategy)
        if strategy == "delete":
            for thread_id in thread_ids:
                await self._forget_in_ledger(thread_id)

    async def _forget_in_ledger(self, thread_id: str) -> None:
        twin = self.async_ledger
        if twin is None and self._shared is not None:
            # A saver nobody set up (LangGraph's tests set up another one on the same
            # connection) deletes on the caller's connection too, not on a pool of its own.
            twin = await self.aopen_ledger()
        if twin is not None and twin.loop is asyncio.get_running_loop():
            await twin.adelete_thread(thread_id)
        else:
            await self.ledger.adelete_thread(thread_id)

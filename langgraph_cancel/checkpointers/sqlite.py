"""``SqliteCancelSaver`` and ``AsyncSqliteCancelSaver``: checkpoints and ledger in one
SQLite file, the embedded default.

The async saver is LangGraph's ``AsyncSqliteSaver`` (aiosqlite) plus the ledger in
the same file: an ``AsyncLedger`` for the graph's own loop, and a sync ``Ledger``
on the same file for the sync parts of the package.
"""

from __future__ import annotations

import asyncio
import sqlite3
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiosqlite
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from langgraph_cancel.checkpointers.base import LedgerOwner, ThreadedAsyncMixin, close_on_loop
from langgraph_cancel.checkpointers.durable import NotesSavedCheckpoints
from langgraph_cancel.errors import ConfigurationError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import AsyncLedger, bind_async_twin, unbind_async_twin
from langgraph_cancel.ledger.backends import enable_wal
from langgraph_cancel.offloop import off_the_loop

DEFAULT_PATH = ".langgraph-cancel.db"


def _main_file(rows: Iterable[Any]) -> str:
    """The main database's file among ``PRAGMA database_list`` rows (``:memory:`` for
    none)."""
    for _seq, name, file in rows:
        if name == "main":
            return str(file) if file else ":memory:"
    return ":memory:"  # pragma: no cover


def _path_of(conn: sqlite3.Connection) -> str:
    return _main_file(conn.execute("PRAGMA database_list").fetchall())


class SqliteCancelSaver(NotesSavedCheckpoints, ThreadedAsyncMixin, SqliteSaver, LedgerOwner):
    """LangGraph's ``SqliteSaver`` plus the ledger, in the same file (WAL mode).

    Works in sync and async graphs (async calls run in a worker thread).
    Several processes may share the file: SQLite serializes their writes.

    Args:
        conn: A ``sqlite3`` connection (``check_same_thread=False``).
        ledger: The ledger to use; default: one on the same file.
        serde: Checkpoint serializer.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        ledger: Ledger | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(conn, serde=serde)
        path = _path_of(conn)
        if path != ":memory:":
            conn.execute("PRAGMA busy_timeout = 30000")
            enable_wal(conn)
            # The ledger's durability, for the checkpoints in the same file: in WAL mode
            # a commit survives the process (kill -9) without a sync of its own, and the
            # file's one log keeps the order of the two kinds of writes whatever a power
            # cut loses (a suffix of it), so a checkpoint a dispatch waited for is never
            # lost while the dispatch's intent is kept.
            conn.execute("PRAGMA synchronous = NORMAL")
        self.path = path
        self.ledger = (
            ledger
            if ledger is not None
            else Ledger.from_url("memory://" if path == ":memory:" else f"sqlite:///{path}")
        )

    @classmethod
    @contextmanager
    def from_conn_string(cls, conn_string: str = DEFAULT_PATH) -> Iterator[SqliteCancelSaver]:
        """Open a saver on a file path (or ``sqlite:///path`` URL), closing it at exit.

        Args:
            conn_string: A path, ``:memory:`` or a ``sqlite:///`` URL.
        """
        path = _strip_scheme(conn_string)
        conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
        try:
            saver = cls(conn)
            try:
                yield saver
            finally:
                saver.ledger.close()
        finally:
            conn.close()

    def setup(self) -> None:
        """Create checkpoint and ledger tables (idempotent)."""
        super().setup()
        self.setup_ledger()

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and its ledger rows."""
        super().delete_thread(thread_id)
        self.ledger.delete_thread(thread_id)

    def __getstate__(self) -> dict[str, Any]:  # pragma: no cover - not picklable
        raise TypeError("SqliteCancelSaver holds open connections and cannot be pickled")


class AsyncSqliteCancelSaver(NotesSavedCheckpoints, AsyncSqliteSaver, LedgerOwner):
    """LangGraph's ``AsyncSqliteSaver`` plus the ledger, in the same file (WAL mode).

    Async graphs on it do their ledger I/O through an ``AsyncLedger`` on their own
    loop (aiosqlite, as the checkpoints), opened by ``setup()`` (which the saver's
    own methods call first, as LangGraph's do). Create it on the loop that will use it.

    Args:
        conn: An aiosqlite connection.
        path: The file ``conn`` opened (``:memory:`` for an in-memory database, whose
            ledger is then in memory too). Without it (and without ``ledger``) the
            saver asks the connection in ``setup()``, since aiosqlite answers only on
            the loop: until then ``ledger`` is not known. A cancellable graph's run sets
            the saver up first, as LangGraph's methods do.
        ledger: The sync ledger to use; default: one on ``path``.
        serde: Checkpoint serializer.
    """

    def __init__(
        self,
        conn: aiosqlite.Connection,
        *,
        path: str | None = None,
        ledger: Ledger | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(conn, serde=serde)
        if ledger is None and path is not None:
            path = _strip_scheme(path)
            ledger = _ledger_on(path)
            # Its tables exist before the saver's first use: a run starts (in the sync
            # ledger) before LangGraph sets the saver up. Migrated off the loop's thread.
            off_the_loop(ledger.setup)
        self.path = path
        #: The sync ledger; None until ``setup()`` has asked the connection for its file.
        self._ledger = ledger
        #: The async ledger on the same database (opened by ``setup()``); the graph's loop
        #: awaits it, except in memory, where the graph's ledger calls go to threads.
        self.async_ledger: AsyncLedger | None = None
        self._ledger_lock = asyncio.Lock()

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls, conn_string: str = DEFAULT_PATH
    ) -> AsyncIterator[AsyncSqliteCancelSaver]:
        """Open a saver on a file path (or ``sqlite:///path`` URL), closing it at exit.

        Args:
            conn_string: A path, ``:memory:`` or a ``sqlite:///`` URL.
        """
        path = _strip_scheme(conn_string)
        async with aiosqlite.connect(path, timeout=30) as conn:
            saver = cls(conn, path=path)
            try:
                yield saver
            finally:
                await saver.aclose_ledger()

    @property
    def ledger(self) -> Ledger:  # type: ignore[override]
        """The sync ledger, on the connection's file.

        Raises:
            ConfigurationError: Built without ``path`` and not set up yet: the file is
                not known until ``setup()`` has asked the connection.
        """
        if self._ledger is None:
            raise ConfigurationError(
                "AsyncSqliteCancelSaver(conn) learns its file in setup(): await "
                "saver.setup() first, or pass path="
            )
        return self._ledger

    async def aprepare_ledger(self) -> None:
        """Set the saver up if its ledger is not known yet (built without ``path``)."""
        if self._ledger is None:
            await self.setup()

    async def setup(self) -> None:
        """Create checkpoint and ledger tables (idempotent); open the async ledger."""
        await super().setup()
        async with self._ledger_lock:
            if self.async_ledger is not None:
                return
            if self._ledger is None:
                self.path = await _file_of(self.conn)
                ledger = _ledger_on(self.path)
                await asyncio.to_thread(ledger.setup)
                self._ledger = ledger
            if self.path not in (None, ":memory:"):
                # As SqliteCancelSaver: the checkpoints' durability is the ledger's.
                await self.conn.execute("PRAGMA busy_timeout = 30000")
                await self.conn.execute("PRAGMA synchronous = NORMAL")
            twin = await AsyncLedger.twin_of(self.ledger)
            # Its connection is the saver's own: it goes with the saver, as the caller's
            # goes with the caller.
            weakref.finalize(self, close_on_loop, twin, asyncio.get_running_loop())
            if twin.loop is not None:
                # An in-memory twin runs its statements on the loop, which a server's
                # blocking-call detector (``langgraph dev``) refuses: the graph's ledger
                # calls go to threads through the sync ledger instead.
                bind_async_twin(self.ledger, twin)
            self.async_ledger = twin

    async def aclose_ledger(self) -> None:
        """Close both ledgers (the connection ``conn`` is the caller's)."""
        twin, self.async_ledger = self.async_ledger, None
        if twin is not None:
            unbind_async_twin(self.ledger, twin)
            await twin.aclose()
        if self._ledger is not None:
            self._ledger.close()

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and its ledger rows."""
        await super().adelete_thread(thread_id)
        await self.setup()
        assert self.async_ledger is not None
        await self.async_ledger.adelete_thread(thread_id)

    def __getstate__(self) -> dict[str, Any]:  # pragma: no cover - not picklable
        raise TypeError("AsyncSqliteCancelSaver holds open connections and cannot be pickled")


def _ledger_on(path: str) -> Ledger:
    """A sync ledger, not set up yet, on the file ``path`` (in memory for ``:memory:``)."""
    return Ledger.from_url("memory://" if path == ":memory:" else f"sqlite:///{path}", setup=False)


async def _file_of(conn: aiosqlite.Connection) -> str:
    """The file an aiosqlite connection opened (``:memory:`` for none)."""
    async with conn.execute("PRAGMA database_list") as cursor:
        return _main_file(await cursor.fetchall())


def _strip_scheme(conn_string: str) -> str:
    """A file path from a path or a ``sqlite:///`` URL."""
    if conn_string.startswith("sqlite:///"):
        return conn_string[len("sqlite:///") :]
    return conn_string

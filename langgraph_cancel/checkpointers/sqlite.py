"""``SqliteCancelSaver``: the embedded default, checkpoints and ledger in one SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.sqlite import SqliteSaver

from langgraph_cancel.checkpointers.base import LedgerOwner, ThreadedAsyncMixin
from langgraph_cancel.checkpointers.durable import NotesSavedCheckpoints
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.backends import enable_wal

DEFAULT_PATH = ".langgraph-cancel.db"


def _path_of(conn: sqlite3.Connection) -> str:
    for _seq, name, file in conn.execute("PRAGMA database_list").fetchall():
        if name == "main":
            return str(file) if file else ":memory:"
    return ":memory:"  # pragma: no cover


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
        path = (
            conn_string[len("sqlite:///") :]
            if conn_string.startswith("sqlite:///")
            else conn_string
        )
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

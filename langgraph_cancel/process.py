"""The package's process-wide state, in one place, each with the reason it is process-wide.

Everything else in the package is per object: a ledger, a run's scope, a batch.
What is here is shared by every run of the process, because what it tracks
belongs to the process, not to one run:

- ``worker_id()``: this process's worker identity (lease owner, effect owner).
  Renewed in a forked child: processes forked from one parent that imported the
  library (Celery prefork, gunicorn ``--preload``, a multiprocessing fork server)
  are different workers, and two workers sharing an identity would share a
  thread's lease.
- ``current_idempotency_key``: the key of the call a tool body runs for. A
  ``ContextVar``, so each call (each task, each thread LangGraph copies the
  context into) sees its own; ``idempotency_key()`` reads it.
- ``CLASSIFIED_TOOLS``: every tool classified with ``effect(...)``, by name: where
  the cancel node, the reconciler, the outbox and the command line find the
  hooks of a tool they did not run themselves.
- ``WARNED_UNCLASSIFIED``: one warning per process for each unclassified tool, not
  one per call or run.
- ``RUNNING_CALLS``: the effects whose call is running in this process. A stopped
  wait does not stop the request, so reconciliation (maybe for another run) must
  not call such a call ``not_applied``.
- ``CALL_THREADS``, ``NODE_THREADS``: threads for calls a sync driver watches and
  for supervised batches, created on first use. Generous (a call given up on
  keeps its thread until it returns) and shared, since a pool per run would leave
  threads behind each run; forgotten in a forked child, whose parent's threads do
  not exist.

The process-wide state that holds the package's own objects is declared beside
their classes, since this layer is below them and cannot import them:

- ``ledgers.LEDGERS_BY_URL``, ``ledgers.LEDGERS_BY_SAVER``: one ledger (one
  connection pool) per database and one per checkpointer, shared by every run that
  uses it; ``ledgers.WARNED_NOT_DURABLE``: one warning per in-memory ledger;
- ``runtime.scope.current_scope``: the run a node or tool of a cancel-aware graph
  works for (a ``ContextVar``); ``runtime.lookup.SCOPES``: the live run of each
  thread, so the nodes of one run and a request to cancel it find the same scope;
- ``runtime.signal.HUB``: every live cancel signal, fed by same-process requests
  and PostgreSQL ``LISTEN`` threads; ``runtime.leases.LEASES``: one daemon thread
  renewing every lease this process holds;
- ``ledger.flush``'s mark that the ledger write under way may commit before its
  WAL is on disk (a ``ContextVar``).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import os
import threading
from typing import TYPE_CHECKING

from langgraph_cancel.workers import new_worker_id

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

# ---------------------------------------------------------- worker identity
_worker_id = new_worker_id()


def worker_id() -> str:
    """This process's worker identity (lease owner, effect owner); renewed after a fork."""
    return _worker_id


def _renew_worker_id() -> None:
    global _worker_id
    _worker_id = new_worker_id()


# ------------------------------------------------------------- context vars
current_idempotency_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "langgraph_cancel_idempotency_key", default=None
)


# --------------------------------------------------------------- registries
CLASSIFIED_TOOLS: dict[str, BaseTool] = {}
WARNED_UNCLASSIFIED: set[str] = set()

# A set's add, discard and ``in`` are atomic, so threads need no lock.
RUNNING_CALLS: set[str] = set()


# ------------------------------------------------------------------- threads
class LazyThreadPool:
    """A thread pool created on first use and forgotten in a forked child.

    Args:
        max_workers: The most threads it runs at once.
        thread_name_prefix: What its threads are called (seen in a thread dump).
    """

    def __init__(self, *, max_workers: int, thread_name_prefix: str) -> None:
        self.max_workers = max_workers
        self.thread_name_prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def get(self) -> concurrent.futures.ThreadPoolExecutor:
        """The pool, created now if this process has none yet."""
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.max_workers, thread_name_prefix=self.thread_name_prefix
                )
            return self._pool

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's threads do not exist here."""
        self._lock = threading.Lock()
        self._pool = None


CALL_THREADS = LazyThreadPool(max_workers=64, thread_name_prefix="langgraph-cancel-call")
NODE_THREADS = LazyThreadPool(max_workers=64, thread_name_prefix="langgraph-cancel-node")


def _after_fork_in_child() -> None:
    _renew_worker_id()
    CALL_THREADS.forget_after_fork()
    NODE_THREADS.forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = [
    "CALL_THREADS",
    "CLASSIFIED_TOOLS",
    "NODE_THREADS",
    "RUNNING_CALLS",
    "WARNED_UNCLASSIFIED",
    "LazyThreadPool",
    "current_idempotency_key",
    "worker_id",
]

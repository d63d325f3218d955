"""Ledger writes whose commit need not wait for the disk.

A PostgreSQL commit waits until its WAL is flushed (``synchronous_commit=on``), so a
run pays one disk flush per ledger write. Only some writes need that wait: an intent
(``dispatched``) must be on disk before its call leaves the process (I1), and so must
anything another party acts on at once. Others are records whose loss the protocol
already survives: the ``planned`` rows written before any call goes out, the
outcome of the last call of a batch, which reconciliation settles when it is missing
(the same window a worker's ``kill -9`` between the call and its outcome opens),
the records of read-only calls (a lost one is read again on resume), a run's start
(nothing leaves on its strength before a commit that waits) and its completion (a
lost one leaves the run live, as a worker that died before writing it does, and the
thread's next input continues it).

Inside :func:`commit_before_flush`, a backend that can lets such a write commit
before its WAL reaches the disk: PostgreSQL's ``synchronous_commit=off`` for that
transaction alone, set in the same round trip (``PG_COMMIT_BEFORE_FLUSH``), on the
ledger's usual connections. The write is never half applied, and it is visible to every other
session as soon as it returns; a crash of the *database server* within a fraction of a
second may lose it, and never only it: WAL is flushed in order, so any later commit
that waited for the disk (the next intent, the step's checkpoint) made it durable
first. A worker that dies loses nothing that returned.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

# Whether the ledger write under way may commit before its WAL is on disk. A
# ``ContextVar``: the protocol marks one ledger call, and the backend, several calls
# below, reads it for that call alone.
_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "langgraph_cancel_commit_before_flush", default=False
)


@contextmanager
def commit_before_flush() -> Iterator[None]:
    """Let the ledger writes of this block commit before their WAL is on disk.

    Only for writes whose loss on a database crash reconciliation settles; never
    around an intent.
    """
    token = _allowed.set(True)
    try:
        yield
    finally:
        _allowed.reset(token)


def commits_before_flush() -> bool:
    """Whether the current block allows commits before the WAL flush."""
    return _allowed.get()


__all__ = ["commit_before_flush", "commits_before_flush"]

"""The effect ledger: runs, effects, their audit trail and worker leases.

Every write is atomic: one transaction, or on PostgreSQL one self-contained
statement in autocommit (a writable CTE carries the audit row). Every
transition is a compare-and-set whose ``WHERE`` clause the database
evaluates; Python only decides which "from" statuses are legal. A write that
loses its connection is retried, and the retry recognises its own earlier
success by a write token (the DBOS pattern: "already recorded by me?" versus
"moved by someone else?").

``Ledger`` is a thin facade: its life cycle (open, migrate, close) and its
cancel listeners are here; the operations are those of its aggregates, each in
its own module, as the async ``AsyncLedger`` has them (``aio_*.py``):

- ``leases.py``: leases on threads and their takeovers;
- ``runs.py``: runs, cancel requests, the one terminal transition;
- ``effects.py``: effect plans and reads;
- ``transitions.py``: compare-and-set transitions and the audit trail.

What differs between SQLite and PostgreSQL is a method of the backend
(``backends.py``, ``postgres.py``).
"""

from __future__ import annotations

from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.backends import Backend, backend_from_url
from langgraph_cancel.ledger.decisions import (
    default_owner,
    derive_effect_id,
    derive_idempotency_key,
)
from langgraph_cancel.ledger.effects import EffectLedger
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.store import CancelListener, to_thread


class Ledger(EffectLedger):
    """The effect ledger on memory, SQLite or PostgreSQL.

    Sync methods, each with an ``a``-prefixed async twin. Create one with
    ``Ledger.from_url(url)`` or get the one a ``*CancelSaver`` owns.

    Args:
        backend: The database to use.
    """

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        self._setup_done = False

    # ------------------------------------------------------------------ life
    @classmethod
    def from_url(cls, url: str, *, setup: bool = True) -> Ledger:
        """Open the ledger a URL names.

        Args:
            url: ``memory://``, ``sqlite:///relative.db``, ``sqlite:////abs/path.db``
                or ``postgresql://user@host:port/db``.
            setup: Run ``setup()`` (idempotent migrations) before returning.

        Raises:
            InvalidURLError: For anything else.
        """
        ledger = cls(backend_from_url(url))
        if setup:
            ledger.setup()
        return ledger

    def setup(self) -> None:
        """Create or migrate the ledger's tables. Safe to call any number of times."""
        if self._setup_done:
            return
        self._setup_once()
        self._setup_done = True

    @transient_retry()
    def _setup_once(self) -> None:
        migrations = self.backend.migrations
        with self.backend.transaction() as cur:
            self.backend.lock_for_setup(cur)
            cur.execute(migrations[0][0])
            cur.execute(q.SELECT_VERSION)
            row = cur.fetchone()
            current = -1 if row is None else next(iter(row.values()))
            current = -1 if current is None else int(current)
            for version, statements in enumerate(migrations):
                if version <= current:
                    continue
                for statement in statements:
                    cur.execute(statement)
                cur.execute(q.INSERT_VERSION, {"v": version})

    def close(self) -> None:
        """Close the connections this ledger opened."""
        self.backend.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_cancel_listener(self, listener: CancelListener) -> None:
        """Call ``listener(thread_id, run_id)`` when this process requests a cancel."""
        self._cancel_listeners.append(listener)

    asetup = to_thread(setup)


__all__ = ["Ledger", "default_owner", "derive_effect_id", "derive_idempotency_key"]

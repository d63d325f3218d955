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
- ``transitions.py``: compare-and-set transitions and the audit trail;
- ``effects.py``: effect plans and reads.

Each drives operations written once for both ledgers (``*_ops.py``, see
``steps.py``); what differs between SQLite and PostgreSQL is an operation of the
backend (``dialects.py``).
"""

from __future__ import annotations

from langgraph_cancel.errors import InvalidURLError
from langgraph_cancel.ledger.backends import Backend, SqliteBackend, parse_url
from langgraph_cancel.ledger.decisions import (
    default_owner,
    derive_effect_id,
    derive_idempotency_key,
)
from langgraph_cancel.ledger.effects import EffectLedger
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.steps import run as drive
from langgraph_cancel.ledger.store import CancelListener, migrate, to_thread


def backend_from_url(url: str) -> Backend:
    """Open the backend a URL names: ``memory://``, ``sqlite:///path``, ``postgresql://...``."""
    kind, target = parse_url(url)
    if kind == "memory":
        return SqliteBackend(":memory:")
    if kind == "sqlite":
        return SqliteBackend(
            target, url=url if url.startswith("sqlite:///") else f"sqlite:///{url}"
        )
    # Imported here: the PostgreSQL backend needs an extra.
    try:
        from langgraph_cancel.ledger.postgres import PostgresBackend

        return PostgresBackend(target)
    except ImportError as exc:  # pragma: no cover - extra missing
        raise InvalidURLError(
            "PostgreSQL support needs the extra: pip install 'langgraph-cancel[postgres]'"
        ) from exc


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

    def note_set_up(self) -> None:
        """Record that the tables exist: set up through another ledger on the same
        database (the async twin), so ``setup()`` has nothing left to do."""
        self._setup_done = True

    @transient_retry()
    def _setup_once(self) -> None:
        drive(self.backend, migrate(self.backend, self.backend.migrations))

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


__all__ = [
    "Ledger",
    "backend_from_url",
    "default_owner",
    "derive_effect_id",
    "derive_idempotency_key",
]

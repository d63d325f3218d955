"""The async effect ledger: ``Ledger``'s twin for event loops, as LangGraph pairs its savers.

``AsyncLedger`` has the sync ledger's ``a*`` methods, each a coroutine with its
real return type, doing its I/O on the caller's loop: psycopg's async pool on
PostgreSQL, aiosqlite on a SQLite file, the shared in-memory database inline.
The operations (``*_ops.py``, written once as generators of database steps,
see ``steps.py``), the statements (``sql.py``), the migrations and every
decision (``decisions.py``) are the sync ledger's own; only the driver differs.
Each aggregate is the twin of a sync one: leases in ``aio_leases.py``, runs and
cancel requests in ``aio_runs.py``, transitions in ``aio_transitions.py``,
effects in ``aio_effects.py``; the connections are ``aio_backends.py``'s and
``aio_postgres.py``'s.

Open one with ``await AsyncLedger.from_url(url)``, or as the twin of a sync
ledger on the same database with ``await AsyncLedger.twin_of(ledger)``. An async
saver binds its twin to its sync ledger (``bind_async_twin``); the async
execution path then asks ``async_twin_of(ledger)`` and awaits the twin, on its
loop, instead of sending the sync ledger's methods to a thread.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any

from langgraph_cancel.errors import (
    InvalidURLError,
    LedgerError,
)
from langgraph_cancel.ledger import decisions
from langgraph_cancel.ledger.aio_backends import (
    AsyncBackend,
    AsyncMemoryBackend,
    AsyncSqliteBackend,
    atransient_retry,
)
from langgraph_cancel.ledger.aio_effects import AsyncEffectLedger
from langgraph_cancel.ledger.aio_postgres import AsyncPostgresBackend
from langgraph_cancel.ledger.backends import SqliteBackend, parse_url
from langgraph_cancel.ledger.core import Ledger
from langgraph_cancel.ledger.postgres import PostgresBackend
from langgraph_cancel.ledger.steps import arun
from langgraph_cancel.ledger.store import CancelListener, migrate


class AsyncLedger(AsyncEffectLedger):
    """The effect ledger on memory, SQLite or PostgreSQL, for event loops.

    Every method is a coroutine with the sync ``Ledger``'s semantics and the
    name of its ``a*`` twin there (``aget_run``, ``atransition``, ...).

    Args:
        backend: The async database to use.
    """

    def __init__(self, backend: AsyncBackend) -> None:
        super().__init__(backend)
        self._setup_done = False
        self._setup_lock = asyncio.Lock()

    # ------------------------------------------------------------------ life
    @classmethod
    async def from_url(cls, url: str, *, setup: bool = True) -> AsyncLedger:
        """Open the async ledger a URL names (as ``Ledger.from_url``).

        ``memory://`` opens a fresh in-memory database of its own.

        Raises:
            InvalidURLError: For an unsupported URL.
        """
        kind, target = parse_url(url)
        if kind == "memory":
            backend: AsyncBackend = AsyncMemoryBackend(SqliteBackend(":memory:"))
        elif kind == "sqlite":
            sqlite_url = url if url.startswith("sqlite:///") else f"sqlite:///{url}"
            backend = await AsyncSqliteBackend.open(target, url=sqlite_url)
        else:
            backend = await AsyncPostgresBackend.open(target)
        ledger = cls(backend)
        if setup:
            await ledger.asetup()
        return ledger

    @classmethod
    async def twin_of(cls, ledger: Ledger, *, setup: bool = True) -> AsyncLedger:
        """An async ledger on the same database as ``ledger``, under the same URL.

        In memory it shares the sync ledger's very database; on a file or a
        server it opens connections of its own there.
        """
        backend_sync = ledger.backend
        if isinstance(backend_sync, SqliteBackend) and backend_sync.path == ":memory:":
            backend: AsyncBackend = AsyncMemoryBackend(backend_sync)
        else:
            backend = await _open_like(backend_sync)
            backend.url = ledger.url
        twin = cls(backend)
        twin.url = ledger.url
        if setup:
            await twin.asetup()
        return twin

    async def asetup(self) -> None:
        """Create or migrate the ledger's tables. Safe to call any number of times."""
        if self._setup_done:
            return
        async with self._setup_lock:
            if not self._setup_done:
                await self._setup_once()
                self._setup_done = True

    @atransient_retry()
    async def _setup_once(self) -> None:
        await arun(self.backend, migrate(self.backend, self.backend.migrations))

    def add_cancel_listener(self, listener: CancelListener) -> None:
        """Call ``listener(thread_id, run_id)`` when this ledger requests a cancel."""
        self._cancel_listeners.append(listener)

    async def aclose(self) -> None:
        """Close the connections this ledger opened."""
        await self.backend.aclose()

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def alisten_cancels(self) -> AsyncIterator[tuple[str, str]]:
        """PostgreSQL: ``(thread_id, run_id)`` of every cancel requested anywhere, as
        announced with ``NOTIFY lgc_cancel``, from a connection on this loop.

        Raises:
            LedgerError: On SQLite and in memory (no notifications there: poll).
        """
        backend = self.backend
        if not isinstance(backend, AsyncPostgresBackend):
            raise LedgerError("cancel notifications need PostgreSQL; poll the run elsewhere")
        async for payload in backend.listen("lgc_cancel"):
            yield decisions.parse_cancel_notice(payload)


async def _open_like(backend: Any) -> AsyncBackend:
    """An async backend on the database of a sync file or server backend."""
    if isinstance(backend, SqliteBackend):
        return await AsyncSqliteBackend.open(backend.path, url=backend.url)
    if isinstance(backend, PostgresBackend):
        # Beside a caller's pool or connection: empty until used, closed with it.
        callers = backend.callers
        return await AsyncPostgresBackend.open(
            backend.conninfo, min_size=0 if callers is not None else 1, max_size=4, follows=callers
        )
    raise InvalidURLError(f"no async backend for {type(backend).__name__}")


_twins: weakref.WeakKeyDictionary[Ledger, AsyncLedger] = weakref.WeakKeyDictionary()
_twins_lock = threading.Lock()


def bind_async_twin(ledger: Ledger, twin: AsyncLedger) -> None:
    """Make ``twin`` (on the same database) the one the async path awaits for ``ledger``."""
    with _twins_lock:
        _twins[ledger] = twin


def unbind_async_twin(ledger: Ledger, twin: AsyncLedger) -> None:
    """Undo ``bind_async_twin`` (no-op if another twin was bound since)."""
    with _twins_lock:
        if _twins.get(ledger) is twin:
            del _twins[ledger]


def async_twin_of(ledger: Ledger) -> AsyncLedger | None:
    """The async ledger bound to ``ledger`` that can be awaited here, if any.

    Only on the twin's own loop (its connections belong to it); an in-memory
    twin, which has no connection of its own, on any loop. None elsewhere, and
    for a ledger without a twin: the caller then uses the sync ledger's
    threaded ``a*`` methods.
    """
    with _twins_lock:
        twin = _twins.get(ledger)
    if twin is None or twin.loop is None:
        return twin
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return twin if twin.loop is running else None


__all__ = ["AsyncLedger", "async_twin_of", "bind_async_twin", "unbind_async_twin"]

"""What every aggregate of the ledger stands on: its backend, listeners and setup.

Each aggregate's operations are written once (``lease_ops.py``, ``run_ops.py``,
``transition_ops.py``, ``effect_ops.py``) as generators of database steps
(``steps.py``); the sync ledger drives them (``leases.py``, ``runs.py``,
``transitions.py``, ``effects.py``, each class built on the one before, on
``LedgerStore``), the async ledger awaits them (the ``aio_*.py`` twins, on
``AsyncLedgerStore``). ``Ledger`` (``core.py``) and ``AsyncLedger`` (``aio.py``)
are the facades.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.backends import Backend
from langgraph_cancel.ledger.dialects import Body, DialectStatements
from langgraph_cancel.ledger.steps import Execute, Operation, Unit, in_order

P = ParamSpec("P")
R = TypeVar("R")

#: Called with ``(thread_id, run_id)`` when this process requests a cancel.
CancelListener = Callable[[str, str], None]


def to_thread(fn: Callable[P, R]) -> Callable[P, Any]:
    """The ``a``-prefixed twin of a sync ledger method: the same call, in a worker thread."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return wrapper


def migrate(backend: DialectStatements, migrations: list[list[str]]) -> Operation[None]:
    """Create or migrate the ledger's tables, in one transaction (for either ledger).

    A ledger already at the latest version is only read, so setting up beside a
    writer in the middle of its transaction does not wait for it.
    """
    found = yield Unit("read", in_order(Execute(backend.has_migrations_sql, None)))
    if found is not None:
        row = yield Unit("read", in_order(Execute(ledger_sql.SELECT_VERSION, None)))
        if _version(row) == len(migrations) - 1:
            return
    yield Unit("transaction", _migrate(backend, migrations))


def _version(row: dict[str, Any] | None) -> int:
    """The version a ``SELECT_VERSION`` row names (-1: none yet)."""
    current = None if row is None else next(iter(row.values()))
    return -1 if current is None else int(current)


def _migrate(backend: DialectStatements, migrations: list[list[str]]) -> Body:
    yield from backend.lock_for_setup()
    yield Execute(migrations[0][0], None, "none")
    current = _version((yield Execute(ledger_sql.SELECT_VERSION, None)))
    for version, statements in enumerate(migrations):
        if version <= current:
            continue
        for statement in statements:
            yield Execute(statement, None, "none")
        yield Execute(ledger_sql.INSERT_VERSION, {"v": version}, "none")


class LedgerStore:
    """The backend and the cancel listeners every aggregate of the sync ledger uses.

    Args:
        backend: The database to use.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.url = backend.url
        self._cancel_listeners: list[CancelListener] = []


__all__ = ["CancelListener", "LedgerStore", "migrate", "to_thread"]

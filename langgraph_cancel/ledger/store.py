"""What every aggregate of the sync ledger stands on: its backend, row decoding, reads.

``Ledger`` (``core.py``) is assembled from the aggregates built on this class:
leases (``leases.py``), runs and cancel requests (``runs.py``), transitions
(``transitions.py``) and effects (``effects.py``), each built on the one before.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from langgraph_cancel.ledger.backends import Backend
from langgraph_cancel.ledger.records import effect_record, lease_record, run_record
from langgraph_cancel.types import EffectRecord, LeaseRecord, RunRecord

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


class LedgerStore:
    """The backend, the cancel listeners, and the row reads every aggregate uses.

    Args:
        backend: The database to use.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.url = backend.url
        self._cancel_listeners: list[CancelListener] = []

    # ------------------------------------------------------------- decoding
    # Rows the ledger wrote itself: records are built without re-validating them.
    def _run(self, row: dict[str, Any]) -> RunRecord:
        return run_record(row, self.backend)

    def _effect(self, row: dict[str, Any]) -> EffectRecord:
        return effect_record(row, self.backend)

    def _lease(self, row: dict[str, Any]) -> LeaseRecord:
        return lease_record(row, self.backend)

    def _one(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        with self.backend.read() as cur:
            cur.execute(sql, params)
            row: dict[str, Any] | None = cur.fetchone()
            return row

    def _all(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self.backend.read() as cur:
            cur.execute(sql, params)
            rows: list[dict[str, Any]] = cur.fetchall()
            return rows


__all__ = ["CancelListener", "LedgerStore", "to_thread"]

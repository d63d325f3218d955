"""What every aggregate of the async ledger stands on: its backend, row decoding, reads.

``AsyncLedger`` (``aio.py``) is assembled from the aggregates built on this class,
each the twin of a sync one: leases (``aio_leases.py``), runs and cancel requests
(``aio_runs.py``), transitions (``aio_transitions.py``) and effects
(``aio_effects.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from langgraph_cancel.ledger.aio_backends import AsyncBackend, AsyncMemoryBackend
from langgraph_cancel.ledger.records import effect_record, lease_record, run_record
from langgraph_cancel.ledger.store import CancelListener
from langgraph_cancel.types import EffectRecord, LeaseRecord, RunRecord


class AsyncLedgerStore:
    """The async backend, its loop, the cancel listeners, and the row reads.

    Args:
        backend: The async database to use.
    """

    def __init__(self, backend: AsyncBackend) -> None:
        self.backend = backend
        self.url = backend.url
        #: The loop the backend's connections belong to (None: any loop, in memory).
        self.loop: asyncio.AbstractEventLoop | None = (
            None if isinstance(backend, AsyncMemoryBackend) else asyncio.get_running_loop()
        )
        self._cancel_listeners: list[CancelListener] = []

    # ------------------------------------------------------------------ reads
    def _run(self, row: dict[str, Any]) -> RunRecord:
        return run_record(row, self.backend)

    def _effect(self, row: dict[str, Any]) -> EffectRecord:
        return effect_record(row, self.backend)

    def _lease(self, row: dict[str, Any]) -> LeaseRecord:
        return lease_record(row, self.backend)

    async def _one(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        async with self.backend.read() as cur:
            await cur.execute(sql, params)
            return await cur.fetchone()

    async def _all(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with self.backend.read() as cur:
            await cur.execute(sql, params)
            return await cur.fetchall()


__all__ = ["AsyncLedgerStore"]

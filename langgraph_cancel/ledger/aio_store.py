"""What every aggregate of the async ledger stands on: its backend, loop and listeners.

``AsyncLedger`` (``aio.py``) is assembled from the aggregates built on this class,
each the twin of a sync one: leases (``aio_leases.py``), runs and cancel requests
(``aio_runs.py``), transitions (``aio_transitions.py``) and effects
(``aio_effects.py``).
"""

from __future__ import annotations

import asyncio

from langgraph_cancel.ledger.aio_backends import AsyncBackend, AsyncMemoryBackend
from langgraph_cancel.ledger.store import CancelListener


class AsyncLedgerStore:
    """The async backend, its loop and the cancel listeners.

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


__all__ = ["AsyncLedgerStore"]

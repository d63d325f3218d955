"""The async ledger's leases: ``leases.py``'s twin, the same operations (``lease_ops.py``)
awaited on the caller's loop."""

from __future__ import annotations

from langgraph_cancel.ledger import lease_ops as ops
from langgraph_cancel.ledger.aio_backends import atransient_retry
from langgraph_cancel.ledger.aio_store import AsyncLedgerStore
from langgraph_cancel.ledger.steps import arun
from langgraph_cancel.types import LeaseRecord, LeaseTakeover


class AsyncLeaseLedger(AsyncLedgerStore):
    """Leases on threads and their takeovers' audit trail, on an async backend."""

    @atransient_retry()
    async def aacquire_lease(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> LeaseRecord:
        """``Ledger.acquire_lease``: claim a thread for ``owner``.

        Raises:
            ThreadBusyError: Another owner holds a live lease.
        """
        return await arun(self.backend, ops.acquire_lease(self.backend, thread_id, owner, ttl))

    @atransient_retry()
    async def abreak_lease(
        self, thread_id: str, owner: str, *, ttl: float = 30.0
    ) -> LeaseRecord | None:
        """``Ledger.break_lease``: take the thread's lease for ``owner`` whoever holds it.

        Returns:
            The lease taken, or None when nobody held one (then nothing was written).
        """
        return await arun(self.backend, ops.break_lease(self.backend, thread_id, owner, ttl))

    @atransient_retry()
    async def alease_takeovers(self, thread_id: str) -> list[LeaseTakeover]:
        """The leases' audit trail for a thread: who took it from whom, why, when."""
        return await arun(self.backend, ops.lease_takeovers(self.backend, thread_id))

    @atransient_retry()
    async def aleases(self) -> list[LeaseRecord]:
        """Every lease, live or expired."""
        return await arun(self.backend, ops.leases(self.backend))

    @atransient_retry()
    async def aheartbeat(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> bool:
        """Extend ``owner``'s lease; False if it no longer holds it."""
        return await arun(self.backend, ops.heartbeat(self.backend, thread_id, owner, ttl))

    @atransient_retry()
    async def arelease_lease(self, thread_id: str, owner: str) -> None:
        """Give the thread back (no-op if ``owner`` does not hold it)."""
        await arun(self.backend, ops.release_lease(thread_id, owner))

    @atransient_retry()
    async def alease(self, thread_id: str) -> LeaseRecord | None:
        """The lease on a thread, live or expired."""
        return await arun(self.backend, ops.lease(self.backend, thread_id))

    @atransient_retry()
    async def aexpired_leases(self) -> list[LeaseRecord]:
        """Leases whose holder stopped heartbeating (a crashed worker)."""
        return await arun(self.backend, ops.expired_leases(self.backend))


__all__ = ["AsyncLeaseLedger"]

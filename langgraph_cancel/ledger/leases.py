"""The sync ledger's leases: which worker holds a thread, and who took it from whom.

Each method drives an operation of ``lease_ops.py`` (written once, shared with
``aio_leases.py``) on the sync backend.
"""

from __future__ import annotations

from langgraph_cancel.ledger import lease_ops as ops
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.steps import run as drive
from langgraph_cancel.ledger.store import LedgerStore, to_thread
from langgraph_cancel.types import LeaseRecord, LeaseTakeover


class LeaseLedger(LedgerStore):
    """Leases on threads and their takeovers' audit trail."""

    @transient_retry()
    def acquire_lease(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> LeaseRecord:
        """Claim a thread for ``owner`` (re-entrant for the same owner).

        A live lease whose holder is a process of this host that no longer runs (see
        ``langgraph_cancel.ledger.workers``) is taken over at once, and the takeover
        is written to the leases' audit trail (``lease_takeovers``).

        Raises:
            ThreadBusyError: Another owner holds a live lease.
        """
        return drive(self.backend, ops.acquire_lease(self.backend, thread_id, owner, ttl))

    @transient_retry()
    def break_lease(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> LeaseRecord | None:
        """Take the thread's lease for ``owner`` whoever holds it (``resume --force``).

        Returns:
            The lease taken, or None when nobody held one (then nothing was written).
        """
        return drive(self.backend, ops.break_lease(self.backend, thread_id, owner, ttl))

    @transient_retry()
    def lease_takeovers(self, thread_id: str) -> list[LeaseTakeover]:
        """The leases' audit trail for a thread: who took it from whom, why, when."""
        return drive(self.backend, ops.lease_takeovers(self.backend, thread_id))

    @transient_retry()
    def leases(self) -> list[LeaseRecord]:
        """Every lease, live or expired."""
        return drive(self.backend, ops.leases(self.backend))

    @transient_retry()
    def heartbeat(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> bool:
        """Extend ``owner``'s lease; False if it no longer holds it."""
        return drive(self.backend, ops.heartbeat(self.backend, thread_id, owner, ttl))

    def expire_lease(self, thread_id: str, owner: str) -> bool:
        """Leave ``owner``'s lease on the thread, expired now: any worker may take it
        over at once, and a sweeper's lease step still finds the thread. False if
        ``owner`` no longer holds it."""
        return self.heartbeat(thread_id, owner, ttl=0.0)

    @transient_retry()
    def release_lease(self, thread_id: str, owner: str) -> None:
        """Give the thread back (no-op if ``owner`` does not hold it)."""
        drive(self.backend, ops.release_lease(thread_id, owner))

    @transient_retry()
    def lease(self, thread_id: str) -> LeaseRecord | None:
        """The lease on a thread, live or expired."""
        return drive(self.backend, ops.lease(self.backend, thread_id))

    @transient_retry()
    def expired_leases(self) -> list[LeaseRecord]:
        """Leases whose holder stopped heartbeating (a crashed worker)."""
        return drive(self.backend, ops.expired_leases(self.backend))

    aacquire_lease = to_thread(acquire_lease)
    aheartbeat = to_thread(heartbeat)
    arelease_lease = to_thread(release_lease)


__all__ = ["LeaseLedger"]

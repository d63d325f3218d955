"""The sync ledger's leases: which worker holds a thread, and who took it from whom."""

from __future__ import annotations

import logging
from datetime import timedelta

from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.records import lease_takeover_record
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.store import LedgerStore, to_thread
from langgraph_cancel.types import LeaseRecord, LeaseTakeover, LeaseTakeoverCause, utcnow
from langgraph_cancel.workers import holder_is_gone

logger = logging.getLogger("langgraph_cancel")


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
        b = self.backend
        params = d.lease_params(thread_id, owner, utcnow(), ttl, b)
        with b.statement() as cur:
            cur.execute(q.ACQUIRE_LEASE, params)
            row = cur.fetchone()
            if row is not None:
                return self._lease(row)
            cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
            held = cur.fetchone()
            if held is None:  # released between our insert and our look
                cur.execute(q.ACQUIRE_LEASE, params)
                taken = cur.fetchone()
                if taken is not None:
                    return self._lease(taken)
                cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
                held = cur.fetchone()
                assert held is not None
        lease = self._lease(held)
        if holder_is_gone(lease.owner):
            took = self._take_over_lease(lease, owner, ttl, LeaseTakeoverCause.HOLDER_GONE)
            if took is not None:
                return took
            return self.acquire_lease(thread_id, owner, ttl=ttl)  # someone else was first
        raise ThreadBusyError(thread_id, lease.owner, lease.expires_at.isoformat())

    def _take_over_lease(
        self, held: LeaseRecord, owner: str, ttl: float, cause: LeaseTakeoverCause
    ) -> LeaseRecord | None:
        """Take ``held`` for ``owner`` if its holder still has it, with the audit row."""
        b = self.backend
        now = utcnow()
        params = d.lease_params(held.thread_id, owner, now, ttl, b)
        with b.transaction() as cur:
            cur.execute(q.TAKE_OVER_LEASE, {**params, "previous_owner": held.owner})
            row = cur.fetchone()
            if row is None:
                return None
            cur.execute(
                q.INSERT_LEASE_TAKEOVER,
                {**params, "previous_owner": held.owner, "cause": cause.value},
            )
        logger.info(
            "took over the lease on thread %s from %s (%s)", held.thread_id, held.owner, cause.value
        )
        return self._lease(row)

    @transient_retry()
    def break_lease(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> LeaseRecord | None:
        """Take the thread's lease for ``owner`` whoever holds it (``resume --force``).

        Returns:
            The lease taken, or None when nobody held one (then nothing was written).
        """
        held = self.lease(thread_id)
        if held is None or held.owner == owner:
            return None
        return self._take_over_lease(held, owner, ttl, LeaseTakeoverCause.FORCED)

    @transient_retry()
    def lease_takeovers(self, thread_id: str) -> list[LeaseTakeover]:
        """The leases' audit trail for a thread: who took it from whom, why, when."""
        rows = self._all(q.SELECT_LEASE_TAKEOVERS, {"thread_id": thread_id})
        return [lease_takeover_record(r, self.backend) for r in rows]

    @transient_retry()
    def leases(self) -> list[LeaseRecord]:
        """Every lease, live or expired."""
        return [self._lease(r) for r in self._all(q.SELECT_LEASES, {})]

    @transient_retry()
    def heartbeat(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> bool:
        """Extend ``owner``'s lease; False if it no longer holds it."""
        b = self.backend
        now = utcnow()
        with b.statement() as cur:
            cur.execute(
                q.HEARTBEAT_LEASE,
                {
                    "thread_id": thread_id,
                    "owner": owner,
                    "now": b.ts_in(now),
                    "expires_at": b.ts_in(now + timedelta(seconds=ttl)),
                },
            )
            cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
            row = cur.fetchone()
        return row is not None and row["owner"] == owner

    @transient_retry()
    def release_lease(self, thread_id: str, owner: str) -> None:
        """Give the thread back (no-op if ``owner`` does not hold it)."""
        with self.backend.statement() as cur:
            cur.execute(q.RELEASE_LEASE, {"thread_id": thread_id, "owner": owner})

    @transient_retry()
    def lease(self, thread_id: str) -> LeaseRecord | None:
        """The lease on a thread, live or expired."""
        row = self._one(q.SELECT_LEASE, {"thread_id": thread_id})
        return None if row is None else self._lease(row)

    @transient_retry()
    def expired_leases(self) -> list[LeaseRecord]:
        """Leases whose holder stopped heartbeating (a crashed worker)."""
        rows = self._all(q.SELECT_EXPIRED_LEASES, {"now": self.backend.ts_in(utcnow())})
        return [self._lease(r) for r in rows]

    aacquire_lease = to_thread(acquire_lease)
    aheartbeat = to_thread(heartbeat)
    arelease_lease = to_thread(release_lease)


__all__ = ["LeaseLedger"]

"""The async ledger's leases: ``leases.py``'s twin, awaited on the caller's loop."""

from __future__ import annotations

from datetime import timedelta

from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.aio_backends import atransient_retry
from langgraph_cancel.ledger.aio_store import AsyncLedgerStore
from langgraph_cancel.ledger.records import lease_takeover_record
from langgraph_cancel.types import LeaseRecord, LeaseTakeover, LeaseTakeoverCause, utcnow
from langgraph_cancel.workers import holder_is_gone


class AsyncLeaseLedger(AsyncLedgerStore):
    """Leases on threads and their takeovers' audit trail, on an async backend."""

    @atransient_retry()
    async def aacquire_lease(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> LeaseRecord:
        """Claim a thread for ``owner`` (re-entrant for the same owner).

        A live lease whose holder is a process of this host that no longer runs is
        taken over at once, with the takeover in the leases' audit trail.

        Raises:
            ThreadBusyError: Another owner holds a live lease.
        """
        b = self.backend
        params = d.lease_params(thread_id, owner, utcnow(), ttl, b)
        async with b.statement() as cur:
            await cur.execute(q.ACQUIRE_LEASE, params)
            row = await cur.fetchone()
            if row is not None:
                return self._lease(row)
            await cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
            held = await cur.fetchone()
            if held is None:  # released between our insert and our look
                await cur.execute(q.ACQUIRE_LEASE, params)
                taken = await cur.fetchone()
                if taken is not None:
                    return self._lease(taken)
                await cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
                held = await cur.fetchone()
                assert held is not None
        lease = self._lease(held)
        if holder_is_gone(lease.owner):
            took = await self._atake_over_lease(lease, owner, ttl, LeaseTakeoverCause.HOLDER_GONE)
            if took is not None:
                return took
            return await self.aacquire_lease(thread_id, owner, ttl=ttl)
        raise ThreadBusyError(thread_id, lease.owner, lease.expires_at.isoformat())

    async def _atake_over_lease(
        self, held: LeaseRecord, owner: str, ttl: float, cause: LeaseTakeoverCause
    ) -> LeaseRecord | None:
        """Take ``held`` for ``owner`` if its holder still has it, with the audit row."""
        b = self.backend
        params = d.lease_params(held.thread_id, owner, utcnow(), ttl, b)
        async with b.transaction() as cur:
            await cur.execute(q.TAKE_OVER_LEASE, {**params, "previous_owner": held.owner})
            row = await cur.fetchone()
            if row is None:
                return None
            await cur.execute(
                q.INSERT_LEASE_TAKEOVER,
                {**params, "previous_owner": held.owner, "cause": cause.value},
            )
        return self._lease(row)

    @atransient_retry()
    async def alease_takeovers(self, thread_id: str) -> list[LeaseTakeover]:
        """The leases' audit trail for a thread: who took it from whom, why, when."""
        rows = await self._all(q.SELECT_LEASE_TAKEOVERS, {"thread_id": thread_id})
        return [lease_takeover_record(r, self.backend) for r in rows]

    @atransient_retry()
    async def aheartbeat(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> bool:
        """Extend ``owner``'s lease; False if it no longer holds it."""
        b = self.backend
        now = utcnow()
        async with b.statement() as cur:
            await cur.execute(
                q.HEARTBEAT_LEASE,
                {
                    "thread_id": thread_id,
                    "owner": owner,
                    "now": b.ts_in(now),
                    "expires_at": b.ts_in(now + timedelta(seconds=ttl)),
                },
            )
            await cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
            row = await cur.fetchone()
        return row is not None and row["owner"] == owner

    @atransient_retry()
    async def arelease_lease(self, thread_id: str, owner: str) -> None:
        """Give the thread back (no-op if ``owner`` does not hold it)."""
        async with self.backend.statement() as cur:
            await cur.execute(q.RELEASE_LEASE, {"thread_id": thread_id, "owner": owner})

    @atransient_retry()
    async def alease(self, thread_id: str) -> LeaseRecord | None:
        """The lease on a thread, live or expired."""
        row = await self._one(q.SELECT_LEASE, {"thread_id": thread_id})
        return None if row is None else self._lease(row)

    @atransient_retry()
    async def aexpired_leases(self) -> list[LeaseRecord]:
        """Leases whose holder stopped heartbeating (a crashed worker)."""
        rows = await self._all(q.SELECT_EXPIRED_LEASES, {"now": self.backend.ts_in(utcnow())})
        return [self._lease(r) for r in rows]

    # ------------------------------------------------------------------ admin


__all__ = ["AsyncLeaseLedger"]

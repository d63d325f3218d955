"""The leases' operations, written once for the sync and the async ledger (see ``steps.py``).

``leases.py`` drives them on a sync backend, ``aio_leases.py`` awaits them.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from datetime import timedelta
from typing import Any

from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.ledger import decisions
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.records import Codec, lease_record, lease_takeover_record
from langgraph_cancel.ledger.steps import Execute, Operation, Step, Unit, in_order, read
from langgraph_cancel.types import LeaseRecord, LeaseTakeover, LeaseTakeoverCause, utcnow
from langgraph_cancel.workers import holder_is_gone

logger = logging.getLogger("langgraph_cancel")


def acquire_lease(codec: Codec, thread_id: str, owner: str, ttl: float) -> Operation[LeaseRecord]:
    """Claim a thread for ``owner``; take it over from a holder that is gone.

    Raises:
        ThreadBusyError: Another owner holds a live lease.
    """
    params = decisions.lease_params(thread_id, owner, utcnow(), ttl, codec)
    taken, row = yield Unit("statement", _claim(thread_id, params))
    lease = lease_record(row, codec)
    if taken:
        return lease
    if holder_is_gone(lease.owner):
        took = yield from take_over_lease(codec, lease, owner, ttl, LeaseTakeoverCause.HOLDER_GONE)
        if took is not None:
            return took
        return (yield from acquire_lease(codec, thread_id, owner, ttl))  # someone else was first
    raise ThreadBusyError(thread_id, lease.owner, lease.expires_at.isoformat())


def _claim(
    thread_id: str, params: dict[str, Any]
) -> Generator[Step, Any, tuple[bool, dict[str, Any]]]:
    """``(True, lease)`` if claimed, else ``(False, the lease someone else holds)``."""
    row = yield Execute(ledger_sql.ACQUIRE_LEASE, params)
    if row is not None:
        return True, row
    held = yield Execute(ledger_sql.SELECT_LEASE, {"thread_id": thread_id})
    if held is None:  # released between our insert and our look
        taken = yield Execute(ledger_sql.ACQUIRE_LEASE, params)
        if taken is not None:
            return True, taken
        held = yield Execute(ledger_sql.SELECT_LEASE, {"thread_id": thread_id})
        assert held is not None
    return False, held


def take_over_lease(
    codec: Codec, held: LeaseRecord, owner: str, ttl: float, cause: LeaseTakeoverCause
) -> Operation[LeaseRecord | None]:
    """Take ``held`` for ``owner`` if its holder still has it, with the audit row."""
    params = decisions.lease_params(held.thread_id, owner, utcnow(), ttl, codec)
    row = yield Unit("transaction", _take_over(params, held.owner, cause))
    if row is None:
        return None
    logger.info(
        "took over the lease on thread %s from %s (%s)", held.thread_id, held.owner, cause.value
    )
    return lease_record(row, codec)


def _take_over(
    params: dict[str, Any], previous: str, cause: LeaseTakeoverCause
) -> Generator[Step, Any, dict[str, Any] | None]:
    row: dict[str, Any] | None = yield Execute(
        ledger_sql.TAKE_OVER_LEASE, {**params, "previous_owner": previous}
    )
    if row is not None:
        yield Execute(
            ledger_sql.INSERT_LEASE_TAKEOVER,
            {**params, "previous_owner": previous, "cause": cause.value},
            "none",
        )
    return row


def break_lease(
    codec: Codec, thread_id: str, owner: str, ttl: float
) -> Operation[LeaseRecord | None]:
    """Take the thread's lease for ``owner`` whoever holds it (None: nobody held one)."""
    held = yield from lease(codec, thread_id)
    if held is None or held.owner == owner:
        return None
    return (yield from take_over_lease(codec, held, owner, ttl, LeaseTakeoverCause.FORCED))


def lease_takeovers(codec: Codec, thread_id: str) -> Operation[list[LeaseTakeover]]:
    """The leases' audit trail for a thread."""
    rows = yield read(ledger_sql.SELECT_LEASE_TAKEOVERS, {"thread_id": thread_id}, "all")
    return [lease_takeover_record(r, codec) for r in rows]


def leases(codec: Codec) -> Operation[list[LeaseRecord]]:
    """Every lease, live or expired."""
    rows = yield read(ledger_sql.SELECT_LEASES, {}, "all")
    return [lease_record(r, codec) for r in rows]


def heartbeat(codec: Codec, thread_id: str, owner: str, ttl: float) -> Operation[bool]:
    """Extend ``owner``'s lease; False if it no longer holds it."""
    now = utcnow()
    extend = {
        "thread_id": thread_id,
        "owner": owner,
        "now": codec.ts_in(now),
        "expires_at": codec.ts_in(now + timedelta(seconds=ttl)),
    }
    row = yield Unit(
        "statement",
        in_order(
            Execute(ledger_sql.HEARTBEAT_LEASE, extend, "none"),
            Execute(ledger_sql.SELECT_LEASE, {"thread_id": thread_id}),
        ),
    )
    return row is not None and row["owner"] == owner


def release_lease(thread_id: str, owner: str) -> Operation[None]:
    """Give the thread back (no-op if ``owner`` does not hold it)."""
    release = Execute(ledger_sql.RELEASE_LEASE, {"thread_id": thread_id, "owner": owner}, "none")
    yield Unit("statement", in_order(release))


def lease(codec: Codec, thread_id: str) -> Operation[LeaseRecord | None]:
    """The lease on a thread, live or expired."""
    row = yield read(ledger_sql.SELECT_LEASE, {"thread_id": thread_id})
    return None if row is None else lease_record(row, codec)


def expired_leases(codec: Codec) -> Operation[list[LeaseRecord]]:
    """Leases whose holder stopped heartbeating."""
    rows = yield read(ledger_sql.SELECT_EXPIRED_LEASES, {"now": codec.ts_in(utcnow())}, "all")
    return [lease_record(r, codec) for r in rows]

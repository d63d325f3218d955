"""The thread's lease, held while a run that has none of its own has calls in flight.

An ``add_cancellation`` graph holds its thread's lease for the whole invocation
(``langgraph_cancel.lifecycle``). A ``create_agent`` agent with ``EffectMiddleware``,
or an ``EffectToolNode`` in a graph without ``add_cancellation``, sees its calls but
not the invocation's end, so it holds none. A sweeper or an operator's ``reconcile``
then took a call in flight for one a dead worker left behind: it settled the call
through the tool's reconcile hook (``not_applied`` while the provider had not seen
the request yet) or recorded it ``unknown``, and the worker's own outcome, arriving
next, was refused as moved by another writer.

So such a run takes the thread's lease before its calls write their intents and lets
it go once their outcomes are recorded, renewed meanwhile by the process's lease
keeper; ``EffectMiddleware`` holds it over each model call too (a stop asked for
while the model thinks is then the live worker's to finish, not a sweeper's). A
sweeper leaves a leased thread alone; a worker that dies mid-call leaves the lease to
be taken over at once on its own host (its holder is gone) or once it expires
elsewhere, and the sweeper then settles the call. The calls of one thread in one
process share one lease (the first takes it, the last lets it go); a lease the owner
already held (a ``resume`` or a sweeper running the agent as that owner) is renewed
while the calls run and left to its holder.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from langchain_core.runnables import RunnableConfig
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.execution.drive import despite_cancel, see_through
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.flush import commit_before_flush
from langgraph_cancel.offloop import off_the_loop
from langgraph_cancel.runtime import RunScope, invocation_scope
from langgraph_cancel.runtime.config import CONFIG_KEY_WORKER
from langgraph_cancel.runtime.leases import LEASES
from langgraph_cancel.types import LeaseRecord

logger = logging.getLogger("langgraph_cancel")

#: Seconds of a call lease (renewed by the lease keeper while calls are in flight).
CALL_LEASE_TTL = 30.0
#: Seconds a call waits for a lease another owner holds (a sweeper settling the
#: thread, another worker's calls) before it is refused with ``ThreadBusyError``:
#: longer than a lease's TTL, so that a dead worker's lease on another host lapses
#: within the wait.
CALL_LEASE_WAIT = 35.0


_Key = tuple[int, str, str]


@dataclass(slots=True)
class _Lease:
    """One thread's lease while this process has calls on it in flight or waiting."""

    #: Serialises the first call's acquire and the last call's release.
    gate: threading.Lock = field(default_factory=threading.Lock)
    #: Calls that entered or are entering; the entry goes at 0 (``CallLeases._lock``).
    users: int = 0
    #: Calls holding the lease; it goes back at 0 (under ``gate``).
    calls: int = 0
    #: The lease keeper's handle while the lease is held (under ``gate``).
    renewal: int | None = None
    #: True when the first call took the lease; False when its owner already held it
    #: (then its holder lets it go, not the calls).
    taken: bool = False


class CallLeases:
    """The leases this process holds for runs without an invocation lease."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        # Per (ledger, thread, owner).
        self._leases: dict[_Key, _Lease] = {}

    @contextmanager
    def holding(
        self, scope: RunScope, owner: str | None, *, wait: float | None = None
    ) -> Iterator[None]:
        """Hold ``owner``'s lease on the scope's thread for the block.

        Args:
            scope: The run whose thread to lease.
            owner: The lease's owner (``call_lease_owner``); None: the run needs no
                call lease, and the block runs holding nothing.
            wait: Seconds to wait for another owner's live lease (default
                ``CALL_LEASE_WAIT``).

        Raises:
            ThreadBusyError: Another owner held a live lease for ``wait`` seconds.
        """
        if owner is None:
            yield
            return
        # Sync code may run on an event loop's thread: the I/O goes off it.
        key, lease = off_the_loop(self._enter, scope.ledger, scope.thread_id, owner, wait)
        try:
            yield
        finally:
            off_the_loop(self._leave, scope.ledger, key, lease)

    @asynccontextmanager
    async def aholding(
        self, scope: RunScope, owner: str | None, *, wait: float | None = None
    ) -> AsyncIterator[None]:
        """``holding`` on an event loop: the lease's I/O off the loop, run to its end
        even when the task is cancelled meanwhile (a lease taken is always let go)."""
        if owner is None:
            yield
            return
        ledger = scope.ledger
        entered, cancelled = await see_through(
            asyncio.to_thread(self._enter, ledger, scope.thread_id, owner, wait)
        )
        if cancelled and entered.exception() is not None:
            raise asyncio.CancelledError from entered.exception()
        key, lease = entered.result()
        try:
            if cancelled:
                raise asyncio.CancelledError
            yield
        finally:
            await despite_cancel(asyncio.to_thread(self._leave, ledger, key, lease))

    def held(self) -> int:
        """How many threads this process holds a call lease on."""
        with self._lock:
            return sum(1 for lease in self._leases.values() if lease.renewal is not None)

    def _enter(
        self, ledger: Ledger, thread_id: str, owner: str, wait: float | None
    ) -> tuple[_Key, _Lease]:
        key = (id(ledger), thread_id, owner)
        with self._lock:
            lease = self._leases.setdefault(key, _Lease())
            lease.users += 1
        try:
            with lease.gate:
                if lease.calls == 0:
                    record = _acquire(ledger, thread_id, owner, wait)
                    # A fresh lease starts at its first heartbeat; an older start means
                    # the owner held it already.
                    lease.taken = record.acquired_at == record.heartbeat_at
                    lease.renewal = LEASES.hold(ledger, thread_id, owner, ttl=CALL_LEASE_TTL)
                lease.calls += 1
        except BaseException:
            self._forget(key, lease)
            raise
        return key, lease

    def _leave(self, ledger: Ledger, key: _Key, lease: _Lease) -> None:
        try:
            with lease.gate:
                lease.calls -= 1
                if lease.calls or lease.renewal is None:
                    return
                LEASES.let_go(lease.renewal)
                lease.renewal = None
                if not lease.taken:
                    return
                _, thread_id, owner = key
                try:
                    # Its commit need not wait for the disk: a release lost in a crash
                    # of the server leaves a lease nobody renews, which expires.
                    with commit_before_flush():
                        ledger.release_lease(thread_id, owner)
                except Exception:
                    # Not renewed any more, it lapses within its TTL.
                    logger.warning(
                        "could not release the call lease on %s", thread_id, exc_info=True
                    )
        finally:
            self._forget(key, lease)

    def _forget(self, key: _Key, lease: _Lease) -> None:
        with self._lock:
            lease.users -= 1
            if lease.users == 0 and self._leases.get(key) is lease:
                del self._leases[key]


def _acquire(ledger: Ledger, thread_id: str, owner: str, wait: float | None) -> LeaseRecord:
    """The lease, waited for while another owner holds it live."""
    for attempt in Retrying(
        retry=retry_if_exception_type(ThreadBusyError),
        stop=stop_after_delay(CALL_LEASE_WAIT if wait is None else wait),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        reraise=True,
    ):
        with attempt:
            return ledger.acquire_lease(thread_id, owner, ttl=CALL_LEASE_TTL)
    raise AssertionError("unreachable: tenacity reraises the last ThreadBusyError")


def call_lease_owner(scope: RunScope, config: RunnableConfig | None) -> str | None:
    """The owner whose lease a call of ``scope`` holds; None when it needs none: the
    invocation holds the lease (an ``add_cancellation`` graph), or the run has no
    thread another process could reach."""
    if scope.ephemeral or invocation_scope(config, scope.ledger) is scope:
        return None
    conf = (config or {}).get("configurable") or {}
    return str(conf.get(CONFIG_KEY_WORKER) or scope.owner)


#: The process's call leases.
CALL_LEASES = CallLeases()
# A forked child holds none of its parent's leases (and has a new identity).
os.register_at_fork(after_in_child=CALL_LEASES._reset)


__all__ = ["CALL_LEASES", "CALL_LEASE_TTL", "CALL_LEASE_WAIT", "CallLeases", "call_lease_owner"]

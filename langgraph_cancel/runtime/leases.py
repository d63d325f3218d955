"""The lease heartbeat: one daemon thread renews every lease this process holds.

A running invocation holds its thread's lease so that no other worker runs the
thread meanwhile and a sweeper can tell a live run from one whose worker died.
Renewing is the keeper's job, off the run's own threads and event loops.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass

from langgraph_cancel.ledger import Ledger

logger = logging.getLogger("langgraph_cancel")


@dataclass(slots=True)
class HeldLease:
    """One lease the keeper renews, and when it is next due (monotonic seconds)."""

    ledger: Ledger
    thread_id: str
    owner: str
    ttl: float
    due: float


class LeaseKeeper:
    """Renews every lease this process holds, from one daemon thread.

    Each lease is renewed every third of its time to live. A renewal that fails
    is logged and tried again a third of a TTL later, so a lease lapses only
    when renewals keep failing for its whole TTL (then another worker may take
    the thread over, as after a crash).
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._held: dict[int, HeldLease] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def hold(self, ledger: Ledger, thread_id: str, owner: str, *, ttl: float) -> int:
        """Keep renewing ``owner``'s lease on ``thread_id`` until ``let_go``; returns a handle."""
        with self._lock:
            handle = next(self._ids)
            self._held[handle] = HeldLease(
                ledger, thread_id, owner, ttl, time.monotonic() + ttl / 3
            )
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._renew_forever, name="langgraph-cancel-leases", daemon=True
                )
                self._thread.start()
            self._changed.notify()
            return handle

    def let_go(self, handle: int) -> None:
        """Stop renewing a lease (releasing it is the caller's own write)."""
        with self._lock:
            self._held.pop(handle, None)

    def held(self) -> int:
        """How many leases are being renewed."""
        with self._lock:
            return len(self._held)

    def _renew_forever(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                due = [(handle, lease) for handle, lease in self._held.items() if lease.due <= now]
                if not due:
                    soonest = min((lease.due for lease in self._held.values()), default=None)
                    self._changed.wait(None if soonest is None else soonest - now)
                    continue
                for _, lease in due:
                    lease.due = now + lease.ttl / 3
            for handle, lease in due:
                with self._lock:
                    if handle not in self._held:
                        continue  # let go meanwhile: its run is ending
                try:
                    lease.ledger.heartbeat(lease.thread_id, lease.owner, ttl=lease.ttl)
                except Exception:
                    logger.warning("lease heartbeat failed for %s", lease.thread_id, exc_info=True)


#: The process's lease keeper: each invocation holds its run's lease through it (see
#: ``langgraph_cancel.process``).
LEASES = LeaseKeeper()
os.register_at_fork(after_in_child=LEASES._reset)  # the parent's thread is not ours


__all__ = ["LEASES", "HeldLease", "LeaseKeeper"]

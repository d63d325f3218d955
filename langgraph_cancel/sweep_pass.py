"""One sweeper pass's work in progress, and the sweeper's hold on a thread's lease
(``langgraph_cancel.sweeper``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.sweep_summary import SweepAction, SweepActionKind

logger = logging.getLogger("langgraph_cancel.sweeper")


@dataclass
class SweepPass:
    """The work of one pass, while it runs."""

    #: At most this many threads are worked on in the pass.
    budget: int
    #: What the pass did or left, in order.
    actions: list[SweepAction] = field(default_factory=list)
    #: The threads worked on so far; never more than ``budget``.
    threads: set[str] = field(default_factory=set)
    #: Whether a thread was left for the next pass because the budget was spent.
    truncated: bool = False
    #: Threads whose lease the pass keeps (expired) rather than releases: their close
    #: failed, or the pass failed between a stop's finish and the thread's close. A
    #: later pass's lease step closes them; released, no pass would find them.
    kept: set[str] = field(default_factory=set)

    def claim(self, thread_id: str) -> bool:
        """Count ``thread_id`` against the pass's budget; False when it is spent."""
        if thread_id in self.threads:
            return True
        if len(self.threads) >= self.budget:
            self.truncated = True
            return False
        self.threads.add(thread_id)
        return True


@dataclass(frozen=True, slots=True)
class SweepLeases:
    """The sweeper's leases on the threads it works on.

    Attributes:
        ledger: The ledger holding the leases.
        owner: The worker identity the sweeper acts as.
        ttl: How long the sweeper's lease on a thread lasts, in seconds.
    """

    ledger: Ledger
    owner: str
    ttl: float

    def leased(self, thread_id: str) -> bool:
        """Whether a lease is on the thread, live or expired: the steps that take a
        thread's lease and give it back when done leave such a thread alone.

        A live lease's worker is awaiting the thread's calls. An expired one is the
        lease step's (first in the next pass), which closes a cancelled run's open
        thread before letting the lease go: taken over and released by another step,
        with the thread still open, nothing would bring it back.
        """
        return self.ledger.lease(thread_id) is not None

    @contextlib.contextmanager
    def holding(self, thread_id: str, work: SweepPass) -> Iterator[bool]:
        """Hold the thread's lease for the block (yields False, recorded busy, if taken).

        Released after it; a lease the pass keeps (``SweepPass.kept``) stays on the
        thread instead, expired at once: the lease step of the next pass comes back to
        the thread, and a worker given the thread meanwhile takes it over rather than
        waiting for a sweeper whose close failed.
        """
        try:
            self.ledger.acquire_lease(thread_id, self.owner, ttl=self.ttl)
        except ThreadBusyError as exc:
            work.actions.append(busy(thread_id, exc.owner))
            yield False
            return
        try:
            yield True
        finally:
            if thread_id in work.kept:
                self._expire(thread_id)
            else:
                self.ledger.release_lease(thread_id, self.owner)

    def _expire(self, thread_id: str) -> None:
        try:
            self.ledger.expire_lease(thread_id, self.owner)
        except Exception:
            # The database is gone, as it often is when a lease is kept: the lease
            # expires after its TTL all the same.
            logger.warning("could not expire the kept lease on thread %s", thread_id)


def busy(thread_id: str, holder: str) -> SweepAction:
    """The action of a thread another worker holds."""
    return SweepAction(
        SweepActionKind.BUSY,
        thread_id,
        f"held by {holder}",
        next_action=f"{holder} is working on it; its lease says when it expires",
    )


__all__ = ["SweepLeases", "SweepPass", "busy"]

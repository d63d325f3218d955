"""A sync graph's side effects, run in a worker thread that the node's thread supervises.

In a sync graph ``EffectToolNode`` dispatches side effects one at a time. Sending each
call to a thread pool, so that the node's thread could stop waiting for it when a
cancelled run's grace ends, costs two thread wake-ups and two hand-overs of the GIL
per call: measured here, a quarter of everything the node adds to a side-effecting
call on PostgreSQL. Instead the batch's side effects run in one worker thread, each
call in that thread, and the node's thread supervises it: it waits for the batch
and, while a call is in flight, watches the cancel signal. When a cancelled run's
call outlives its grace, the supervisor gives up on it (the call keeps running in
the worker, and its outcome is kept when it comes back) and finishes the batch
itself.

The worker learns of a give-up only when its call returns; from then on it stops
(``BatchSuperseded``) before anything else leaves the process. The supervisor's own
failure (``KeyboardInterrupt`` while it waits) stops the worker the same way, at
its next dispatch, after the call in flight has been recorded.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from langgraph_cancel.errors import BatchSuperseded
from langgraph_cancel.process import NODE_THREADS
from langgraph_cancel.runtime import RunScope
from langgraph_cancel.types import EffectRecord

T = TypeVar("T")

#: How often the supervisor looks at the cancel signal while a call is in flight.
POLL_SECONDS = 0.05


@dataclass(frozen=True, slots=True, eq=False)
class InFlight:
    """A call the worker is running, and what the supervisor needs to give up on it.

    Attributes:
        scope: The run the call belongs to (its cancel signal is watched).
        grace: Seconds the call may still take once the run is cancelled
            (``None``: until it returns).
        give_up: Records the call as unknown; the supervisor runs it once it has
            stopped waiting.
        record: The call's ledger record, as dispatched (streamed while a stop
            waits for it).
    """

    scope: RunScope
    grace: float | None
    give_up: Callable[[], object]
    record: EffectRecord | None = None


class Supervisor:
    """What the node's thread and its worker share about the call in flight."""

    __slots__ = ("_call", "_given_up", "_lock", "scope", "stopped")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._call: InFlight | None = None
        self._given_up: InFlight | None = None
        self.stopped = False
        #: The batch's run, once the worker has found it.
        self.scope: RunScope | None = None

    def check(self) -> None:
        """Before a dispatch: raise ``BatchSuperseded`` once the supervisor has stopped."""
        if self.stopped:
            raise BatchSuperseded("the tool node's batch was taken over by its caller")

    def begin(self, call: InFlight) -> None:
        """The worker is about to run ``call`` (its intent is durable)."""
        with self._lock:
            self.check()
            self._call = call

    def end(self, call: InFlight) -> bool:
        """``call`` returned; True when the supervisor gave up on it meanwhile."""
        with self._lock:
            self._call = None
            return self._given_up is call

    def in_flight(self) -> InFlight | None:
        """The call the worker is running, if any."""
        return self._call

    def give_up(self, call: InFlight) -> bool:
        """Stop waiting for ``call``; False when it has returned already."""
        with self._lock:
            if self._call is not call:
                return False
            self._given_up = call
            self.stopped = True
            return True

    def stop(self) -> None:
        """The supervisor is gone: the worker dispatches nothing more."""
        with self._lock:
            self.stopped = True


def supervise(
    work: Callable[[], T],
    take_over: Callable[[InFlight], T],
    supervisor: Supervisor,
    *,
    poll: float = POLL_SECONDS,
) -> T:
    """Run ``work`` in a worker thread under ``supervisor`` and wait for it.

    Args:
        work: The batch's side effects; they tell ``supervisor`` of each call.
        take_over: Called in this thread once the supervisor has given up on a
            call (after ``InFlight.give_up``); its answer is the batch's.
        poll: Seconds between two looks at the cancel signal.

    Returns:
        What ``work`` (or ``take_over``) returned.
    """
    sup = supervisor
    future = NODE_THREADS.get().submit(contextvars.copy_context().run, work)
    watched: InFlight | None = None
    deadline: float | None = None
    try:
        while True:
            # wait(), not result(timeout): the batch may raise TimeoutError itself.
            concurrent.futures.wait((future,), timeout=poll)
            if future.done():
                return future.result()
            call = sup.in_flight()
            if call is not watched:
                watched, deadline = call, None
            if call is None:
                continue  # between two calls the worker checks the signal itself
            if deadline is None and call.scope.cancel_called():
                call.scope.signal.observe()
                if call.record is not None:
                    call.scope.await_effect(call.record, call.grace)
                deadline = time.monotonic() + (math.inf if call.grace is None else call.grace)
            if deadline is not None and time.monotonic() >= deadline and sup.give_up(call):
                call.give_up()
                return take_over(call)
    except BaseException:
        sup.stop()
        raise


__all__ = ["InFlight", "Supervisor", "supervise"]

"""A run's cancel signal: level-triggered, cheap to check, fed by every source of a stop.

The signal is level-triggered (trio): once a run is cancel-requested it stays
so, and the first reason wins (the ledger keeps it). A check is cheap: an
in-process flag, set at once by ``request_cancel`` in the same process, by a
PostgreSQL ``LISTEN`` thread, or by a throttled poll of the run row. The hub
keeps every live signal of the process and wires those sources to it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import async_twin_of
from langgraph_cancel.progress import announce_observed
from langgraph_cancel.types import RunRecord

logger = logging.getLogger("langgraph_cancel")


class CancelSignal:
    """Whether a run has been asked to stop, answered cheaply and often.

    Args:
        ledger: The ledger holding the run row.
        run_id: The run.
        poll_interval: Seconds between reads of the run row (0: every check).
    """

    def __init__(self, ledger: Ledger, run_id: str, *, poll_interval: float) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.poll_interval = poll_interval
        self._event = threading.Event()
        #: When this process first saw the signal up (epoch seconds), else None.
        self.raised_at: float | None = None
        self._last_poll = 0.0
        self._observed = False
        self._lock = threading.Lock()
        #: The run's limits, checked with the signal: True once one was breached (a
        #: breach requests cancel, which raises the signal). Blocking.
        self.limit_check: Callable[[], bool] | None = None

    def set(self) -> None:
        """Mark the signal up (from a listener or a same-process request)."""
        if self.raised_at is None:
            self.raised_at = time.time()
        self._event.set()

    def saw(self, run: RunRecord) -> None:
        """The run row was just read: count it as this interval's poll."""
        if run.cancel_requested or run.terminal:
            self.set()
        else:
            self._last_poll = time.monotonic()

    @property
    def cancel_called(self) -> bool:
        """True once cancellation was requested (may poll the database)."""
        if self._event.is_set():
            return True
        limit_check = self.limit_check
        if limit_check is not None and limit_check():
            return True
        return self._claim_poll() and self._poll()

    async def acancel_called(self) -> bool:
        """``cancel_called`` for event loops: the flag inline; a due poll through the
        ledger's async twin on this loop, else in a thread."""
        if self._event.is_set():
            return True
        limit_check = self.limit_check
        if limit_check is not None and await asyncio.to_thread(limit_check):
            return True
        if not self._claim_poll():
            return False
        native = async_twin_of(self.ledger)
        if native is None:
            return await asyncio.to_thread(self._poll)
        try:
            run = await native.aget_run(self.run_id)
        except Exception:  # a lost database must not crash a check; the DB guard holds
            logger.warning("cancel poll failed for run %s", self.run_id, exc_info=True)
            return False
        return self._polled(run)

    def _claim_poll(self) -> bool:
        """Whether a poll is due; the caller that gets True makes it.

        Claimed before the read, so the calls of a whole batch arriving together
        cost one read per interval, not one each.
        """
        now = time.monotonic()
        with self._lock:
            if now - self._last_poll < self.poll_interval:
                return False
            self._last_poll = now
            return True

    def _poll(self) -> bool:
        try:
            run = self.ledger.get_run(self.run_id)
        except Exception:  # a lost database must not crash a check; the DB guard holds
            logger.warning("cancel poll failed for run %s", self.run_id, exc_info=True)
            return False
        return self._polled(run)

    def _polled(self, run: RunRecord) -> bool:
        if run.cancel_requested:
            self.set()
            return True
        return False

    def observe(self) -> RunRecord | None:
        """Record, once, that the run saw its signal (``cancel_requested -> cancelling``)."""
        if not self._claim_observe():
            return None
        return self._observed_run(self.ledger.mark_observed(self.run_id))

    async def aobserve(self) -> RunRecord | None:
        """``observe`` for event loops: through the ledger's async twin on this loop, else
        in a thread."""
        native = async_twin_of(self.ledger)
        if native is None:
            return await asyncio.to_thread(self.observe)
        if not self._claim_observe():
            return None
        return self._observed_run(await native.amark_observed(self.run_id))

    def _claim_observe(self) -> bool:
        """Whether this caller is the one to record the observation (once per signal)."""
        with self._lock:
            if self._observed:
                return False
            self._observed = True
            return True

    def _observed_run(self, run: RunRecord) -> RunRecord:
        if run.requested_at is not None:
            announce_observed(run)
        return run

    def wait(self, timeout: float) -> bool:
        """Block until the signal is up or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            if self.cancel_called:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._event.wait(min(left, max(self.poll_interval, 0.01)))


class SignalHub:
    """Process-wide registry of live cancel signals, fed by every source."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._signals: dict[tuple[str, str], CancelSignal] = {}
        self._listeners: dict[str, Any] = {}
        # Ledgers whose same-process cancels we hear: weak, since ids are reused.
        self._hooked: weakref.WeakSet[Ledger] = weakref.WeakSet()

    def signal(self, ledger: Ledger, run_id: str) -> CancelSignal:
        """The live signal of a run (made now, and heard from every source, if new)."""
        key = (ledger.url, run_id)
        with self._lock:
            signal = self._signals.get(key)
            if signal is None:
                on_postgres = ledger.backend.dialect == "postgres"
                signal = CancelSignal(ledger, run_id, poll_interval=1.0 if on_postgres else 0.05)
                self._signals[key] = signal
            if ledger not in self._hooked:
                self._hooked.add(ledger)
                ledger.add_cancel_listener(self._make_listener(ledger.url))
            listener = self._listeners.get(ledger.url)
            if ledger.backend.dialect == "postgres" and (
                listener is None or not listener.is_alive()
            ):
                self._listeners[ledger.url] = start_pg_listener(ledger, self._on_notify)
        return signal

    def _make_listener(self, url: str) -> Callable[[str, str], None]:
        def listener(_thread_id: str, run_id: str) -> None:
            self._on_notify(url, run_id)

        return listener

    def _on_notify(self, url: str, run_id: str) -> None:
        with self._lock:
            signal = self._signals.get((url, run_id))
        if signal is not None:
            signal.set()

    def forget(self, ledger: Ledger, run_id: str) -> None:
        """Stop tracking a finished run's signal."""
        with self._lock:
            self._signals.pop((ledger.url, run_id), None)


def start_pg_listener(ledger: Ledger, on_notify: Callable[[str, str], None]) -> threading.Thread:
    """A daemon thread that ``LISTEN``s for cancel requests and reconnects when dropped."""
    from langgraph_cancel.ledger import PostgresBackend

    backend = ledger.backend
    assert isinstance(backend, PostgresBackend)
    conninfo = backend.conninfo
    url = ledger.url

    def loop() -> None:
        import psycopg

        # Ends with its ledger: a closed ledger stops listening within a second.
        while not backend.closed:
            try:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute("LISTEN lgc_cancel")
                    while not backend.closed:
                        for note in conn.notifies(timeout=1.0):
                            _thread, _, run_id = note.payload.partition("\x1f")
                            on_notify(url, run_id)
            except Exception:
                logger.debug("cancel listener reconnecting", exc_info=True)
                time.sleep(0.5)
        # Closed beside the caller's pool or connection: let the own pool's connections go.
        if backend.follows is not None:
            backend.close()

    thread = threading.Thread(target=loop, name="langgraph-cancel-listen", daemon=True)
    thread.start()
    return thread


#: The process's signal hub (see ``langgraph_cancel.process``).
HUB = SignalHub()


__all__ = ["HUB", "CancelSignal", "SignalHub", "start_pg_listener"]

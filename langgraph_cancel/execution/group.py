"""Compare-and-sets of concurrent calls, written together.

With ``effect_concurrency`` above 1, each call still waits for its own write (an
intent before its dispatch, an outcome after it), but the requests made while a
write is on its way go together in the next ``transition_many``.

An outcome may wait a little (``OUTCOME_LINGER``) for the outcomes of the calls
still in flight: calls dispatched together tend to finish together, and their
outcomes then share one round trip instead of a chain of them. Nothing lingers
while an intent is waiting (a dispatch is behind it) or a call waits for a
dispatch slot, and the wait ends once no call is in flight: the batch ends no
later for it, and an outcome reaches the ledger at most ``OUTCOME_LINGER`` later
than it could have.

Two flavours share that rule: ``ThreadGroupCommit`` for a sync graph's calls
(threads), ``AsyncGroupCommit`` for an async graph's (tasks on its loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from langgraph_cancel.errors import LedgerError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import async_twin_of
from langgraph_cancel.types import EffectRecord, EffectStatus, TransitionRequest

#: Longest an outcome of a concurrent batch waits to share its write with the
#: outcomes of the calls still in flight beside it (seconds).
OUTCOME_LINGER = 0.005

Written = EffectRecord | Exception


def split_group(
    waiting: Sequence[tuple[TransitionRequest, Any]],
) -> tuple[list[tuple[TransitionRequest, Any]], list[tuple[TransitionRequest, Any]]]:
    """The requests for the next write, and those for a later one.

    One request per effect a write: the same call twice in a batch asks twice, and
    the repeat waits for the next write, which tells it that it lost.
    """
    group: list[tuple[TransitionRequest, Any]] = []
    later: list[tuple[TransitionRequest, Any]] = []
    seen: set[str] = set()
    for item in waiting:
        (later if item[0].effect_id in seen else group).append(item)
        seen.add(item[0].effect_id)
    return group, later


def only_outcomes(waiting: Sequence[tuple[TransitionRequest, Any]]) -> bool:
    """No intent is waiting (an intent has a dispatch behind it: it never lingers)."""
    return all(req.to is not EffectStatus.DISPATCHED for req, _ in waiting)


class GroupCommit:
    """What both flavours count: calls in flight, calls waiting for a slot."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        #: Calls dispatched and not yet returned (their outcomes are coming).
        self.in_flight = 0
        #: Calls waiting for a dispatch slot (no outcome lingers meanwhile).
        self.waiting_for_slot = 0

    def may_linger(self, waiting: Sequence[tuple[TransitionRequest, Any]]) -> bool:
        """Whether the waiting outcomes may wait for their siblings' outcomes."""
        return self.in_flight > 0 and not self.waiting_for_slot and only_outcomes(waiting)

    def _changed(self) -> None:
        """Something the linger depends on changed (overridden to wake the writer)."""

    @contextlib.contextmanager
    def queued(self) -> Iterator[None]:
        """A call of the group waits for a dispatch slot."""
        self.waiting_for_slot += 1
        self._changed()
        try:
            yield
        finally:
            self.waiting_for_slot -= 1

    def waits_for_slot(self, calls: int = 1) -> None:
        """``calls`` calls of the group were handed over and wait for a slot."""
        self.waiting_for_slot += calls

    def got_slot(self) -> None:
        """A call of the group that waited for a slot has one now."""
        self.waiting_for_slot -= 1
        self._changed()

    def started(self) -> None:
        """A call of the group was dispatched: its outcome is coming."""
        self.in_flight += 1

    def finished(self) -> None:
        """A call of the group returned (or its wait was given up)."""
        self.in_flight -= 1
        self._changed()


class ThreadGroupCommit(GroupCommit):
    """Group commits for calls running in threads (a sync graph)."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self._cond = threading.Condition()
        self._waiting: list[tuple[TransitionRequest, list[Written]]] = []
        self._writing = False

    def _changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def started(self) -> None:
        """A call of the group was dispatched: its outcome is coming."""
        with self._cond:
            self.in_flight += 1

    def waits_for_slot(self, calls: int = 1) -> None:
        """``calls`` calls of the group were handed over and wait for a slot."""
        with self._cond:
            self.waiting_for_slot += calls

    def got_slot(self) -> None:
        """A call of the group that waited for a slot has one now."""
        with self._cond:
            self.waiting_for_slot -= 1
            self._cond.notify_all()

    def finished(self) -> None:
        """A call of the group returned (or its wait was given up)."""
        with self._cond:
            self.in_flight -= 1
            self._cond.notify_all()

    def write(self, req: TransitionRequest) -> Written:
        """``req``'s compare-and-set: the moved record, or the error it raised.

        The first caller to find no write on its way writes, for everyone waiting.
        """
        slot: list[Written] = []
        with self._cond:
            self._waiting.append((req, slot))
            self._cond.notify_all()
            while not slot and self._writing:
                self._cond.wait()
            if slot:
                return slot[0]
            self._writing = True
        try:
            self._drain()
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
        return slot[0]

    def _drain(self) -> None:
        while True:
            with self._cond:
                deadline = time.monotonic() + OUTCOME_LINGER
                while self._waiting and self.may_linger(self._waiting):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if not self._waiting:
                    return
                group, self._waiting = split_group(self._waiting)
            results = _write_group(self.ledger, [req for req, _ in group])
            with self._cond:
                for (_, slot), result in zip(group, results, strict=True):
                    slot.append(result)
                self._cond.notify_all()


class AsyncGroupCommit(GroupCommit):
    """Group commits for calls running as tasks on one event loop (an async graph)."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self._waiting: list[tuple[TransitionRequest, asyncio.Future[Written]]] = []
        self._writing = False
        self._event: asyncio.Event | None = None

    def _changed(self) -> None:
        if self._event is not None:
            self._event.set()

    def submit(self, req: TransitionRequest) -> asyncio.Future[Written]:
        """Join ``req`` to the group now; the future of its compare-and-set's answer
        (the moved record, or the error it raised), as ``GroupCommit.write`` returns it.

        The request is in the group when this returns, before the caller's call is
        counted as finished: a write started later (in a task of its own) could find
        every call done and go without it.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Written] = loop.create_future()
        self._waiting.append((req, done))
        self._changed()
        if not self._writing:
            self._writing = True
            loop.call_soon(lambda: asyncio.ensure_future(self._drain()))
        return done

    async def _linger(self) -> None:
        deadline = time.monotonic() + OUTCOME_LINGER
        if self._event is None:
            self._event = asyncio.Event()
        while self.may_linger(self._waiting):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), left)

    async def _drain(self) -> None:
        try:
            while self._waiting:
                await self._linger()
                group, self._waiting = split_group(self._waiting)
                results = await _awrite_group(self.ledger, [req for req, _ in group])
                for (_, done), result in zip(group, results, strict=True):
                    if not done.done():
                        done.set_result(result)
        finally:
            self._writing = False


def _write_group(ledger: Ledger, requests: list[TransitionRequest]) -> list[Written]:
    try:
        return list(ledger.transition_many(requests))
    except Exception as exc:  # the whole group failed: each waiter is told
        return [exc] * len(requests)


async def _awrite_group(ledger: Ledger, requests: list[TransitionRequest]) -> list[Written]:
    native = async_twin_of(ledger)
    try:
        if native is not None:  # on this loop, no thread
            return list(await native.atransition_many(requests))
        return list(await ledger.atransition_many(requests))
    except Exception as exc:  # the whole group failed: each waiter is told
        return [exc] * len(requests)


__all__ = [
    "OUTCOME_LINGER",
    "AsyncGroupCommit",
    "GroupCommit",
    "LedgerError",
    "ThreadGroupCommit",
    "split_group",
]

"""A run's scope: its ledger, its run record, its cancel signal and what its stop waits for.

One ``RunScope`` stands for one run of one thread in this process; every node
and tool of the run acts through it (``lookup.py`` finds or makes it).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import AsyncLedger, async_twin_of
from langgraph_cancel.limits import LimitGuard
from langgraph_cancel.progress import ProgressKind, announce_effect
from langgraph_cancel.runtime.signal import CancelSignal
from langgraph_cancel.types import EffectRecord, RunRecord

logger = logging.getLogger("langgraph_cancel")

#: The stop a cancelled run task stands for (a server's runs.cancel, a disconnect).
INTERRUPTED_REASON = "run task cancelled (server cancel, disconnect or Ctrl-C)"


@dataclass
class RunScope:
    """Everything a node needs to act for one run of one thread."""

    ledger: Ledger
    thread_id: str
    run: RunRecord
    owner: str
    signal: CancelSignal
    extra: dict[str, Any] = field(default_factory=dict)
    #: The thread's unsettled effects as read with the run's start, until taken.
    unsettled_at_start: list[EffectRecord] | None = None
    #: True for a run with a ledger of its own, in memory (no checkpointer, no thread):
    #: nothing of it outlives the run, and no other process can reach it.
    ephemeral: bool = False
    #: The thread id the run's config named (None: it named none).
    named_thread: str | None = None
    #: Effects in flight that this run's stop waits for: each leaves the set when its
    #: outcome is recorded and streamed as ``settled`` (``progress.py``).
    awaited: set[str] = field(default_factory=set)
    #: Effects whose call in this process has ended and had its outcome looked at for
    #: the stream: a stop that notices one of them late has nothing left to wait for.
    #: Changed together with ``awaited``, under ``awaited_lock``.
    concluded: set[str] = field(default_factory=set)
    #: Guards ``awaited`` and ``concluded``: a stop's watcher (another thread) and the
    #: call's own end may race, and ``waiting`` must never be streamed without the
    #: ``settled`` that follows it.
    awaited_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Called once when the run's task is cancelled, after the stop is recorded (the
    #: invocation shows the stop under way in the thread state).
    on_task_cancel: Callable[[], Awaitable[None]] | None = None
    #: True once the run's task was cancelled and that was recorded as a stop.
    task_cancelled: bool = False
    #: The asyncio task an async invocation of the run steps in, while it does (None
    #: otherwise): a cancel of it that LangGraph caught before it reached a node is
    #: still seen at the next stop check (``run_task_cancelled``).
    run_task: asyncio.Task[Any] | None = None
    #: The run's limits while an invocation enforces them (``add_cancellation(limits=...)``).
    limits: LimitGuard | None = None

    def enforce(self, guard: LimitGuard | None) -> None:
        """Check ``guard`` with the run's cancel signal (None: stop checking limits)."""
        previous = self.limits
        if previous is not None:
            previous.stop()
        self.limits = guard
        self.signal.limit_check = None if guard is None else guard.check
        if guard is not None:
            guard.start()

    def count_tokens(self, tokens: int) -> None:
        """Count model tokens for the run's token budget (when it has one)."""
        if self.limits is not None:
            self.limits.add_tokens(tokens)

    def await_effect(self, record: EffectRecord, grace: float | None) -> None:
        """The stop waits for ``record``, in flight, for ``grace`` seconds (None: until
        it returns): say so on the stream, once per effect.

        Nothing is said for a call that has already ended here (``conclude``): its
        outcome is recorded, and no ``settled`` would follow the ``waiting``.
        """
        with self.awaited_lock:
            if record.effect_id in self.awaited or record.effect_id in self.concluded:
                return
            self.awaited.add(record.effect_id)
            # Said under the lock, so that the call's ``settled`` cannot come first.
            announce_effect(ProgressKind.WAITING, record, grace_s=grace)

    def conclude(self, effect_id: str) -> bool:
        """The call of ``effect_id`` has ended here: whether a stop was waiting for it
        (then its outcome is to be streamed as ``settled``)."""
        with self.awaited_lock:
            self.concluded.add(effect_id)
            if effect_id not in self.awaited:
                return False
            self.awaited.discard(effect_id)
            return True

    @property
    def requested_thread(self) -> str | None:
        """The thread id a config must name for this scope to be its invocation's."""
        return self.named_thread if self.ephemeral else self.thread_id

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.run.run_id

    def take_unsettled_at_start(self) -> list[EffectRecord] | None:
        """The unsettled effects read when this invocation started the run, once.

        For START's router, the first step of an invocation: nothing has run
        since the read. None when there is no such read (or it was taken).
        """
        taken, self.unsettled_at_start = self.unsettled_at_start, None
        return taken

    def cancel_called(self) -> bool:
        """Level-triggered: has anyone asked this run to stop?"""
        return self.signal.cancel_called

    def refresh(self) -> RunRecord:
        """Re-read the run row."""
        self.run = self.ledger.get_run(self.run.run_id)
        return self.run

    async def arefresh(self) -> RunRecord:
        """``refresh`` for event loops (the ledger's async twin on this loop, else a thread)."""
        self.run = await async_ledger_of(self.ledger).aget_run(self.run.run_id)
        return self.run

    def run_task_cancelled(self) -> bool:
        """Whether the task the run steps in was asked to cancel, even if something
        inside caught the ``CancelledError`` (``Task.cancelling``)."""
        task = self.run_task
        return task is not None and task.cancelling() > 0

    async def atask_cancelled(self) -> None:
        """The run's asyncio task was cancelled (a server's ``runs.cancel``, a client
        disconnect, Ctrl-C): that is a stop request like any other.

        The signal goes up in this process at once, before any I/O, so every node
        of the run (a model stream, a tool waiting for its turn) stops by itself
        at its next check instead of relying on the task cancel reaching it; then
        the request is recorded in the ledger (the first reason wins). A failed
        write is logged: the run's end records the interruption again.
        """
        self.signal.set()
        if self.task_cancelled:
            return
        self.task_cancelled = True
        try:
            await async_ledger_of(self.ledger).arequest_cancel(
                self.thread_id, reason=INTERRUPTED_REASON, requested_by="runtime", cascade=True
            )
        except Exception:
            logger.warning("could not record the cancelled task as a stop", exc_info=True)
        if self.on_task_cancel is not None:
            try:
                await self.on_task_cancel()
            except Exception:
                logger.warning("could not show the stop under way", exc_info=True)


#: The run a node or tool of a cancel-aware graph works for. A ``ContextVar``, so each
#: run (each task, each thread LangGraph copies the context into) sees its own;
#: ``is_cancelled()`` in a tool reads it.
current_scope: contextvars.ContextVar[RunScope | None] = contextvars.ContextVar(
    "langgraph_cancel_scope", default=None
)


def async_ledger_of(ledger: Ledger) -> AsyncLedger | Ledger:
    """Where an event loop sends ``ledger``'s ``a*`` calls: its bound ``AsyncLedger``
    (on the loop, no thread), else the ledger itself (its ``a*`` methods use a thread)."""
    return async_twin_of(ledger) or ledger


__all__ = ["INTERRUPTED_REASON", "RunScope", "async_ledger_of", "current_scope"]

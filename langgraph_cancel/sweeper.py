"""The sweeper: settles, across all threads, what no live worker will come back for.

A worker that dies (``kill -9``, a lost host, a container restarted elsewhere)
leaves work behind: its lease, a stop it was asked for and never finished, calls
in flight, compensations that failed. Nobody may ever invoke those threads
again. ``Sweeper.sweep_once()`` (and ``langgraph-cancel sweep``, once or
``--watch``) does, per pass and with bounded work:

1. **Leases**: releases expired leases, and takes over (with the takeover in the
   leases' audit trail) and releases the live-looking leases of processes of
   this host that no longer run.
2. **Stops whose worker died**: a run asked to stop (``cancel_requested`` or
   ``cancelling``) that no live worker holds, whose worker is gone or whose
   request is older than ``cancel_grace``, is finished with the graph's own
   cancel code (``finalize_cancel``): its queue dropped, its in-flight calls
   settled through their reconcile hooks (or ``unknown`` with an owner), the
   calls its checkpoint left unanswered recorded, the report written, the one
   ``cancelled`` transition made.
3. **Unknown and in-flight effects**: threads nobody holds whose effects are
   ``dispatched``, ``unknown`` (with a reconcile hook) or ``compensating`` are
   reconciled (``langgraph_cancel.recovery.reconcile``).
4. **Due compensations**: ``compensation_failed`` effects whose tool has a
   compensate hook, last tried ``compensation_retry_after`` seconds ago or
   more, are compensated again.
5. Everything else (a run left ``running`` by a dead worker, an effect no hook
   can settle) is left to its owner, with the next action in the pass summary.

Several sweepers (on several machines) may run at once: each piece of work is
claimed with the thread's lease (compare-and-set), and the transitions it makes
are themselves compare-and-set (an effect is settled once, a compensation runs
under ``compensating`` once, a run is finished once).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Literal

from langchain_core.tools import BaseTool

from langgraph_cancel.compensation import compensate_effect
from langgraph_cancel.effects import spec_of
from langgraph_cancel.errors import IllegalTransitionError, ThreadBusyError
from langgraph_cancel.execution.identity import dangling_tool_calls
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledgers import coerce_ledger
from langgraph_cancel.nodes.cancel import finalize_cancel
from langgraph_cancel.nodes.reconcile import reconcile, tools_by_name
from langgraph_cancel.nodes.settings import CancellationSettings
from langgraph_cancel.outbox import OUTBOX_OWNER_PREFIX
from langgraph_cancel.runtime import CancelSignal, RunScope, worker_id
from langgraph_cancel.types import (
    TERMINAL_RUN_STATUSES,
    EffectRecord,
    EffectStatus,
    RunRecord,
    RunStatus,
    utcnow,
)
from langgraph_cancel.workers import holder_is_gone, lease_is_live

logger = logging.getLogger("langgraph_cancel.sweeper")

#: How long the sweeper holds a thread's lease while it works on it, in seconds.
SWEEP_LEASE_TTL = 60.0


class SweepActionKind(str, Enum):
    """What a sweeper did (or declined to do) for one thread or effect."""

    #: Released a lease whose holder stopped heartbeating.
    REAPED_LEASE = "reaped_lease"
    #: Took over (audited) and released the lease of a process of this host that is gone.
    TOOK_OVER_LEASE = "took_over_lease"
    #: Finished a stop whose worker died: the run is now ``cancelled``.
    FINISHED_CANCEL = "finished_cancel"
    #: Settled an effect left in flight, unknown or half-compensated.
    RECONCILED = "reconciled"
    #: Ran a failed compensation again (it is now compensated, or failed again).
    COMPENSATED = "compensated"
    #: Another worker holds the thread: nothing done, the holder owns it.
    BUSY = "busy"
    #: Not the sweeper's to do: the owner's next action is given.
    LEFT_TO_OWNER = "left_to_owner"


SweepActionKindName = Literal[
    "reaped_lease",
    "took_over_lease",
    "finished_cancel",
    "reconciled",
    "compensated",
    "busy",
    "left_to_owner",
]


@dataclass(frozen=True, slots=True)
class SweepAction:
    """One thing a sweep pass did or left.

    Attributes:
        kind: What was done.
        thread_id: The thread.
        detail: In words, for people.
        run_id: The run concerned, if any.
        effect_id: The effect concerned, if any.
        status: The effect's or run's status afterwards, if any.
        next_action: What its owner should do next (``LEFT_TO_OWNER``, ``BUSY``).
    """

    kind: SweepActionKind
    thread_id: str
    detail: str
    run_id: str | None = None
    effect_id: str | None = None
    status: str | None = None
    next_action: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "kind": self.kind.value,
            "thread_id": self.thread_id,
            "detail": self.detail,
            "run_id": self.run_id,
            "effect_id": self.effect_id,
            "status": self.status,
            "next_action": self.next_action,
        }


@dataclass(frozen=True, slots=True)
class SweepSummary:
    """The record of one sweep pass: its metrics and every action.

    Attributes:
        sweeper: The worker identity the pass acted as.
        started_at: When the pass started.
        finished_at: When it ended.
        threads_examined: Threads the pass worked on (at most ``max_threads``).
        truncated: True when more threads needed work than one pass may do.
        actions: What was done or left, in order.
    """

    sweeper: str
    started_at: datetime
    finished_at: datetime
    threads_examined: int
    truncated: bool
    actions: tuple[SweepAction, ...]

    @property
    def duration_s(self) -> float:
        """How long the pass took, in seconds."""
        return (self.finished_at - self.started_at).total_seconds()

    def count(self, kind: SweepActionKind) -> int:
        """How many actions of ``kind`` the pass has."""
        return sum(1 for action in self.actions if action.kind is kind)

    @property
    def counts(self) -> dict[str, int]:
        """Actions per kind (every kind, zeros included)."""
        return {kind.value: self.count(kind) for kind in SweepActionKind}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the pass's metrics first, then its actions)."""
        return {
            "sweeper": self.sweeper,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "duration_s": round(self.duration_s, 3),
            "threads_examined": self.threads_examined,
            "truncated": self.truncated,
            "counts": self.counts,
            "actions": [action.to_json() for action in self.actions],
        }


@dataclass
class _Pass:
    """The work of one pass, while it runs."""

    budget: int
    actions: list[SweepAction] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)
    truncated: bool = False

    def claim(self, thread_id: str) -> bool:
        """Count ``thread_id`` against the pass's budget; False when it is spent."""
        if thread_id in self.threads:
            return True
        if len(self.threads) >= self.budget:
            self.truncated = True
            return False
        self.threads.add(thread_id)
        return True


class Sweeper:
    """Settles what dead workers left, across all threads, a bounded pass at a time.

    Args:
        target: A saver, a ``Ledger`` or a database URL. With a checkpoint saver,
            the calls a stopped run's last checkpoint left unanswered are recorded
            in its report.
        tools: The tools (by name, or a list) whose reconcile and compensate hooks
            to use; tools known to an ``EffectToolNode`` of this process are used too.
        settings: The graph's cancellation settings (``builder.cancellation``), for
            ``compensate_on_cancel``; default: none, with ``tools``.
        owner: The worker identity to act as (default: this process's).
        max_threads: At most this many threads are worked on per pass.
        cancel_grace: A stop no live worker holds is finished once its request is
            this old (seconds), even when its worker cannot be known dead (another
            host, a run waiting for a person).
        compensation_retry_after: A failed compensation is tried again once it is
            this old (seconds).
        lease_ttl: How long the sweeper's own lease on a thread lasts.
    """

    def __init__(
        self,
        target: object,
        *,
        tools: Mapping[str, BaseTool] | Sequence[BaseTool] | None = None,
        settings: CancellationSettings | None = None,
        owner: str | None = None,
        max_threads: int = 100,
        cancel_grace: float = 30.0,
        compensation_retry_after: float = 60.0,
        lease_ttl: float = SWEEP_LEASE_TTL,
    ) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be at least 1, not {max_threads}")
        self.ledger: Ledger = coerce_ledger(target)
        self.saver: Any = target if hasattr(target, "get_tuple") else None
        known = tools_by_name(tools)
        if settings is None:
            settings = CancellationSettings(tools=known)
        else:
            settings = CancellationSettings(
                compensate_on_cancel=settings.compensate_on_cancel,
                cancel_timeout=settings.cancel_timeout,
                messages_key=settings.messages_key,
                report_key=settings.report_key,
                reconcile_interactive=False,
                tools={**settings.tools, **known},
            )
        # The dead worker will never answer its in-flight calls: do not wait for them.
        settings.cancel_timeout = 0.0
        self.settings = settings
        self.owner = owner or worker_id()
        self.max_threads = max_threads
        self.cancel_grace = cancel_grace
        self.compensation_retry_after = compensation_retry_after
        self.lease_ttl = lease_ttl

    # ------------------------------------------------------------------ passes
    def sweep_once(self) -> SweepSummary:
        """One bounded pass over every thread; see the module's docstring."""
        started = utcnow()
        work = _Pass(budget=self.max_threads)
        self._sweep_leases(work)
        self._finish_stops(work)
        self._reconcile_effects(work)
        self._retry_compensations(work)
        self._leave_running(work)
        summary = SweepSummary(
            sweeper=self.owner,
            started_at=started,
            finished_at=utcnow(),
            threads_examined=len(work.threads),
            truncated=work.truncated,
            actions=tuple(work.actions),
        )
        logger.info(
            "sweep pass: %d threads in %.3fs%s: %s",
            summary.threads_examined,
            summary.duration_s,
            " (truncated)" if summary.truncated else "",
            {k: v for k, v in summary.counts.items() if v},
        )
        return summary

    def run(
        self, *, interval: float = 10.0, stop: threading.Event | None = None
    ) -> Iterator[SweepSummary]:
        """Sweep every ``interval`` seconds, yielding each pass's summary, until ``stop``.

        A pass that hit its budget (``truncated``) is followed by the next at once.
        """
        stopping = stop or threading.Event()
        while not stopping.is_set():
            summary = self.sweep_once()
            yield summary
            if not summary.truncated:
                stopping.wait(interval)

    # ------------------------------------------------------------------ steps
    def _sweep_leases(self, work: _Pass) -> None:
        now = utcnow()
        for lease in self.ledger.leases():
            if lease.owner == self.owner:
                continue
            if lease.expires_at <= now:
                self.ledger.release_lease(lease.thread_id, lease.owner)
                work.actions.append(
                    SweepAction(
                        SweepActionKind.REAPED_LEASE,
                        lease.thread_id,
                        f"released the expired lease of {lease.owner}",
                    )
                )
            elif holder_is_gone(lease.owner):
                try:
                    self.ledger.acquire_lease(lease.thread_id, self.owner, ttl=self.lease_ttl)
                except ThreadBusyError:
                    continue  # another worker took it over first
                self.ledger.release_lease(lease.thread_id, self.owner)
                work.actions.append(
                    SweepAction(
                        SweepActionKind.TOOK_OVER_LEASE,
                        lease.thread_id,
                        f"took over and released the lease of {lease.owner} (no longer runs)",
                    )
                )

    def _stale(self, run: RunRecord) -> bool:
        """True when no live worker will finish ``run``'s stop."""
        if run.owner is not None and holder_is_gone(run.owner):
            return True
        requested = run.requested_at or run.updated_at
        return utcnow() - requested >= timedelta(seconds=self.cancel_grace)

    def _finish_stops(self, work: _Pass) -> None:
        stopping: dict[str, RunRecord] = {}
        for status in (RunStatus.CANCELLING, RunStatus.CANCEL_REQUESTED):
            for run in self.ledger.runs_by_status(status, limit=self.max_threads * 4):
                stopping.setdefault(run.run_id, run)
        for run in stopping.values():
            if lease_is_live(self.ledger.lease(run.thread_id)) or not self._stale(run):
                continue
            if not work.claim(run.thread_id):
                return
            with self._holding(run.thread_id, work) as held:
                if not held:
                    continue
                latest = self.ledger.get_run(run.run_id)
                if latest.status in TERMINAL_RUN_STATUSES:
                    continue  # another sweeper (or its worker, back) finished it
                scope = RunScope(
                    ledger=self.ledger,
                    thread_id=run.thread_id,
                    run=latest,
                    owner=self.owner,
                    signal=CancelSignal(self.ledger, run.run_id, poll_interval=1.0),
                )
                report = finalize_cancel(scope, self.settings, self._dangling(run.thread_id))
                work.actions.append(
                    SweepAction(
                        SweepActionKind.FINISHED_CANCEL,
                        run.thread_id,
                        f"finished the stop of run {run.run_id} (worker {run.owner} is gone)",
                        run_id=run.run_id,
                        status=report.status,
                    )
                )

    def _dangling(self, thread_id: str) -> list[Any]:
        """The tool calls the thread's last checkpoint left unanswered (needs a saver)."""
        if self.saver is None:
            return []
        saved = self.saver.get_tuple({"configurable": {"thread_id": thread_id}})
        if saved is None:
            return []
        values = saved.checkpoint.get("channel_values") or {}
        messages = values.get(self.settings.messages_key) or []
        return dangling_tool_calls(messages)

    def _reconcilable(self, rec: EffectRecord) -> bool:
        if rec.status is EffectStatus.DISPATCHED and (rec.owner or "").startswith(
            OUTBOX_OWNER_PREFIX
        ):
            return False  # sent by the outbox, which settles it (or takes it over when stale)
        if rec.status is not EffectStatus.UNKNOWN:
            return True  # in flight or half-compensated: settle or record unknown
        tool = self.settings.tool(rec.tool)
        return tool is not None and spec_of(tool).reconcile is not None

    def _reconcile_effects(self, work: _Pass) -> None:
        threads: dict[str, list[EffectRecord]] = {}
        for status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN, EffectStatus.COMPENSATING):
            for rec in self.ledger.effects_by_status(status):
                if self._reconcilable(rec):
                    threads.setdefault(rec.thread_id, []).append(rec)
        for thread_id in threads:
            if lease_is_live(self.ledger.lease(thread_id)):
                continue  # its worker is awaiting those calls
            if not work.claim(thread_id):
                return
            for result in reconcile(
                self.ledger, thread_id, tools=self.settings.all_tools(), owner=self.owner
            ):
                if result.busy is not None:
                    work.actions.append(_busy(thread_id, result.busy))
                for settled in result.effects:
                    effect = settled.effect
                    if settled.changed:
                        work.actions.append(
                            SweepAction(
                                SweepActionKind.RECONCILED,
                                thread_id,
                                f"{effect.tool}: {settled.before.value} -> {effect.status.value}",
                                run_id=effect.run_id,
                                effect_id=effect.effect_id,
                                status=effect.status.value,
                            )
                        )
                for left in result.still_unknown:
                    work.actions.append(_left(left))

    def _retry_compensations(self, work: _Pass) -> None:
        due = utcnow() - timedelta(seconds=self.compensation_retry_after)
        for rec in self.ledger.effects_by_status(EffectStatus.COMPENSATION_FAILED):
            tool = self.settings.tool(rec.tool)
            spec = None if tool is None else spec_of(tool)
            if spec is None or spec.compensate is None or rec.updated_at > due:
                continue
            if lease_is_live(self.ledger.lease(rec.thread_id)) or not work.claim(rec.thread_id):
                continue
            with self._holding(rec.thread_id, work) as held:
                if not held:
                    continue
                current = self.ledger.get_effect(rec.effect_id)
                if current.status is not EffectStatus.COMPENSATION_FAILED:
                    continue  # another sweeper retried it first
                try:
                    done = compensate_effect(self.ledger, current, spec, actor="sweeper")
                except IllegalTransitionError:
                    continue
                work.actions.append(
                    SweepAction(
                        SweepActionKind.COMPENSATED,
                        rec.thread_id,
                        f"{rec.tool}: compensation tried again -> {done.status.value}",
                        run_id=rec.run_id,
                        effect_id=rec.effect_id,
                        status=done.status.value,
                    )
                )

    def _leave_running(self, work: _Pass) -> None:
        for run in self.ledger.runs_by_status(RunStatus.RUNNING, limit=self.max_threads * 4):
            if run.owner is None or not holder_is_gone(run.owner):
                continue
            if lease_is_live(self.ledger.lease(run.thread_id)):
                continue
            work.actions.append(
                SweepAction(
                    SweepActionKind.LEFT_TO_OWNER,
                    run.thread_id,
                    f"run {run.run_id} was left running by {run.owner}, which no longer runs",
                    run_id=run.run_id,
                    status=run.status.value,
                    next_action=f"langgraph-cancel resume {run.thread_id} (or invoke the "
                    "thread again) to continue it; langgraph-cancel stop to end it",
                )
            )

    # ------------------------------------------------------------------ leases
    @contextlib.contextmanager
    def _holding(self, thread_id: str, work: _Pass) -> Iterator[bool]:
        """Hold the thread's lease for the block (yields False, recorded busy, if taken)."""
        try:
            self.ledger.acquire_lease(thread_id, self.owner, ttl=self.lease_ttl)
        except ThreadBusyError as exc:
            work.actions.append(_busy(thread_id, exc.owner))
            yield False
            return
        try:
            yield True
        finally:
            self.ledger.release_lease(thread_id, self.owner)


def _busy(thread_id: str, holder: str) -> SweepAction:
    return SweepAction(
        SweepActionKind.BUSY,
        thread_id,
        f"held by {holder}",
        next_action=f"{holder} is working on it; its lease says when it expires",
    )


def _left(rec: EffectRecord) -> SweepAction:
    return SweepAction(
        SweepActionKind.LEFT_TO_OWNER,
        rec.thread_id,
        f"{rec.tool}: {rec.status.value}, owned by {rec.owner or 'nobody named'}",
        run_id=rec.run_id,
        effect_id=rec.effect_id,
        status=rec.status.value,
        next_action=rec.next_action,
    )


def sweep(
    target: object,
    *,
    tools: Mapping[str, BaseTool] | Sequence[BaseTool] | None = None,
    settings: CancellationSettings | None = None,
    max_threads: int = 100,
    cancel_grace: float = 30.0,
    compensation_retry_after: float = 60.0,
) -> SweepSummary:
    """One sweep pass (see :class:`Sweeper`), for a scheduler or the user's own process.

    Returns:
        The pass's summary: its metrics and every action taken or left.
    """
    return Sweeper(
        target,
        tools=tools,
        settings=settings,
        max_threads=max_threads,
        cancel_grace=cancel_grace,
        compensation_retry_after=compensation_retry_after,
    ).sweep_once()


def watch(sweeper: Sweeper, *, interval: float, passes: int | None = None) -> list[SweepSummary]:
    """Run ``passes`` passes (None: until interrupted) ``interval`` seconds apart."""
    done: list[SweepSummary] = []
    for summary in sweeper.run(interval=interval):
        done.append(summary)
        if passes is not None and len(done) >= passes:
            break
    return done


__all__ = [
    "SWEEP_LEASE_TTL",
    "SweepAction",
    "SweepActionKind",
    "SweepActionKindName",
    "SweepSummary",
    "Sweeper",
    "sweep",
    "watch",
]

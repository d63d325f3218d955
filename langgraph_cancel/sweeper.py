"""The sweeper: settles, across all threads, what no live worker will come back for.

A worker that dies (``kill -9``, a lost host, a container restarted elsewhere)
leaves work behind: its lease, a stop it was asked for and never finished, calls
in flight, compensations that failed. Nobody may ever invoke those threads
again. ``Sweeper.sweep_once()`` (and ``langgraph-cancel sweep``, once or
``--watch``) does, per pass and with bounded work:

1. **Leases**: releases expired leases, and takes over (with the takeover in the
   leases' audit trail) and releases the live-looking leases of processes of
   this host that no longer run. A lease left on a thread whose run is already
   ``cancelled`` is a worker that died after finishing its stop but before its
   cancel node's checkpoint: given the graph, the thread is closed as in 2,
   and the lease goes only then. A pass whose close failed, or that failed between
   a stop's finish and its thread's close, leaves its own lease on the thread for
   the same reason, expired at once: the next pass finds the thread, and a worker
   given it meanwhile is not held up.
2. **Stops whose worker died**: a run asked to stop (``cancel_requested`` or
   ``cancelling``) that no live worker holds, whose worker is gone or whose
   request is older than ``cancel_grace``, is finished with the graph's own
   cancel code (``finalize_cancel``): its queue dropped, its in-flight calls
   settled through their reconcile hooks (or ``unknown`` with an owner), the
   calls its checkpoint left unanswered recorded, the report written, the one
   ``cancelled`` transition made. Given the graph, the thread is then closed as
   ``resume`` would close it: run on from its last checkpoint, every pending node
   diverts to the cancel node, which answers each call left unanswered and stores
   the report in the state, so the thread ends with nothing next and nothing
   dispatched.
3. **Unknown and in-flight effects**: threads with no lease on them whose effects
   are ``dispatched``, ``unknown`` (with a reconcile hook) or ``compensating`` are
   reconciled (``langgraph_cancel.recovery.reconcile``).
4. **Due compensations**: ``compensation_failed`` effects whose tool has a
   compensate hook, last tried ``compensation_retry_after`` seconds ago or
   more, are compensated again, on threads with no lease on them.

   Steps 3 and 4 leave a thread with an expired lease to step 1 of the next pass:
   they take a thread's lease and give it back when done, which would let go a
   lease kept on a cancelled run's open thread without closing the thread.
5. Everything else (a run left ``running`` by a dead worker, an effect no hook
   can settle) is left to its owner, with the next action in the pass summary.

Several sweepers (on several machines) may run at once: each piece of work is
claimed with the thread's lease (compare-and-set), and the transitions it makes
are themselves compare-and-set (an effect is settled once, a compensation runs
under ``compensating`` once, a run is finished once).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from langchain_core.tools import BaseTool

from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledgers import coerce_ledger
from langgraph_cancel.nodes.cancel import finalize_cancel
from langgraph_cancel.nodes.reconcile import tools_by_name
from langgraph_cancel.nodes.settings import CancellationSettings
from langgraph_cancel.runtime import CancelSignal, RunScope, worker_id
from langgraph_cancel.sweep_effects import EffectSweep
from langgraph_cancel.sweep_pass import SweepLeases, SweepPass
from langgraph_cancel.sweep_summary import (
    SweepAction,
    SweepActionKind,
    SweepActionKindName,
    SweepSummary,
)
from langgraph_cancel.sweep_threads import CloseOutcome, SweptThreads, compile_on
from langgraph_cancel.types import (
    TERMINAL_RUN_STATUSES,
    LeaseRecord,
    RunRecord,
    RunStatus,
    utcnow,
)
from langgraph_cancel.workers import holder_is_gone, lease_is_live

logger = logging.getLogger("langgraph_cancel.sweeper")

#: How long the sweeper holds a thread's lease while it works on it, in seconds.
SWEEP_LEASE_TTL = 60.0


class Sweeper:
    """Settles what dead workers left, across all threads, a bounded pass at a time.

    Args:
        target: A saver, a ``Ledger`` or a database URL. With a checkpoint saver,
            the calls a stopped run's last checkpoint left unanswered are recorded
            in its report.
        tools: The tools (by name, or a list) whose reconcile and compensate hooks
            to use; tools known to an ``EffectToolNode`` of this process are used too.
        settings: The graph's cancellation settings (``builder.cancellation``), for
            ``compensate_on_cancel``; default: the graph's, else none, with ``tools``.
        graph: The agent: prepared with ``add_cancellation`` (its builder, or the
            builder compiled), or a ``create_agent`` agent with ``EffectMiddleware``.
            Compiled on ``target`` (a saver), it closes the thread of each stop the
            sweeper finishes. Without it such a thread keeps the
            checkpoint its worker left (calls unanswered, a node next) until it is
            next invoked or resumed, which closes it the same way.
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
        graph: Any = None,
        owner: str | None = None,
        max_threads: int = 100,
        cancel_grace: float = 30.0,
        compensation_retry_after: float = 60.0,
        lease_ttl: float = SWEEP_LEASE_TTL,
    ) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be at least 1, not {max_threads}")
        self.ledger: Ledger = coerce_ledger(target)
        saver: Any = target if hasattr(target, "get_tuple") else None
        compiled, graph_settings = (None, None) if graph is None else compile_on(graph, saver)
        if settings is None:
            settings = graph_settings
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
        self.threads = SweptThreads(saver, compiled, self.owner, settings, self.ledger)
        self.max_threads = max_threads
        self.cancel_grace = cancel_grace
        self.compensation_retry_after = compensation_retry_after
        self.lease_ttl = lease_ttl
        self.leases = SweepLeases(self.ledger, self.owner, lease_ttl)
        self.effects = EffectSweep(self.leases, settings, compensation_retry_after)

    # ------------------------------------------------------------------ passes
    def sweep_once(self) -> SweepSummary:
        """One bounded pass over every thread; see the module's docstring."""
        started = utcnow()
        work = SweepPass(budget=self.max_threads)
        self._sweep_leases(work)
        self._finish_stops(work)
        self.effects.reconcile_effects(work)
        self.effects.retry_compensations(work)
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

        A pass that hit its budget (``truncated``) is followed by the next at once. A
        pass that failed (the database gone, say) is logged and followed by the next
        one ``interval`` seconds later: what it left undone is found again then.
        """
        stopping = stop or threading.Event()
        while not stopping.is_set():
            try:
                summary = self.sweep_once()
            except Exception:
                logger.warning("sweep pass failed; the next one runs as planned", exc_info=True)
                stopping.wait(interval)
                continue
            yield summary
            if not summary.truncated:
                stopping.wait(interval)

    # ------------------------------------------------------------------ steps
    def _sweep_leases(self, work: SweepPass) -> None:
        now = utcnow()
        for lease in self.ledger.leases():
            if lease.expires_at <= now:
                freed = SweepAction(
                    SweepActionKind.REAPED_LEASE,
                    lease.thread_id,
                    f"released the expired lease of {lease.owner}",
                )
            elif lease.owner != self.owner and holder_is_gone(lease.owner):
                freed = SweepAction(
                    SweepActionKind.TOOK_OVER_LEASE,
                    lease.thread_id,
                    f"took over and released the lease of {lease.owner} (no longer runs)",
                )
            else:
                continue
            run = self.ledger.latest_run(lease.thread_id)
            if run is not None and run.status is RunStatus.CANCELLED:
                self._close_cancelled_thread(lease, run, freed, work)
            elif self._free(lease, freed.kind):
                work.actions.append(freed)

    def _free(self, lease: LeaseRecord, kind: SweepActionKind) -> bool:
        """Release an expired lease, or take over and release a gone holder's; False
        when another worker took it over first."""
        if kind is SweepActionKind.REAPED_LEASE:
            self.ledger.release_lease(lease.thread_id, lease.owner)
            return True
        try:
            self.ledger.acquire_lease(lease.thread_id, self.owner, ttl=self.lease_ttl)
        except ThreadBusyError:
            return False
        self.ledger.release_lease(lease.thread_id, self.owner)
        return True

    def _close_cancelled_thread(
        self, lease: LeaseRecord, run: RunRecord, freed: SweepAction, work: SweepPass
    ) -> None:
        """A dead or expired holder's thread whose run it had cancelled: close the thread.

        A worker gives its lease back only once its graph has ended and the thread's
        state is put right, so a lease left on a thread whose run is ``cancelled``
        means the worker died (or its saves were lost) between the cancel node's
        terminal transition and the node's checkpoint: the stop is finished, but the
        checkpoint still has the cancel node next, without the run's report (and,
        had the worker died inside the tool node, with calls unanswered). Given the
        graph, the sweeper takes the lease over and closes the thread as after a
        finished stop, and lets the lease go only then: a pass that fails before
        that leaves the lease on the thread, so that a later pass comes back to it.
        Without the graph (or when closing it failed), the step left is named.
        """
        thread_id, holder = lease.thread_id, lease.owner
        if self.threads.graph is None:
            if not self._free(lease, freed.kind):
                return
            work.actions.append(freed)
        else:
            if not work.claim(thread_id):
                return
            with self.leases.holding(thread_id, work) as held:
                if not held:
                    return
                work.actions.append(freed)
                work.kept.add(thread_id)
                outcome = self.threads.close(thread_id, run.report)
                work.kept.discard(thread_id)
                if outcome is CloseOutcome.CLOSED:
                    work.actions.append(
                        SweepAction(
                            SweepActionKind.CLOSED_THREAD,
                            thread_id,
                            f"closed the thread of run {run.run_id}, cancelled, which "
                            f"{holder} had left open",
                            run_id=run.run_id,
                            status=run.status.value,
                        )
                    )
                    return
                if outcome is CloseOutcome.FAILED and self._keep_for_later(thread_id, run, work):
                    return
        if self.threads.left_open(thread_id, run):
            work.actions.append(
                SweepAction(
                    SweepActionKind.LEFT_TO_OWNER,
                    thread_id,
                    f"run {run.run_id} is cancelled and {holder} left its thread open",
                    run_id=run.run_id,
                    status=run.status.value,
                    next_action=_close_later(thread_id),
                )
            )

    def _keep_for_later(self, thread_id: str, run: RunRecord, work: SweepPass) -> bool:
        """After a close of a stopped thread that failed: whether the thread is still
        open, its lease then kept (expired) for a later pass to close it.

        A close fails when the database goes away meanwhile; the thread's run is over,
        so no worker comes back for it, and without the lease no pass would either.
        """
        try:
            still_open = self.threads.left_open(thread_id, run)
        except Exception:
            logger.warning("could not read thread %s after its close failed", thread_id)
            still_open = True  # cannot tell: try again later
        if still_open:
            work.kept.add(thread_id)
        return still_open

    def _stale(self, run: RunRecord) -> str | None:
        """Why no live worker will finish ``run``'s stop, or None while one may."""
        if run.owner is not None and holder_is_gone(run.owner):
            return f"worker {run.owner} is gone"
        requested = run.requested_at or run.updated_at
        if utcnow() - requested >= timedelta(seconds=self.cancel_grace):
            return f"no worker finished it within {self.cancel_grace:g}s of the request"
        return None

    def _finish_stops(self, work: SweepPass) -> None:
        stopping: dict[str, RunRecord] = {}
        for status in (RunStatus.CANCELLING, RunStatus.CANCEL_REQUESTED):
            for run in self.ledger.runs_by_status(status, limit=self.max_threads * 4):
                stopping.setdefault(run.run_id, run)
        for run in stopping.values():
            if lease_is_live(self.ledger.lease(run.thread_id)):
                continue
            why = self._stale(run)
            if why is None:
                continue
            if not work.claim(run.thread_id):
                return
            with self.leases.holding(run.thread_id, work) as held:
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
                dangling = self.threads.dangling(run.thread_id)
                work.kept.add(run.thread_id)
                report = finalize_cancel(scope, self.settings, dangling)
                outcome = self.threads.close(run.thread_id, report.model_dump(mode="json"))
                work.kept.discard(run.thread_id)
                closed = outcome is CloseOutcome.CLOSED
                later = outcome is CloseOutcome.FAILED and self._keep_for_later(
                    run.thread_id, run, work
                )
                next_action = None
                if later:
                    next_action = _close_on_next_pass(run.thread_id)
                elif not closed and dangling:
                    next_action = _close_later(run.thread_id)
                work.actions.append(
                    SweepAction(
                        SweepActionKind.FINISHED_CANCEL,
                        run.thread_id,
                        f"finished the stop of run {run.run_id} ({why})"
                        + ("; closed its thread" if closed else ""),
                        run_id=run.run_id,
                        status=report.status,
                        next_action=next_action,
                    )
                )

    def _leave_running(self, work: SweepPass) -> None:
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


def _close_on_next_pass(thread_id: str) -> str:
    return (
        f"a sweeper closes thread {thread_id} on its next pass (this one's lease on it "
        f"is left expired); or langgraph-cancel resume {thread_id}"
    )


def _close_later(thread_id: str) -> str:
    return (
        f"langgraph-cancel resume {thread_id}, or new input on the thread: either answers "
        "the calls its worker left"
    )


def sweep(
    target: object,
    *,
    tools: Mapping[str, BaseTool] | Sequence[BaseTool] | None = None,
    settings: CancellationSettings | None = None,
    graph: Any = None,
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
        graph=graph,
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

"""The sync ledger's runs: starting one, cancel requests, the one terminal transition.

Each method drives an operation of ``run_ops.py`` (written once, shared with
``aio_runs.py``) on the sync backend.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from langgraph_cancel.ledger import run_ops as ops
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.leases import LeaseLedger
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.steps import run as drive
from langgraph_cancel.ledger.store import to_thread
from langgraph_cancel.types import (
    CancelRequestResult,
    EffectRecord,
    RunRecord,
    RunStatus,
    run_status,
)


class RunLedger(LeaseLedger):
    """Runs, cancel requests, token counts and thread deletion."""

    @transient_retry()
    def start_run(
        self,
        thread_id: str,
        *,
        run_id: str | None = None,
        owner: str | None = None,
        parent_run_id: str | None = None,
        lease_ttl: float | None = None,
    ) -> RunRecord:
        """The thread's live run, or a new ``running`` one when it has none.

        At most one run per thread is live; the database enforces it, so two
        workers starting the same thread at once get the same run.

        Args:
            thread_id: The thread.
            run_id: The new run's id (default: a fresh UUID).
            owner: The worker starting it.
            parent_run_id: The run of the parent graph, for a subgraph's run.
            lease_ttl: Also take the thread's lease for ``owner`` (as
                ``acquire_lease``), first and in the same round trip.

        Raises:
            ThreadBusyError: With ``lease_ttl``: another owner holds a live lease
                (no run is started then).
        """
        started, _ = drive(
            self.backend,
            ops.start_run(self.backend, thread_id, run_id, owner, parent_run_id, lease_ttl, False),
        )
        return started

    @transient_retry()
    def start_run_and_unsettled(
        self,
        thread_id: str,
        *,
        run_id: str | None = None,
        owner: str | None = None,
        parent_run_id: str | None = None,
        lease_ttl: float | None = None,
    ) -> tuple[RunRecord, list[EffectRecord]]:
        """``start_run``, and the thread's ``unsettled`` effects read in the same round trip.

        What a new invocation needs before anything runs: its run, and whether
        anything must be settled first.

        Raises:
            ThreadBusyError: As ``start_run``.
        """
        started, unsettled = drive(
            self.backend,
            ops.start_run(self.backend, thread_id, run_id, owner, parent_run_id, lease_ttl, True),
        )
        assert unsettled is not None
        return started, unsettled

    @transient_retry()
    def get_run(self, run_id: str) -> RunRecord:
        """The run with this id.

        Raises:
            UnknownRunError: If there is none.
        """
        return drive(self.backend, ops.get_run(self.backend, run_id))

    @transient_retry()
    def active_run(self, thread_id: str) -> RunRecord | None:
        """The thread's live (not terminal) run, if any."""
        return drive(
            self.backend,
            ops.one_run(self.backend, ledger_sql.SELECT_ACTIVE_RUN, {"thread_id": thread_id}),
        )

    @transient_retry()
    def latest_run(self, thread_id: str) -> RunRecord | None:
        """The thread's most recent run, live or not."""
        return drive(
            self.backend,
            ops.one_run(self.backend, ledger_sql.SELECT_LATEST_RUN, {"thread_id": thread_id}),
        )

    @transient_retry()
    def require_latest_run(self, thread_id: str) -> RunRecord:
        """The thread's most recent run.

        Raises:
            UnknownThreadError: If the ledger has never seen the thread.
        """
        return drive(self.backend, ops.require_latest_run(self.backend, thread_id))

    @transient_retry()
    def runs(self, thread_id: str) -> list[RunRecord]:
        """Every run of a thread, oldest first."""
        return drive(
            self.backend,
            ops.some_runs(self.backend, ledger_sql.SELECT_THREAD_RUNS, {"thread_id": thread_id}),
        )

    @transient_retry()
    def child_runs(self, run_id: str) -> list[RunRecord]:
        """Runs registered as children (sub-agents) of ``run_id``."""
        return drive(
            self.backend,
            ops.some_runs(self.backend, ledger_sql.SELECT_CHILD_RUNS, {"run_id": run_id}),
        )

    @transient_retry()
    def runs_by_status(self, status: RunStatus | str, *, limit: int = 1000) -> list[RunRecord]:
        """Runs in a given status across all threads."""
        params = {"status": run_status(status).value, "limit": limit}
        return drive(
            self.backend, ops.some_runs(self.backend, ledger_sql.SELECT_RUNS_BY_STATUS, params)
        )

    def request_cancel(
        self,
        thread_id: str,
        *,
        reason: str,
        requested_by: str,
        cascade: bool = True,
    ) -> CancelRequestResult:
        """Ask the thread's live run to stop. Level-triggered; the first reason wins.

        Cancelling a thread whose last run already finished is a no-op answer
        (``accepted=False``), not an error. Children (sub-agent runs) are
        cancelled too, recursively, when ``cascade`` is true.

        Raises:
            UnknownThreadError: If the ledger has never seen the thread.
        """
        return drive(
            self.backend,
            ops.request_cancel(
                self.backend, self._cancel_listeners, thread_id, reason, requested_by, cascade
            ),
        )

    @transient_retry()
    def mark_observed(self, run_id: str) -> RunRecord:
        """Record that the run saw its cancel signal: ``cancel_requested -> cancelling``."""
        return drive(self.backend, ops.mark_observed(self.backend, run_id))

    def finish_run(
        self,
        run_id: str,
        status: RunStatus | str,
        *,
        report: dict[str, Any] | None = None,
        quiesced_at: datetime | None = None,
        tokens_after_cancel: int | None = None,
        release_lease: str | None = None,
    ) -> bool:
        """Make the run's one terminal transition.

        ``release_lease``: an owner whose lease on the run's thread is given back in
        the same round trip, if this call makes the transition (else it is kept).

        Returns:
            True if this call made it; False if the run was already terminal
            (another writer won, or this is a repeat).

        Raises:
            IllegalTransitionError: For a non-terminal target, or one the run's
                current status cannot reach (e.g. ``completed`` after a cancel request).
        """
        finish = ops.finish_run(
            self.backend,
            run_id,
            run_status(status),
            report=report,
            quiesced_at=quiesced_at,
            tokens_after_cancel=tokens_after_cancel,
            release_lease=release_lease,
        )
        return drive(self.backend, finish)

    @transient_retry()
    def add_tokens_after_cancel(self, run_id: str, tokens: int) -> None:
        """Count model tokens received after the run's cancel signal."""
        drive(self.backend, ops.add_tokens_after_cancel(run_id, tokens))

    @transient_retry()
    def add_tokens_used(self, run_id: str, tokens: int) -> int:
        """Count model tokens the run used; returns the run's new total.

        Raises:
            UnknownRunError: If there is no such run.
        """
        return drive(self.backend, ops.add_tokens_used(run_id, tokens))

    @transient_retry()
    def delete_thread(self, thread_id: str) -> None:
        """Forget a thread's runs and effects (audit rows are kept)."""
        drive(self.backend, ops.delete_thread(thread_id))

    astart_run = to_thread(start_run)
    astart_run_and_unsettled = to_thread(start_run_and_unsettled)
    aget_run = to_thread(get_run)
    aactive_run = to_thread(active_run)
    alatest_run = to_thread(latest_run)
    aruns = to_thread(runs)
    achild_runs = to_thread(child_runs)
    arequest_cancel = to_thread(request_cancel)
    amark_observed = to_thread(mark_observed)
    afinish_run = to_thread(finish_run)
    aadd_tokens_after_cancel = to_thread(add_tokens_after_cancel)
    aadd_tokens_used = to_thread(add_tokens_used)
    adelete_thread = to_thread(delete_thread)


__all__ = ["RunLedger"]

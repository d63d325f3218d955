"""The async ledger's runs: ``runs.py``'s twin, the same operations (``run_ops.py``)
awaited on the caller's loop."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from langgraph_cancel.ledger import run_ops as ops
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.aio_backends import atransient_retry
from langgraph_cancel.ledger.aio_leases import AsyncLeaseLedger
from langgraph_cancel.ledger.steps import arun
from langgraph_cancel.types import (
    CancelRequestResult,
    EffectRecord,
    RunRecord,
    RunStatus,
    run_status,
)


class AsyncRunLedger(AsyncLeaseLedger):
    """Runs, cancel requests, token counts and thread deletion on an async backend."""

    @atransient_retry()
    async def astart_run(
        self,
        thread_id: str,
        *,
        run_id: str | None = None,
        owner: str | None = None,
        parent_run_id: str | None = None,
        lease_ttl: float | None = None,
    ) -> RunRecord:
        """``Ledger.start_run``: the thread's live run, or a new ``running`` one.

        Raises:
            ThreadBusyError: With ``lease_ttl``: another owner holds a live lease.
        """
        started, _ = await arun(
            self.backend,
            ops.start_run(self.backend, thread_id, run_id, owner, parent_run_id, lease_ttl, False),
        )
        return started

    @atransient_retry()
    async def astart_run_and_unsettled(
        self,
        thread_id: str,
        *,
        run_id: str | None = None,
        owner: str | None = None,
        parent_run_id: str | None = None,
        lease_ttl: float | None = None,
    ) -> tuple[RunRecord, list[EffectRecord]]:
        """``Ledger.start_run_and_unsettled``: the run and the thread's unsettled effects.

        Raises:
            ThreadBusyError: As ``astart_run``.
        """
        started, unsettled = await arun(
            self.backend,
            ops.start_run(self.backend, thread_id, run_id, owner, parent_run_id, lease_ttl, True),
        )
        assert unsettled is not None
        return started, unsettled

    @atransient_retry()
    async def aget_run(self, run_id: str) -> RunRecord:
        """The run with this id.

        Raises:
            UnknownRunError: If there is none.
        """
        return await arun(self.backend, ops.get_run(self.backend, run_id))

    @atransient_retry()
    async def aactive_run(self, thread_id: str) -> RunRecord | None:
        """The thread's live (not terminal) run, if any."""
        return await arun(
            self.backend,
            ops.one_run(self.backend, ledger_sql.SELECT_ACTIVE_RUN, {"thread_id": thread_id}),
        )

    @atransient_retry()
    async def alatest_run(self, thread_id: str) -> RunRecord | None:
        """The thread's most recent run, live or not."""
        return await arun(
            self.backend,
            ops.one_run(self.backend, ledger_sql.SELECT_LATEST_RUN, {"thread_id": thread_id}),
        )

    @atransient_retry()
    async def arequire_latest_run(self, thread_id: str) -> RunRecord:
        """The thread's most recent run.

        Raises:
            UnknownThreadError: If the ledger has never seen the thread.
        """
        return await arun(self.backend, ops.require_latest_run(self.backend, thread_id))

    @atransient_retry()
    async def aruns(self, thread_id: str) -> list[RunRecord]:
        """Every run of a thread, oldest first."""
        return await arun(
            self.backend,
            ops.some_runs(self.backend, ledger_sql.SELECT_THREAD_RUNS, {"thread_id": thread_id}),
        )

    @atransient_retry()
    async def achild_runs(self, run_id: str) -> list[RunRecord]:
        """Runs registered as children (sub-agents) of ``run_id``."""
        return await arun(
            self.backend,
            ops.some_runs(self.backend, ledger_sql.SELECT_CHILD_RUNS, {"run_id": run_id}),
        )

    @atransient_retry()
    async def aruns_by_status(
        self, status: RunStatus | str, *, limit: int = 1000
    ) -> list[RunRecord]:
        """Runs in a given status across all threads."""
        params = {"status": run_status(status).value, "limit": limit}
        return await arun(
            self.backend, ops.some_runs(self.backend, ledger_sql.SELECT_RUNS_BY_STATUS, params)
        )

    async def arequest_cancel(
        self,
        thread_id: str,
        *,
        reason: str,
        requested_by: str,
        cascade: bool = True,
    ) -> CancelRequestResult:
        """``Ledger.request_cancel``: ask the thread's live run to stop; the first reason wins.

        Raises:
            UnknownThreadError: If the ledger has never seen the thread.
        """
        return await arun(
            self.backend,
            ops.request_cancel(
                self.backend, self._cancel_listeners, thread_id, reason, requested_by, cascade
            ),
        )

    @atransient_retry()
    async def amark_observed(self, run_id: str) -> RunRecord:
        """Record that the run saw its cancel signal: ``cancel_requested -> cancelling``."""
        return await arun(self.backend, ops.mark_observed(self.backend, run_id))

    async def afinish_run(
        self,
        run_id: str,
        status: RunStatus | str,
        *,
        report: dict[str, Any] | None = None,
        quiesced_at: datetime | None = None,
        tokens_after_cancel: int | None = None,
        release_lease: str | None = None,
    ) -> bool:
        """``Ledger.finish_run``: the run's one terminal transition.

        Returns:
            True if this call made it; False if the run was already terminal.

        Raises:
            IllegalTransitionError: For a non-terminal target, or one the run's
                current status cannot reach.
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
        return await arun(self.backend, finish)

    @atransient_retry()
    async def aadd_tokens_after_cancel(self, run_id: str, tokens: int) -> None:
        """Count model tokens received after the run's cancel signal."""
        await arun(self.backend, ops.add_tokens_after_cancel(run_id, tokens))

    @atransient_retry()
    async def aadd_tokens_used(self, run_id: str, tokens: int) -> int:
        """Count model tokens the run used; returns the run's new total.

        Raises:
            UnknownRunError: If there is no such run.
        """
        return await arun(self.backend, ops.add_tokens_used(run_id, tokens))

    @atransient_retry()
    async def adelete_thread(self, thread_id: str) -> None:
        """Forget a thread's runs and effects (audit rows are kept)."""
        await arun(self.backend, ops.delete_thread(thread_id))


__all__ = ["AsyncRunLedger"]


__all__ = ["AsyncRunLedger"]

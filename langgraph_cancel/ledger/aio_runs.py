"""The async ledger's runs: ``runs.py``'s twin, awaited on the caller's loop.

Every method mirrors the sync ``RunLedger``'s, sharing its statements
(``sql.py``) and decisions (``decisions.py``).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from langgraph_cancel.errors import UnknownRunError, UnknownThreadError
from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.aio_backends import atransient_retry
from langgraph_cancel.ledger.aio_leases import AsyncLeaseLedger
from langgraph_cancel.types import (
    CancelRequestResult,
    EffectRecord,
    RunRecord,
    RunStatus,
    run_status,
    utcnow,
)


class AsyncRunLedger(AsyncLeaseLedger):
    """Runs, cancel requests, token counts and thread deletion on an async backend."""

    # ------------------------------------------------------------------- runs
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
        run, _ = await self._start_run(thread_id, run_id, owner, parent_run_id, lease_ttl, False)
        return run

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
        run, unsettled = await self._start_run(
            thread_id, run_id, owner, parent_run_id, lease_ttl, True
        )
        assert unsettled is not None
        return run, unsettled

    async def _start_run(
        self,
        thread_id: str,
        run_id: str | None,
        owner: str | None,
        parent_run_id: str | None,
        lease_ttl: float | None,
        with_unsettled: bool,
    ) -> tuple[RunRecord, list[EffectRecord] | None]:
        b = self.backend
        now_dt = utcnow()
        params = {
            "run_id": run_id or str(uuid.uuid4()),
            "thread_id": thread_id,
            "now": b.ts_in(now_dt),
            "owner": owner,
            "parent_run_id": parent_run_id,
        }
        statements = [(q.INSERT_RUN, params)]
        if lease_ttl is not None:
            if owner is None:
                raise ValueError("start_run: a lease needs an owner")
            lease = {
                "thread_id": thread_id,
                "owner": owner,
                "now": params["now"],
                "expires_at": b.ts_in(now_dt + timedelta(seconds=lease_ttl)),
            }
            statements = [(q.ACQUIRE_LEASE, lease), (q.INSERT_RUN_LEASED, params)]
        if with_unsettled:
            statements.append((q.SELECT_UNSETTLED, {"thread_id": thread_id}))
        results = await b.all_rows(statements)
        if lease_ttl is not None and not results[0]:
            # Held by another owner, or let go in between: aacquire_lease tells which.
            await self.aacquire_lease(thread_id, owner or "", ttl=lease_ttl)
            return await self._start_run(
                thread_id, run_id, owner, parent_run_id, None, with_unsettled
            )
        created = results[1 if lease_ttl is not None else 0]
        unsettled = [self._effect(r) for r in results[-1]] if with_unsettled else None
        row = created[0] if created else None
        if row is None:  # the thread's live run (or a run id clash)
            row = await self._one(q.SELECT_ACTIVE_RUN, {"thread_id": thread_id})
            if row is None:
                raise UnknownRunError(run_id or "")
        return self._run(row), unsettled

    @atransient_retry()
    async def aget_run(self, run_id: str) -> RunRecord:
        """The run with this id.

        Raises:
            UnknownRunError: If there is none.
        """
        row = await self._one(q.SELECT_RUN, {"run_id": run_id})
        if row is None:
            raise UnknownRunError(run_id)
        return self._run(row)

    @atransient_retry()
    async def aactive_run(self, thread_id: str) -> RunRecord | None:
        """The thread's live (not terminal) run, if any."""
        row = await self._one(q.SELECT_ACTIVE_RUN, {"thread_id": thread_id})
        return None if row is None else self._run(row)

    @atransient_retry()
    async def alatest_run(self, thread_id: str) -> RunRecord | None:
        """The thread's most recent run, live or not."""
        row = await self._one(q.SELECT_LATEST_RUN, {"thread_id": thread_id})
        return None if row is None else self._run(row)

    async def arequire_latest_run(self, thread_id: str) -> RunRecord:
        """The thread's most recent run.

        Raises:
            UnknownThreadError: If the ledger has never seen the thread.
        """
        run = await self.alatest_run(thread_id)
        if run is None:
            raise UnknownThreadError(thread_id)
        return run

    @atransient_retry()
    async def aruns(self, thread_id: str) -> list[RunRecord]:
        """Every run of a thread, oldest first."""
        rows = await self._all(q.SELECT_THREAD_RUNS, {"thread_id": thread_id})
        return [self._run(r) for r in rows]

    @atransient_retry()
    async def achild_runs(self, run_id: str) -> list[RunRecord]:
        """Runs registered as children (sub-agents) of ``run_id``."""
        return [self._run(r) for r in await self._all(q.SELECT_CHILD_RUNS, {"run_id": run_id})]

    @atransient_retry()
    async def aruns_by_status(
        self, status: RunStatus | str, *, limit: int = 1000
    ) -> list[RunRecord]:
        """Runs in a given status across all threads."""
        rows = await self._all(
            q.SELECT_RUNS_BY_STATUS, {"status": run_status(status).value, "limit": limit}
        )
        return [self._run(r) for r in rows]

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
        result = await self._request_cancel(
            thread_id, reason=reason, requested_by=requested_by, token=uuid.uuid4().hex
        )
        if result.accepted and result.run_id is not None:
            for listener in list(self._cancel_listeners):
                listener(thread_id, result.run_id)
            if cascade:
                for child in await self.achild_runs(result.run_id):
                    if not child.terminal:
                        await self.arequest_cancel(
                            child.thread_id,
                            reason=f"parent run {result.run_id} cancelled: {reason}",
                            requested_by=requested_by,
                        )
        return result

    @atransient_retry()
    async def _request_cancel(
        self, thread_id: str, *, reason: str, requested_by: str, token: str
    ) -> CancelRequestResult:
        b = self.backend
        async with b.transaction() as cur:
            await cur.execute(q.SELECT_ACTIVE_RUN, {"thread_id": thread_id})
            active = await cur.fetchone()
            if active is None:
                await cur.execute(q.SELECT_LATEST_RUN, {"thread_id": thread_id})
                latest = await cur.fetchone()
                if latest is None:
                    raise UnknownThreadError(thread_id)
                return d.nothing_to_cancel(self._run(latest))
            await cur.execute(
                q.REQUEST_CANCEL,
                d.cancel_params(
                    active["run_id"],
                    reason=reason,
                    requested_by=requested_by,
                    token=token,
                    now=utcnow(),
                    codec=b,
                ),
            )
            updated = await cur.fetchone()
            if updated is not None:
                await b.announce_cancel(cur, thread_id, active["run_id"])
            else:
                # Another writer moved the run since our SELECT: answer with its state now.
                await cur.execute(q.SELECT_RUN, {"run_id": active["run_id"]})
                active = await cur.fetchone() or active
        return d.cancel_verdict(updated, active, token, b)

    @atransient_retry()
    async def amark_observed(self, run_id: str) -> RunRecord:
        """Record that the run saw its cancel signal: ``cancel_requested -> cancelling``."""
        now = self.backend.ts_in(utcnow())
        async with self.backend.statement() as cur:
            await cur.execute(q.MARK_OBSERVED, {"run_id": run_id, "now": now})
            row = await cur.fetchone()
            if row is None:
                await cur.execute(q.SELECT_RUN, {"run_id": run_id})
                row = await cur.fetchone()
                if row is None:
                    raise UnknownRunError(run_id)
            return self._run(row)

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
        target = run_status(status)
        d.check_finish_target(run_id, target)
        return await self._finish_run(
            run_id,
            target,
            report=report,
            quiesced_at=quiesced_at,
            tokens_after_cancel=tokens_after_cancel,
            token=uuid.uuid4().hex,
            release_lease=release_lease,
        )

    @atransient_retry()
    async def _finish_run(
        self,
        run_id: str,
        target: RunStatus,
        *,
        report: dict[str, Any] | None,
        quiesced_at: datetime | None,
        tokens_after_cancel: int | None,
        token: str,
        release_lease: str | None,
    ) -> bool:
        b = self.backend
        finish = d.finish_statement(target)
        params = d.finish_params(
            run_id,
            target,
            report=report,
            quiesced_at=quiesced_at,
            tokens_after_cancel=tokens_after_cancel,
            token=token,
            release_lease=release_lease,
            now=utcnow(),
            codec=b,
        )
        if release_lease is None:
            async with b.statement() as cur:
                await cur.execute(finish, params)
                finished = await cur.fetchone()
        else:  # the release is a no-op unless this finish wrote the run's status
            finished, _ = await b.first_rows(
                [(finish, params), (q.RELEASE_LEASE_AFTER_FINISH, params)]
            )
        if finished is not None:
            return True
        row = await self._one(q.SELECT_RUN, {"run_id": run_id})
        if row is None:
            raise UnknownRunError(run_id)
        return d.finish_verdict(row, target, token)

    @atransient_retry()
    async def aadd_tokens_after_cancel(self, run_id: str, tokens: int) -> None:
        """Count model tokens received after the run's cancel signal."""
        async with self.backend.transaction() as cur:
            await cur.execute(q.ADD_TOKENS_AFTER_CANCEL, {"run_id": run_id, "tokens": int(tokens)})

    @atransient_retry()
    async def aadd_tokens_used(self, run_id: str, tokens: int) -> int:
        """Count model tokens the run used; returns the run's new total.

        Raises:
            UnknownRunError: If there is no such run.
        """
        async with self.backend.transaction() as cur:
            await cur.execute(q.ADD_TOKENS_USED, {"run_id": run_id, "tokens": int(tokens)})
            row = await cur.fetchone()
        if row is None:
            raise UnknownRunError(run_id)
        return int(row["tokens_used"])

    @atransient_retry()
    async def adelete_thread(self, thread_id: str) -> None:
        """Forget a thread's runs and effects (audit rows are kept)."""
        async with self.backend.transaction() as cur:
            await cur.execute(q.DELETE_THREAD_EFFECTS, {"thread_id": thread_id})
            await cur.execute(q.DELETE_THREAD_RUNS, {"thread_id": thread_id})


__all__ = ["AsyncRunLedger"]


__all__ = ["AsyncRunLedger"]

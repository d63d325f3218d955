"""The sync ledger's runs: starting one, cancel requests, the one terminal transition."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from langgraph_cancel.errors import UnknownRunError, UnknownThreadError
from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.leases import LeaseLedger
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.store import to_thread
from langgraph_cancel.types import (
    CancelRequestResult,
    EffectRecord,
    RunRecord,
    RunStatus,
    run_status,
    utcnow,
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
        run, _ = self._start_run(thread_id, run_id, owner, parent_run_id, lease_ttl, False)
        return run

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
        run, unsettled = self._start_run(thread_id, run_id, owner, parent_run_id, lease_ttl, True)
        assert unsettled is not None
        return run, unsettled

    def _start_run(
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
        # Insert first: new input on a finished thread (the common case) is one
        # statement. The partial unique index turns it into a no-op when the thread
        # has a live run, which is then read.
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
        results = b.all_rows(statements)
        if lease_ttl is not None and not results[0]:
            # Held by another owner, or let go in between: acquire_lease tells which.
            self.acquire_lease(thread_id, owner or "", ttl=lease_ttl)
            return self._start_run(thread_id, run_id, owner, parent_run_id, None, with_unsettled)
        created = results[1 if lease_ttl is not None else 0]
        unsettled = [self._effect(r) for r in results[-1]] if with_unsettled else None
        row = created[0] if created else None
        if row is None:  # the thread's live run (or a run id clash)
            row = self._one(q.SELECT_ACTIVE_RUN, {"thread_id": thread_id})
            if row is None:
                raise UnknownRunError(run_id or "")
        return self._run(row), unsettled

    @transient_retry()
    def get_run(self, run_id: str) -> RunRecord:
        """The run with this id.

        Raises:
            UnknownRunError: If there is none.
        """
        row = self._one(q.SELECT_RUN, {"run_id": run_id})
        if row is None:
            raise UnknownRunError(run_id)
        return self._run(row)

    @transient_retry()
    def active_run(self, thread_id: str) -> RunRecord | None:
        """The thread's live (not terminal) run, if any."""
        row = self._one(q.SELECT_ACTIVE_RUN, {"thread_id": thread_id})
        return None if row is None else self._run(row)

    @transient_retry()
    def latest_run(self, thread_id: str) -> RunRecord | None:
        """The thread's most recent run, live or not."""
        row = self._one(q.SELECT_LATEST_RUN, {"thread_id": thread_id})
        return None if row is None else self._run(row)

    def require_latest_run(self, thread_id: str) -> RunRecord:
        """The thread's most recent run.

        Raises:
            UnknownThreadError: If the ledger has never seen the thread.
        """
        run = self.latest_run(thread_id)
        if run is None:
            raise UnknownThreadError(thread_id)
        return run

    @transient_retry()
    def runs(self, thread_id: str) -> list[RunRecord]:
        """Every run of a thread, oldest first."""
        return [self._run(r) for r in self._all(q.SELECT_THREAD_RUNS, {"thread_id": thread_id})]

    @transient_retry()
    def child_runs(self, run_id: str) -> list[RunRecord]:
        """Runs registered as children (sub-agents) of ``run_id``."""
        return [self._run(r) for r in self._all(q.SELECT_CHILD_RUNS, {"run_id": run_id})]

    @transient_retry()
    def runs_by_status(self, status: RunStatus | str, *, limit: int = 1000) -> list[RunRecord]:
        """Runs in a given status across all threads."""
        st = run_status(status)
        rows = self._all(q.SELECT_RUNS_BY_STATUS, {"status": st.value, "limit": limit})
        return [self._run(r) for r in rows]

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
        result = self._request_cancel(
            thread_id, reason=reason, requested_by=requested_by, token=uuid.uuid4().hex
        )
        if result.accepted and result.run_id is not None:
            for listener in list(self._cancel_listeners):
                listener(thread_id, result.run_id)
            if cascade:
                for child in self.child_runs(result.run_id):
                    if not child.terminal:
                        self.request_cancel(
                            child.thread_id,
                            reason=f"parent run {result.run_id} cancelled: {reason}",
                            requested_by=requested_by,
                        )
        return result

    @transient_retry()
    def _request_cancel(
        self, thread_id: str, *, reason: str, requested_by: str, token: str
    ) -> CancelRequestResult:
        now = utcnow()
        with self.backend.transaction() as cur:
            cur.execute(q.SELECT_ACTIVE_RUN, {"thread_id": thread_id})
            active = cur.fetchone()
            if active is None:
                cur.execute(q.SELECT_LATEST_RUN, {"thread_id": thread_id})
                latest = cur.fetchone()
                if latest is None:
                    raise UnknownThreadError(thread_id)
                return d.nothing_to_cancel(self._run(latest))
            cur.execute(
                q.REQUEST_CANCEL,
                d.cancel_params(
                    active["run_id"],
                    reason=reason,
                    requested_by=requested_by,
                    token=token,
                    now=now,
                    codec=self.backend,
                ),
            )
            updated = cur.fetchone()
            if updated is not None:
                self.backend.announce_cancel(cur, thread_id, active["run_id"])
            else:
                # Another writer moved the run since our SELECT (PostgreSQL, READ
                # COMMITTED): answer with its current state, not the stale snapshot.
                cur.execute(q.SELECT_RUN, {"run_id": active["run_id"]})
                active = cur.fetchone() or active
        return d.cancel_verdict(updated, active, token, self.backend)

    @transient_retry()
    def mark_observed(self, run_id: str) -> RunRecord:
        """Record that the run saw its cancel signal: ``cancel_requested -> cancelling``."""
        now = self.backend.ts_in(utcnow())
        with self.backend.statement() as cur:
            cur.execute(q.MARK_OBSERVED, {"run_id": run_id, "now": now})
            row = cur.fetchone()
            if row is None:
                cur.execute(q.SELECT_RUN, {"run_id": run_id})
                row = cur.fetchone()
                if row is None:
                    raise UnknownRunError(run_id)
            return self._run(row)

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
        target = run_status(status)
        d.check_finish_target(run_id, target)
        return self._finish_run(
            run_id,
            target,
            report=report,
            quiesced_at=quiesced_at,
            tokens_after_cancel=tokens_after_cancel,
            token=uuid.uuid4().hex,
            release_lease=release_lease,
        )

    @transient_retry()
    def _finish_run(
        self,
        run_id: str,
        target: RunStatus,
        *,
        report: dict[str, Any] | None,
        quiesced_at: datetime | None,
        tokens_after_cancel: int | None,
        token: str,
        release_lease: str | None = None,
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
            with b.statement() as cur:
                cur.execute(finish, params)
                finished = cur.fetchone()
        else:  # the release is a no-op unless this finish wrote the run's status
            finished, _ = b.first_rows([(finish, params), (q.RELEASE_LEASE_AFTER_FINISH, params)])
        if finished is not None:
            return True
        row = self._one(q.SELECT_RUN, {"run_id": run_id})
        if row is None:
            raise UnknownRunError(run_id)
        return d.finish_verdict(row, target, token)

    @transient_retry()
    def add_tokens_after_cancel(self, run_id: str, tokens: int) -> None:
        """Count model tokens received after the run's cancel signal."""
        with self.backend.transaction() as cur:
            cur.execute(q.ADD_TOKENS_AFTER_CANCEL, {"run_id": run_id, "tokens": int(tokens)})

    @transient_retry()
    def add_tokens_used(self, run_id: str, tokens: int) -> int:
        """Count model tokens the run used; returns the run's new total.

        Raises:
            UnknownRunError: If there is no such run.
        """
        with self.backend.transaction() as cur:
            cur.execute(q.ADD_TOKENS_USED, {"run_id": run_id, "tokens": int(tokens)})
            row = cur.fetchone()
        if row is None:
            raise UnknownRunError(run_id)
        return int(row["tokens_used"])

    @transient_retry()
    def delete_thread(self, thread_id: str) -> None:
        """Forget a thread's runs and effects (audit rows are kept)."""
        with self.backend.transaction() as cur:
            cur.execute(q.DELETE_THREAD_EFFECTS, {"thread_id": thread_id})
            cur.execute(q.DELETE_THREAD_RUNS, {"thread_id": thread_id})

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

"""The effect ledger: runs, effects, their audit trail and worker leases.

Every write is atomic: one transaction, or on PostgreSQL one self-contained
statement in autocommit (a writable CTE carries the audit row). Every
transition is a compare-and-set whose ``WHERE`` clause the database
evaluates; Python only decides which "from" statuses are legal. A write that
loses its connection is retried, and the retry recognises its own earlier
success by a write token (the DBOS pattern: "already recorded by me?" versus
"moved by someone else?").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from langgraph_cancel.errors import (
    DispatchRefusedError,
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    LedgerError,
    ThreadBusyError,
    UnknownEffectError,
    UnknownRunError,
    UnknownThreadError,
)
from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.backends import (
    Backend,
    Cursor,
    PostgresBackend,
    backend_from_url,
    json_text,
    transient_retry,
)
from langgraph_cancel.ledger.decisions import (
    default_owner,
    derive_effect_id,
    derive_idempotency_key,
)
from langgraph_cancel.types import (
    CancelRequestResult,
    EffectKind,
    EffectRecord,
    EffectStatus,
    LeaseRecord,
    LeaseTakeover,
    LeaseTakeoverCause,
    NewEffect,
    RunRecord,
    RunStatus,
    TransitionRecord,
    TransitionRequest,
    effect_kind,
    effect_status,
    run_status,
    utcnow,
)
from langgraph_cancel.workers import holder_is_gone

P = ParamSpec("P")
R = TypeVar("R")

CancelListener = Callable[[str, str], None]

logger = logging.getLogger("langgraph_cancel")


def _to_thread(fn: Callable[P, R]) -> Callable[P, Any]:
    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return wrapper


class Ledger:
    """The effect ledger on memory, SQLite or PostgreSQL.

    Sync methods, each with an ``a``-prefixed async twin. Create one with
    ``Ledger.from_url(url)`` or get the one a ``*CancelSaver`` owns.

    Args:
        backend: The database to use.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.url = backend.url
        self._setup_done = False
        self._cancel_listeners: list[CancelListener] = []

    # ------------------------------------------------------------------ life
    @classmethod
    def from_url(cls, url: str, *, setup: bool = True) -> Ledger:
        """Open the ledger a URL names.

        Args:
            url: ``memory://``, ``sqlite:///relative.db``, ``sqlite:////abs/path.db``
                or ``postgresql://user@host:port/db``.
            setup: Run ``setup()`` (idempotent migrations) before returning.

        Raises:
            InvalidURLError: For anything else.
        """
        ledger = cls(backend_from_url(url))
        if setup:
            ledger.setup()
        return ledger

    def setup(self) -> None:
        """Create or migrate the ledger's tables. Safe to call any number of times."""
        if self._setup_done:
            return
        self._setup_once()
        self._setup_done = True

    @transient_retry()
    def _setup_once(self) -> None:
        migrations = self.backend.migrations
        with self.backend.transaction() as cur:
            if self.backend.dialect == "postgres":
                # Serialize concurrent setup() calls from many workers.
                cur.execute("SELECT pg_advisory_xact_lock(7231900118)")
            cur.execute(migrations[0][0])
            cur.execute(q.SELECT_VERSION)
            row = cur.fetchone()
            current = -1 if row is None else next(iter(row.values()))
            current = -1 if current is None else int(current)
            for version, statements in enumerate(migrations):
                if version <= current:
                    continue
                for statement in statements:
                    cur.execute(statement)
                cur.execute(q.INSERT_VERSION, {"v": version})

    def close(self) -> None:
        """Close the connections this ledger opened."""
        self.backend.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_cancel_listener(self, listener: CancelListener) -> None:
        """Call ``listener(thread_id, run_id)`` when this process requests a cancel."""
        self._cancel_listeners.append(listener)

    # ------------------------------------------------------------- decoding
    # Rows the ledger wrote itself: records are built without re-validating them.
    def _run(self, row: dict[str, Any]) -> RunRecord:
        return d.run_record(row, self.backend)

    def _effect(self, row: dict[str, Any]) -> EffectRecord:
        return d.effect_record(row, self.backend)

    def _lease(self, row: dict[str, Any]) -> LeaseRecord:
        return d.lease_record(row, self.backend)

    def _one(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        with self.backend.read() as cur:
            cur.execute(sql, params)
            row: dict[str, Any] | None = cur.fetchone()
            return row

    def _all(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self.backend.read() as cur:
            cur.execute(sql, params)
            rows: list[dict[str, Any]] = cur.fetchall()
            return rows

    # ----------------------------------------------------------------- runs
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
            if updated is not None and self.backend.dialect == "postgres":
                cur.execute(q.NOTIFY_CANCEL, d.cancel_notice(thread_id, active["run_id"]))
            elif updated is None:
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

    # -------------------------------------------------------------- effects
    def plan(
        self,
        *,
        thread_id: str,
        run_id: str,
        tool_call_id: str,
        tool: str,
        kind: EffectKind | str,
        args: dict[str, Any],
        idempotency_key: str | None = None,
        seq: int = 0,
        status: EffectStatus | str = EffectStatus.PLANNED,
        result: Any = None,
        error: str | None = None,
        owner: str | None = None,
        actor: str = "system",
        detail: dict[str, Any] | None = None,
    ) -> tuple[EffectRecord, bool]:
        """Insert a tool call's record, or return the one already there.

        The effect id is derived from thread and tool-call id, so a re-run of
        the same node finds its earlier record instead of creating another.

        Returns:
            ``(record, created)``.

        Raises:
            DuplicateIdempotencyKeyError: When another effect already owns the key.
        """
        st = effect_status(status)
        if st not in d.INITIAL_STATUSES:
            raise IllegalTransitionError(tool_call_id, "(new)", st.value, "not an initial status")
        return self._plan(
            thread_id=thread_id,
            run_id=run_id,
            tool_call_id=tool_call_id,
            tool=tool,
            kind=effect_kind(kind),
            args=args,
            key=idempotency_key or derive_idempotency_key(thread_id, tool_call_id),
            seq=seq,
            status=st,
            result=result,
            error=error,
            owner=owner,
            actor=actor,
            detail=detail,
        )

    def _plan_once(
        self,
        *,
        thread_id: str,
        run_id: str,
        tool_call_id: str,
        tool: str,
        kind: EffectKind,
        args: dict[str, Any],
        key: str,
        seq: int,
        status: EffectStatus,
        result: Any,
        error: str | None,
        owner: str | None,
        actor: str,
        detail: dict[str, Any] | None,
    ) -> tuple[EffectRecord, bool]:
        b = self.backend
        effect_id = derive_effect_id(thread_id, tool_call_id)
        params = d.plan_params(
            effect_id=effect_id,
            thread_id=thread_id,
            run_id=run_id,
            tool_call_id=tool_call_id,
            tool=tool,
            kind=kind.value,
            status=status,
            key=key,
            args=args,
            seq=seq,
            result=result,
            error=error,
            owner=owner,
            actor=actor,
            detail=detail,
            now=utcnow(),
            codec=b,
        )
        try:
            if b.dialect == "postgres":
                with b.statement() as cur:
                    cur.execute(q.PG_INSERT_EFFECT, params)
                    row = cur.fetchone()
                    if row is None:
                        cur.execute(q.SELECT_EFFECT, {"effect_id": effect_id})
                        existing = cur.fetchone()
                        assert existing is not None
                        return self._effect(existing), False
                    return self._effect(row), True
            with b.transaction() as cur:
                cur.execute(q.INSERT_EFFECT, params)
                row = cur.fetchone()
                if row is None:
                    cur.execute(q.SELECT_EFFECT, {"effect_id": effect_id})
                    existing = cur.fetchone()
                    assert existing is not None
                    return self._effect(existing), False
                cur.execute(q.INSERT_TRANSITION, d.plan_audit(params))
                return self._effect(row), True
        except Exception as exc:
            if d.is_unique_violation(exc):
                other = self._one(q.SELECT_EFFECT_BY_KEY, {"key": key})
                if other is not None and other["effect_id"] == effect_id:
                    # The same tool call planned concurrently: on PostgreSQL ON CONFLICT
                    # (effect_id) does not cover the racing insert's key index.
                    return self._effect(other), False
                if other is not None and other["status"] == EffectStatus.NOT_APPLIED.value:
                    self._give_up_not_applied(other["effect_id"], taker=effect_id, actor=actor)
                if other is not None and self._release_unsent_key(key, effect_id):
                    # The holder never reached the external system: the key is free.
                    return self._plan_once(
                        thread_id=thread_id,
                        run_id=run_id,
                        tool_call_id=tool_call_id,
                        tool=tool,
                        kind=kind,
                        args=args,
                        key=key,
                        seq=seq,
                        status=status,
                        result=result,
                        error=error,
                        owner=owner,
                        actor=actor,
                        detail=detail,
                    )
                raise DuplicateIdempotencyKeyError(
                    key, other["effect_id"] if other else None
                ) from exc
            raise

    def _give_up_not_applied(self, holder: str, *, taker: str, actor: str) -> None:
        """Drop a ``not_applied`` key holder so that its key can go to ``taker``.

        The external system has no record of the holder's call, so the key may
        serve a new call as if the holder had never been sent. Dropped first, it
        cannot be dispatched again under the key it gives away: a racing re-run
        of the holder wins the compare-and-set or finds it dropped.
        """
        with contextlib.suppress(IllegalTransitionError):
            self.transition(
                holder,
                EffectStatus.DROPPED,
                expected=[EffectStatus.NOT_APPLIED],
                actor=actor,
                detail={"key_taken_by": taker},
            )

    def _release_unsent_key(self, key: str, taker: str) -> bool:
        """Free ``key`` if its holder was never dispatched (dropped or rejected)."""
        with self.backend.statement() as cur:
            cur.execute(q.RELEASE_UNSENT_KEY, d.released_key(key, taker))
            return cur.fetchone() is not None

    _plan = transient_retry()(_plan_once)

    def plan_many(
        self,
        *,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        owner: str | None = None,
        actor: str = "system",
    ) -> list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError]:
        """Record a batch of tool calls at once: ``plan`` for many, one statement.

        Rows already recorded (a re-run) are returned as they are. A call whose
        idempotency key another effect holds is not recorded; its slot holds
        the ``DuplicateIdempotencyKeyError`` instead of a record, so one clash
        does not cost the rest of the batch.

        Returns:
            One entry per item, in order: ``(record, created)`` or the error.

        Raises:
            IllegalTransitionError: An item's status is not an initial one.
        """
        d.check_initial(items)
        if not items:
            return []
        try:
            found = self._plan_many(thread_id, run_id, items, owner, actor, read_back=True)
        except Exception as exc:
            if not (isinstance(exc, DuplicateIdempotencyKeyError) or d.is_unique_violation(exc)):
                raise
            return self._plan_each(thread_id, run_id, items, owner, actor)
        return d.first_created_once(items, [found[item.tool_call_id] for item in items])

    def record_many(
        self,
        *,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        owner: str | None = None,
        actor: str = "system",
    ) -> list[DuplicateIdempotencyKeyError | None]:
        """``plan_many`` for a caller that does not need the records back.

        The same rows and audit entries are written (rows already recorded are
        left alone), but nothing is read back: the outcomes of read-only calls,
        recorded once the batch is back, need only know which keys were taken.

        Returns:
            One entry per item, in order: ``None`` (recorded, now or before) or
            the ``DuplicateIdempotencyKeyError`` that kept it out.

        Raises:
            IllegalTransitionError: An item's status is not an initial one.
        """
        d.check_initial(items)
        if not items:
            return []
        try:
            self._plan_many(thread_id, run_id, items, owner, actor, read_back=False)
        except Exception as exc:
            if not (isinstance(exc, DuplicateIdempotencyKeyError) or d.is_unique_violation(exc)):
                raise
            entries = self._plan_each(thread_id, run_id, items, owner, actor)
            return [e if isinstance(e, DuplicateIdempotencyKeyError) else None for e in entries]
        return [None] * len(items)

    def _plan_each(
        self,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        owner: str | None,
        actor: str,
    ) -> list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError]:
        """Some key of the batch is taken: record it one call at a time to tell which."""
        found: dict[str, tuple[EffectRecord, bool]] = {}
        errors: dict[str, DuplicateIdempotencyKeyError] = {}
        for item in items:
            if item.tool_call_id in found or item.tool_call_id in errors:
                continue
            try:
                found[item.tool_call_id] = self._plan(
                    **d.plan_fields(thread_id, run_id, item), owner=owner, actor=actor
                )
            except DuplicateIdempotencyKeyError as dup:
                errors[item.tool_call_id] = dup
        out: list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError] = []
        for item in items:
            out.append(errors.get(item.tool_call_id) or found[item.tool_call_id])
        return d.first_created_once(items, out)

    @transient_retry()
    def _plan_many(
        self,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        owner: str | None,
        actor: str,
        *,
        read_back: bool,
    ) -> dict[str, tuple[EffectRecord, bool]]:
        """Insert the batch; with ``read_back``, every item's record by tool-call id
        (else an empty dict)."""
        b = self.backend
        unique: dict[str, NewEffect] = {}
        for item in items:
            unique.setdefault(item.tool_call_id, item)
        if b.dialect != "postgres":
            return self._sqlite_plan_many(thread_id, run_id, unique, owner, actor, read_back)
        if len(unique) == 1:  # the one-row statement plans and runs faster than a row set
            ((call_id, item),) = unique.items()
            return {
                call_id: self._plan_once(
                    **d.plan_fields(thread_id, run_id, item), owner=owner, actor=actor
                )
            }
        rows = d.pg_plan_rows(thread_id, run_id, unique)
        params = {
            # One JSON document, not an array per column: psycopg quotes every array
            # element in Python, which cost more than the server's insert.
            "rows": json_text(rows),
            "thread_id": thread_id,
            "run_id": run_id,
            "owner": owner,
            "actor": actor,
            "now": b.ts_in(utcnow()),
        }
        found: dict[str, tuple[EffectRecord, bool]] = {}
        with b.statement() as cur:
            cur.execute(q.PG_INSERT_EFFECTS, params)
            if not read_back:
                return found
            for row in cur.fetchall():
                found[row["tool_call_id"]] = (self._effect(row), True)
            missing = [r["effect_id"] for r in rows if r["tool_call_id"] not in found]
            if missing:
                cur.execute(q.PG_SELECT_EFFECTS_ANY, {"ids": missing})
                for row in cur.fetchall():
                    found[row["tool_call_id"]] = (self._effect(row), False)
        return found

    def _sqlite_plan_many(
        self,
        thread_id: str,
        run_id: str,
        unique: dict[str, NewEffect],
        owner: str | None,
        actor: str,
        read_back: bool,
    ) -> dict[str, tuple[EffectRecord, bool]]:
        """SQLite: one transaction, a statement per step (not per call).

        A taken idempotency key fails the whole insert (rolled back); the caller
        then records the batch call by call to tell which key it was. The new
        records are built from the rows as inserted (the writer lock is held, so
        nothing else wrote them); only rows recorded before are read.
        """
        b = self.backend
        now = b.ts_in(utcnow())
        ids = {call_id: derive_effect_id(thread_id, call_id) for call_id in unique}
        found: dict[str, tuple[EffectRecord, bool]] = {}
        with b.transaction() as cur:
            known = {
                row["effect_id"]: row
                for row in _select_in(
                    cur,
                    q.SELECT_EFFECTS_IN if read_back else q.SELECT_EFFECT_IDS_IN,
                    list(ids.values()),
                )
            }
            new: dict[str, NewEffect] = {}
            for call_id, item in unique.items():
                if ids[call_id] not in known:
                    new[call_id] = item
                elif read_back:
                    found[call_id] = (self._effect(known[ids[call_id]]), False)
            rows, audits = d.sqlite_plan_rows(
                thread_id, run_id, new, ids, owner=owner, actor=actor, now=now, codec=b
            )
            if rows:
                cur.executemany(q.INSERT_EFFECT_ROW, rows)
                cur.executemany(q.INSERT_TRANSITION, audits)
        if read_back:
            for row in rows:
                found[row["tool_call_id"]] = (d.inserted_record(row, now, b), True)
        return found

    @transient_retry()
    def find_effects(self, thread_id: str, tool_call_ids: Sequence[str]) -> dict[str, EffectRecord]:
        """The recorded effects of several tool calls of a thread, in one read.

        Returns:
            The records found, by tool-call id (calls never recorded are absent).
        """
        ids = list(dict.fromkeys(derive_effect_id(thread_id, c) for c in tool_call_ids))
        if not ids:
            return {}
        if self.backend.dialect == "postgres":
            rows = self._all(q.PG_SELECT_EFFECTS_ANY, {"ids": ids})
        else:
            with self.backend.read() as cur:
                rows = _select_in(cur, q.SELECT_EFFECTS_IN, ids)
        return {row["tool_call_id"]: self._effect(row) for row in rows}

    def transition(
        self,
        effect_id: str,
        to: EffectStatus | str,
        *,
        expected: Iterable[EffectStatus | str] | None = None,
        actor: str = "system",
        detail: dict[str, Any] | None = None,
        result: Any = ...,
        error: Any = ...,
        owner: str | None = None,
        next_action: Any = ...,
        approval: dict[str, Any] | None = None,
        args: dict[str, Any] | None = None,
        require_active_run: bool | None = None,
    ) -> EffectRecord:
        """Move an effect to ``to`` if, and only if, it is in an allowed status.

        Args:
            effect_id: The effect.
            to: The target status.
            expected: The statuses the caller believes the effect is in
                (default: every legal predecessor of ``to``, except ``dispatched``
                itself for ``to=dispatched``: a repeat dispatch must be explicit).
            actor: Who is acting (kept in the audit trail).
            detail: Free-form audit detail.
            result: The outcome to record (leave out to keep the current one).
            error: The error text to record (leave out to keep it).
            owner: Who owns the effect now (kept when ``None``).
            next_action: What must happen next (for ``unknown``).
            approval: The approval decision to record.
            args: Replacement arguments (an approved edit).
            require_active_run: Refuse unless the run is ``running``; defaults
                to true for ``dispatched`` (no dispatch after the cancel signal).

        Raises:
            IllegalTransitionError: The state machine forbids the move.
            TransitionConflictError: Another writer moved the effect first.
            DispatchRefusedError: ``dispatched`` was refused: the run is not running.
            UnknownEffectError: No such effect.
        """
        req = TransitionRequest(
            effect_id=effect_id,
            to=effect_status(to),
            expected=None if expected is None else frozenset(effect_status(s) for s in expected),
            actor=actor,
            detail=detail,
            result=result,
            error=error,
            owner=owner,
            next_action=next_action,
            approval=approval,
            args=args,
            require_active_run=require_active_run,
        )
        allowed, guard = d.checked(req)
        return self._transition(req, allowed, guard, uuid.uuid4().hex)

    def transition_many(
        self, requests: Sequence[TransitionRequest]
    ) -> list[EffectRecord | LedgerError]:
        """Several compare-and-sets at once: one statement on PostgreSQL, one transaction
        on SQLite. Each succeeds or fails on its own, as ``transition`` would.

        Returns:
            One entry per request, in order: the moved record, or the error
            ``transition`` would have raised for it (conflict, refusal, unknown effect).

        Raises:
            IllegalTransitionError: A request the state machine forbids outright.
            ValueError: The same effect twice in one call.
        """
        checked = [d.checked(r) for r in requests]
        if len({r.effect_id for r in requests}) != len(requests):
            raise ValueError("transition_many: one request per effect")
        if not requests:
            return []
        tokens = [uuid.uuid4().hex for _ in requests]
        return self._transition_many(requests, checked, tokens)

    @transient_retry()
    def _transition_many(
        self,
        requests: Sequence[TransitionRequest],
        checked: Sequence[tuple[frozenset[EffectStatus], bool]],
        tokens: Sequence[str],
    ) -> list[EffectRecord | LedgerError]:
        b = self.backend
        out: list[EffectRecord | LedgerError] = []
        jobs = list(zip(requests, checked, tokens, strict=True))
        if not isinstance(b, PostgresBackend):
            with b.transaction() as _cur:  # one transaction for all of them
                for req, (allowed, guard), token in jobs:
                    try:
                        out.append(self._transition_once(req, allowed, guard, token))
                    except LedgerError as exc:
                        out.append(exc)
            return out
        rows = self._pg_transitions(jobs)
        lost: list[tuple[int, str]] = []
        for n, ((req, _, _), row) in enumerate(zip(jobs, rows, strict=True)):
            out.append(self._effect(row) if row is not None else UnknownEffectError(req.effect_id))
            if row is None:
                lost.append((n, req.effect_id))
        if lost:
            before = {
                row["effect_id"]: row
                for row in self._all(q.PG_SELECT_EFFECTS_ANY, {"ids": [e for _, e in lost]})
            }
            for n, effect_id in lost:
                req, (allowed, guard), token = jobs[n]
                row = before.get(effect_id)
                if row is None:
                    out[n] = UnknownEffectError(f"no effect {effect_id!r} in the ledger")
                    continue
                try:
                    out[n] = self._lost_transition(row, req.to, allowed, guard, token)
                except LedgerError as exc:
                    out[n] = exc
        return out

    def _pg_transitions(
        self, jobs: Sequence[tuple[TransitionRequest, tuple[frozenset[EffectStatus], bool], str]]
    ) -> list[dict[str, Any] | None]:
        """PostgreSQL: the compare-and-sets of ``jobs`` in one statement; per job, the
        moved row or None (it did not apply).

        One statement rather than a pipeline of one per request: psycopg's pipeline
        costs more client CPU than the server spends on the rows.
        """
        b = self.backend
        if len(jobs) == 1:  # the one-row statement runs faster than a row set
            ((req, (allowed, guard), token),) = jobs
            with b.statement() as cur:
                cur.execute(*self._pg_cas(req, allowed, guard, token, utcnow()))
                return [cur.fetchone()]
        rows = d.pg_transition_rows(jobs)
        moved: list[dict[str, Any] | None] = [None] * len(jobs)
        with b.statement() as cur:
            cur.execute(
                q.PG_TRANSITION_EFFECTS,
                {
                    "rows": json_text(rows),
                    "ids": [req.effect_id for req, _, _ in jobs],
                    "now": b.ts_in(utcnow()),
                },
            )
            for row in cur.fetchall():
                moved[row["n"]] = row
        return moved

    def _pg_cas(
        self,
        req: TransitionRequest,
        allowed: frozenset[EffectStatus],
        guard: bool,
        token: str,
        now: datetime,
    ) -> tuple[str, dict[str, Any]]:
        """PostgreSQL's compare-and-set with its audit row: one statement and its parameters."""
        return d.cas_statement(
            q.PG_TRANSITION_EFFECT, req, allowed, guard, token, now, self.backend
        )

    def _transition_once(
        self,
        req: TransitionRequest,
        allowed: frozenset[EffectStatus],
        guard: bool,
        token: str,
    ) -> EffectRecord:
        b = self.backend
        now = utcnow()
        effect_id = req.effect_id
        if b.dialect == "postgres":
            with b.statement() as cur:
                cur.execute(*self._pg_cas(req, allowed, guard, token, now))
                row = cur.fetchone()
                if row is not None:
                    return self._effect(row)
                cur.execute(q.SELECT_EFFECT, {"effect_id": effect_id})
                before = cur.fetchone()
            if before is None:
                raise UnknownEffectError(f"no effect {effect_id!r} in the ledger")
            return self._lost_transition(before, req.to, allowed, guard, token)
        audit, params = d.cas_statement(
            q.SQLITE_AUDIT_TRANSITION, req, allowed, guard, token, now, b
        )
        update, _ = d.cas_statement(q.SQLITE_TRANSITION_EFFECT, req, allowed, guard, token, now, b)
        with b.transaction() as cur:
            cur.execute(audit, params)
            cur.execute(update, params)
            row = cur.fetchone()
            if row is not None:
                return self._effect(row)
            cur.execute(q.SELECT_EFFECT, {"effect_id": effect_id})
            before = cur.fetchone()
        if before is None:
            raise UnknownEffectError(f"no effect {effect_id!r} in the ledger")
        return self._lost_transition(before, req.to, allowed, guard, token)

    _transition = transient_retry()(_transition_once)

    def _lost_transition(
        self,
        before: dict[str, Any],
        target: EffectStatus,
        allowed: frozenset[EffectStatus],
        guard: bool,
        token: str,
    ) -> EffectRecord:
        """The compare-and-set did not apply: our own retry, a refusal, or a conflict."""
        current = self._effect(before)
        verdict = d.lost_transition(current, before["last_token"], target, allowed, guard, token)
        if verdict is d.LostCas.OWN_WRITE:
            return current
        run = self.get_run(current.run_id)
        raise DispatchRefusedError(current.effect_id, f"run {run.run_id} is {run.status.value}")

    @transient_retry()
    def get_effect(self, effect_id: str) -> EffectRecord:
        """The effect with this id.

        Raises:
            UnknownEffectError: If there is none.
        """
        row = self._one(q.SELECT_EFFECT, {"effect_id": effect_id})
        if row is None:
            raise UnknownEffectError(f"no effect {effect_id!r} in the ledger")
        return self._effect(row)

    @transient_retry()
    def find_effect(self, thread_id: str, tool_call_id: str) -> EffectRecord | None:
        """The effect of a tool call, if recorded."""
        row = self._one(q.SELECT_EFFECT, {"effect_id": derive_effect_id(thread_id, tool_call_id)})
        return None if row is None else self._effect(row)

    @transient_retry()
    def find_moved(self, thread_id: str, tool_call_id: str) -> list[EffectRecord]:
        """Effects of calls that came under ``tool_call_id`` once it named another call's
        record, each recorded as ``<tool_call_id>~<digest>`` (oldest first)."""
        rows = self._all(
            q.SELECT_MOVED_EFFECTS, {"thread_id": thread_id, "prefix": d.moved_prefix(tool_call_id)}
        )
        # SQLite's LIKE ignores ASCII case: keep exact matches only.
        prefix = f"{tool_call_id}~"
        return [self._effect(r) for r in rows if r["tool_call_id"].startswith(prefix)]

    @transient_retry()
    def effect_by_key(self, key: str) -> EffectRecord | None:
        """The effect holding an idempotency key, if any."""
        row = self._one(q.SELECT_EFFECT_BY_KEY, {"key": key})
        return None if row is None else self._effect(row)

    @transient_retry()
    def effects(self, thread_id: str) -> list[EffectRecord]:
        """Every effect of a thread, in plan order."""
        rows = self._all(q.SELECT_THREAD_EFFECTS, {"thread_id": thread_id})
        return [self._effect(r) for r in rows]

    @transient_retry()
    def run_effects(self, run_id: str) -> list[EffectRecord]:
        """Every effect of a run, in plan order."""
        return [self._effect(r) for r in self._all(q.SELECT_RUN_EFFECTS, {"run_id": run_id})]

    @transient_retry()
    def unsettled(self, thread_id: str) -> list[EffectRecord]:
        """Effects of a thread that still need something done (uses a partial index)."""
        rows = self._all(q.SELECT_UNSETTLED, {"thread_id": thread_id})
        return [self._effect(r) for r in rows]

    @transient_retry()
    def effects_by_status(
        self, status: EffectStatus | str, *, limit: int = 1000
    ) -> list[EffectRecord]:
        """Effects in one status across all threads (e.g. every ``unknown``)."""
        st = effect_status(status)
        rows = self._all(q.SELECT_BY_STATUS, {"status": st.value, "limit": limit})
        return [self._effect(r) for r in rows]

    @transient_retry()
    def history(self, effect_id: str) -> list[TransitionRecord]:
        """The audit trail of an effect, oldest first."""
        rows = self._all(q.SELECT_TRANSITIONS, {"effect_id": effect_id})
        return [d.transition_record(r, self.backend) for r in rows]

    # --------------------------------------------------------------- leases
    @transient_retry()
    def acquire_lease(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> LeaseRecord:
        """Claim a thread for ``owner`` (re-entrant for the same owner).

        A live lease whose holder is a process of this host that no longer runs (see
        ``langgraph_cancel.ledger.workers``) is taken over at once, and the takeover
        is written to the leases' audit trail (``lease_takeovers``).

        Raises:
            ThreadBusyError: Another owner holds a live lease.
        """
        b = self.backend
        params = d.lease_params(thread_id, owner, utcnow(), ttl, b)
        with b.statement() as cur:
            cur.execute(q.ACQUIRE_LEASE, params)
            row = cur.fetchone()
            if row is not None:
                return self._lease(row)
            cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
            held = cur.fetchone()
            if held is None:  # released between our insert and our look
                cur.execute(q.ACQUIRE_LEASE, params)
                taken = cur.fetchone()
                if taken is not None:
                    return self._lease(taken)
                cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
                held = cur.fetchone()
                assert held is not None
        lease = self._lease(held)
        if holder_is_gone(lease.owner):
            took = self._take_over_lease(lease, owner, ttl, LeaseTakeoverCause.HOLDER_GONE)
            if took is not None:
                return took
            return self.acquire_lease(thread_id, owner, ttl=ttl)  # someone else was first
        raise ThreadBusyError(thread_id, lease.owner, lease.expires_at.isoformat())

    def _take_over_lease(
        self, held: LeaseRecord, owner: str, ttl: float, cause: LeaseTakeoverCause
    ) -> LeaseRecord | None:
        """Take ``held`` for ``owner`` if its holder still has it, with the audit row."""
        b = self.backend
        now = utcnow()
        params = d.lease_params(held.thread_id, owner, now, ttl, b)
        with b.transaction() as cur:
            cur.execute(q.TAKE_OVER_LEASE, {**params, "previous_owner": held.owner})
            row = cur.fetchone()
            if row is None:
                return None
            cur.execute(
                q.INSERT_LEASE_TAKEOVER,
                {**params, "previous_owner": held.owner, "cause": cause.value},
            )
        logger.info(
            "took over the lease on thread %s from %s (%s)", held.thread_id, held.owner, cause.value
        )
        return self._lease(row)

    @transient_retry()
    def break_lease(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> LeaseRecord | None:
        """Take the thread's lease for ``owner`` whoever holds it (``resume --force``).

        Returns:
            The lease taken, or None when nobody held one (then nothing was written).
        """
        held = self.lease(thread_id)
        if held is None or held.owner == owner:
            return None
        return self._take_over_lease(held, owner, ttl, LeaseTakeoverCause.FORCED)

    @transient_retry()
    def lease_takeovers(self, thread_id: str) -> list[LeaseTakeover]:
        """The leases' audit trail for a thread: who took it from whom, why, when."""
        rows = self._all(q.SELECT_LEASE_TAKEOVERS, {"thread_id": thread_id})
        return [d.lease_takeover_record(r, self.backend) for r in rows]

    @transient_retry()
    def leases(self) -> list[LeaseRecord]:
        """Every lease, live or expired."""
        return [self._lease(r) for r in self._all(q.SELECT_LEASES, {})]

    @transient_retry()
    def heartbeat(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> bool:
        """Extend ``owner``'s lease; False if it no longer holds it."""
        b = self.backend
        now = utcnow()
        with b.statement() as cur:
            cur.execute(
                q.HEARTBEAT_LEASE,
                {
                    "thread_id": thread_id,
                    "owner": owner,
                    "now": b.ts_in(now),
                    "expires_at": b.ts_in(now + timedelta(seconds=ttl)),
                },
            )
            cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
            row = cur.fetchone()
        return row is not None and row["owner"] == owner

    @transient_retry()
    def release_lease(self, thread_id: str, owner: str) -> None:
        """Give the thread back (no-op if ``owner`` does not hold it)."""
        with self.backend.statement() as cur:
            cur.execute(q.RELEASE_LEASE, {"thread_id": thread_id, "owner": owner})

    @transient_retry()
    def lease(self, thread_id: str) -> LeaseRecord | None:
        """The lease on a thread, live or expired."""
        row = self._one(q.SELECT_LEASE, {"thread_id": thread_id})
        return None if row is None else self._lease(row)

    @transient_retry()
    def expired_leases(self) -> list[LeaseRecord]:
        """Leases whose holder stopped heartbeating (a crashed worker)."""
        rows = self._all(q.SELECT_EXPIRED_LEASES, {"now": self.backend.ts_in(utcnow())})
        return [self._lease(r) for r in rows]

    # ---------------------------------------------------------------- admin
    @transient_retry()
    def delete_thread(self, thread_id: str) -> None:
        """Forget a thread's runs and effects (audit rows are kept)."""
        with self.backend.transaction() as cur:
            cur.execute(q.DELETE_THREAD_EFFECTS, {"thread_id": thread_id})
            cur.execute(q.DELETE_THREAD_RUNS, {"thread_id": thread_id})

    # ---------------------------------------------------------- async twins
    asetup = _to_thread(setup)
    astart_run = _to_thread(start_run)
    astart_run_and_unsettled = _to_thread(start_run_and_unsettled)
    aget_run = _to_thread(get_run)
    aactive_run = _to_thread(active_run)
    alatest_run = _to_thread(latest_run)
    aruns = _to_thread(runs)
    arequest_cancel = _to_thread(request_cancel)
    amark_observed = _to_thread(mark_observed)
    afinish_run = _to_thread(finish_run)
    aplan = _to_thread(plan)
    aplan_many = _to_thread(plan_many)
    arecord_many = _to_thread(record_many)
    afind_effects = _to_thread(find_effects)
    atransition = _to_thread(transition)
    atransition_many = _to_thread(transition_many)
    aget_effect = _to_thread(get_effect)
    afind_effect = _to_thread(find_effect)
    afind_moved = _to_thread(find_moved)
    aeffects = _to_thread(effects)
    arun_effects = _to_thread(run_effects)
    aunsettled = _to_thread(unsettled)
    ahistory = _to_thread(history)
    aacquire_lease = _to_thread(acquire_lease)
    aheartbeat = _to_thread(heartbeat)
    arelease_lease = _to_thread(release_lease)
    adelete_thread = _to_thread(delete_thread)
    aeffect_by_key = _to_thread(effect_by_key)
    achild_runs = _to_thread(child_runs)
    aadd_tokens_after_cancel = _to_thread(add_tokens_after_cancel)
    aadd_tokens_used = _to_thread(add_tokens_used)


def _select_in(cur: Cursor, template: str, ids: list[str]) -> list[dict[str, Any]]:
    """SQLite: the rows of ``template`` (an ``IN ({ids})`` query) for many ids."""
    rows: list[dict[str, Any]] = []
    for sql, params in d.in_chunks(template, ids):
        cur.execute(sql, params)
        rows.extend(cur.fetchall())
    return rows


__all__ = ["Ledger", "default_owner", "derive_effect_id", "derive_idempotency_key"]

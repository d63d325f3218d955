"""The async effect ledger: ``Ledger``'s twin for event loops, as LangGraph pairs its savers.

``AsyncLedger`` has the sync ledger's ``a*`` methods, each a coroutine with its
real return type, doing its I/O on the caller's loop: psycopg's async pool on
PostgreSQL, aiosqlite on a SQLite file, the shared in-memory database inline.
The statements (``sql.py``), the migrations and every decision
(``decisions.py``) are the sync ledger's own; only the I/O differs.

Open one with ``await AsyncLedger.from_url(url)``, or as the twin of a sync
ledger on the same database with ``await AsyncLedger.twin_of(ledger)``. An async
saver binds its twin to its sync ledger (``bind_async_twin``); the async
execution path then asks ``async_twin_of(ledger)`` and awaits the twin, on its
loop, instead of sending the sync ledger's methods to a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from langgraph_cancel.errors import (
    DispatchRefusedError,
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    InvalidURLError,
    LedgerError,
    ThreadBusyError,
    UnknownEffectError,
    UnknownRunError,
    UnknownThreadError,
)
from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.aio_backends import (
    AsyncBackend,
    AsyncCursor,
    AsyncMemoryBackend,
    AsyncPostgresBackend,
    AsyncSqliteBackend,
    atransient_retry,
)
from langgraph_cancel.ledger.backends import (
    PostgresBackend,
    SqliteBackend,
    json_text,
    parse_url,
)
from langgraph_cancel.ledger.core import Ledger
from langgraph_cancel.types import (
    CancelRequestResult,
    EffectKind,
    EffectRecord,
    EffectStatus,
    LeaseRecord,
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

CancelListener = Callable[[str, str], None]

#: Serializes concurrent ``asetup()`` calls of many workers (the sync ledger's key).
_SETUP_LOCK_KEY = 7231900118


class AsyncLedger:
    """The effect ledger on memory, SQLite or PostgreSQL, for event loops.

    Every method is a coroutine with the sync ``Ledger``'s semantics and the
    name of its ``a*`` twin there (``aget_run``, ``atransition``, ...).

    Args:
        backend: The async database to use.
    """

    def __init__(self, backend: AsyncBackend) -> None:
        self.backend = backend
        self.url = backend.url
        #: The loop the backend's connections belong to (None: any loop, in memory).
        self.loop: asyncio.AbstractEventLoop | None = (
            None if isinstance(backend, AsyncMemoryBackend) else asyncio.get_running_loop()
        )
        self._setup_done = False
        self._setup_lock = asyncio.Lock()
        self._cancel_listeners: list[CancelListener] = []

    # ------------------------------------------------------------------ life
    @classmethod
    async def from_url(cls, url: str, *, setup: bool = True) -> AsyncLedger:
        """Open the async ledger a URL names (as ``Ledger.from_url``).

        ``memory://`` opens a fresh in-memory database of its own.

        Raises:
            InvalidURLError: For an unsupported URL.
        """
        kind, target = parse_url(url)
        if kind == "memory":
            backend: AsyncBackend = AsyncMemoryBackend(SqliteBackend(":memory:"))
        elif kind == "sqlite":
            sqlite_url = url if url.startswith("sqlite:///") else f"sqlite:///{url}"
            backend = await AsyncSqliteBackend.open(target, url=sqlite_url)
        else:
            backend = await AsyncPostgresBackend.open(target)
        ledger = cls(backend)
        if setup:
            await ledger.asetup()
        return ledger

    @classmethod
    async def twin_of(cls, ledger: Ledger, *, setup: bool = True) -> AsyncLedger:
        """An async ledger on the same database as ``ledger``, under the same URL.

        In memory it shares the sync ledger's very database; on a file or a
        server it opens connections of its own there.
        """
        backend_sync = ledger.backend
        if isinstance(backend_sync, SqliteBackend) and backend_sync.path == ":memory:":
            backend: AsyncBackend = AsyncMemoryBackend(backend_sync)
        else:
            backend = await _open_like(backend_sync)
            backend.url = ledger.url
        twin = cls(backend)
        twin.url = ledger.url
        if setup:
            await twin.asetup()
        return twin

    async def asetup(self) -> None:
        """Create or migrate the ledger's tables. Safe to call any number of times."""
        if self._setup_done:
            return
        async with self._setup_lock:
            if not self._setup_done:
                await self._setup_once()
                self._setup_done = True

    @atransient_retry()
    async def _setup_once(self) -> None:
        migrations = self.backend.migrations
        async with self.backend.transaction() as cur:
            if self.backend.dialect == "postgres":
                await cur.execute(f"SELECT pg_advisory_xact_lock({_SETUP_LOCK_KEY})")
            await cur.execute(migrations[0][0])
            await cur.execute(q.SELECT_VERSION)
            row = await cur.fetchone()
            current = -1 if row is None else next(iter(row.values()))
            current = -1 if current is None else int(current)
            for version, statements in enumerate(migrations):
                if version <= current:
                    continue
                for statement in statements:
                    await cur.execute(statement)
                await cur.execute(q.INSERT_VERSION, {"v": version})

    async def aclose(self) -> None:
        """Close the connections this ledger opened."""
        await self.backend.aclose()

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def add_cancel_listener(self, listener: CancelListener) -> None:
        """Call ``listener(thread_id, run_id)`` when this ledger requests a cancel."""
        self._cancel_listeners.append(listener)

    async def alisten_cancels(self) -> AsyncIterator[tuple[str, str]]:
        """PostgreSQL: ``(thread_id, run_id)`` of every cancel requested anywhere, as
        announced with ``NOTIFY lgc_cancel``, from a connection on this loop.

        Raises:
            LedgerError: On SQLite and in memory (no notifications there: poll).
        """
        backend = self.backend
        if not isinstance(backend, AsyncPostgresBackend):
            raise LedgerError("cancel notifications need PostgreSQL; poll the run elsewhere")
        async for payload in backend.listen("lgc_cancel"):
            yield d.parse_cancel_notice(payload)

    # ------------------------------------------------------------------ reads
    def _run(self, row: dict[str, Any]) -> RunRecord:
        return d.run_record(row, self.backend)

    def _effect(self, row: dict[str, Any]) -> EffectRecord:
        return d.effect_record(row, self.backend)

    def _lease(self, row: dict[str, Any]) -> LeaseRecord:
        return d.lease_record(row, self.backend)

    async def _one(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        async with self.backend.read() as cur:
            await cur.execute(sql, params)
            return await cur.fetchone()

    async def _all(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with self.backend.read() as cur:
            await cur.execute(sql, params)
            return await cur.fetchall()

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
            if updated is not None and b.dialect == "postgres":
                await cur.execute(q.NOTIFY_CANCEL, d.cancel_notice(thread_id, active["run_id"]))
            elif updated is None:
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

    # ---------------------------------------------------------------- effects
    async def aplan(
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
        """``Ledger.plan``: insert a tool call's record, or return the one already there.

        Returns:
            ``(record, created)``.

        Raises:
            DuplicateIdempotencyKeyError: When another effect already owns the key.
        """
        st = effect_status(status)
        if st not in d.INITIAL_STATUSES:
            raise IllegalTransitionError(tool_call_id, "(new)", st.value, "not an initial status")
        return await self._plan(
            thread_id=thread_id,
            run_id=run_id,
            tool_call_id=tool_call_id,
            tool=tool,
            kind=effect_kind(kind),
            args=args,
            key=idempotency_key or d.derive_idempotency_key(thread_id, tool_call_id),
            seq=seq,
            status=st,
            result=result,
            error=error,
            owner=owner,
            actor=actor,
            detail=detail,
        )

    async def _plan_once(
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
        effect_id = d.derive_effect_id(thread_id, tool_call_id)
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
                async with b.statement() as cur:
                    await cur.execute(q.PG_INSERT_EFFECT, params)
                    row = await cur.fetchone()
                    if row is None:
                        await cur.execute(q.SELECT_EFFECT, {"effect_id": effect_id})
                        existing = await cur.fetchone()
                        assert existing is not None
                        return self._effect(existing), False
                    return self._effect(row), True
            async with b.transaction() as cur:
                await cur.execute(q.INSERT_EFFECT, params)
                row = await cur.fetchone()
                if row is None:
                    await cur.execute(q.SELECT_EFFECT, {"effect_id": effect_id})
                    existing = await cur.fetchone()
                    assert existing is not None
                    return self._effect(existing), False
                await cur.execute(q.INSERT_TRANSITION, d.plan_audit(params))
                return self._effect(row), True
        except Exception as exc:
            if not d.is_unique_violation(exc):
                raise
            other = await self._one(q.SELECT_EFFECT_BY_KEY, {"key": key})
            if other is not None and other["effect_id"] == effect_id:
                # The same tool call planned concurrently (see Ledger._plan_once).
                return self._effect(other), False
            if other is not None and other["status"] == EffectStatus.NOT_APPLIED.value:
                await self._give_up_not_applied(other["effect_id"], taker=effect_id, actor=actor)
            if other is not None and await self._release_unsent_key(key, effect_id):
                # The holder never reached the external system: the key is free.
                return await self._plan_once(
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
            raise DuplicateIdempotencyKeyError(key, other["effect_id"] if other else None) from exc

    _plan = atransient_retry()(_plan_once)

    async def _give_up_not_applied(self, holder: str, *, taker: str, actor: str) -> None:
        """Drop a ``not_applied`` key holder so that its key can go to ``taker``."""
        with contextlib.suppress(IllegalTransitionError):
            await self.atransition(
                holder,
                EffectStatus.DROPPED,
                expected=[EffectStatus.NOT_APPLIED],
                actor=actor,
                detail={"key_taken_by": taker},
            )

    async def _release_unsent_key(self, key: str, taker: str) -> bool:
        """Free ``key`` if its holder was never dispatched (dropped or rejected)."""
        async with self.backend.statement() as cur:
            await cur.execute(q.RELEASE_UNSENT_KEY, d.released_key(key, taker))
            return await cur.fetchone() is not None

    async def aplan_many(
        self,
        *,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        owner: str | None = None,
        actor: str = "system",
    ) -> list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError]:
        """``Ledger.plan_many``: record a batch of tool calls at once.

        Returns:
            One entry per item, in order: ``(record, created)`` or the error.

        Raises:
            IllegalTransitionError: An item's status is not an initial one.
        """
        d.check_initial(items)
        if not items:
            return []
        try:
            found = await self._plan_many(thread_id, run_id, items, owner, actor, read_back=True)
        except Exception as exc:
            if not (isinstance(exc, DuplicateIdempotencyKeyError) or d.is_unique_violation(exc)):
                raise
            return await self._plan_each(thread_id, run_id, items, owner, actor)
        return d.first_created_once(items, [found[item.tool_call_id] for item in items])

    async def arecord_many(
        self,
        *,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        owner: str | None = None,
        actor: str = "system",
    ) -> list[DuplicateIdempotencyKeyError | None]:
        """``Ledger.record_many``: ``aplan_many`` without reading the records back.

        Returns:
            One entry per item, in order: ``None`` (recorded, now or before) or the
            ``DuplicateIdempotencyKeyError`` that kept it out.

        Raises:
            IllegalTransitionError: An item's status is not an initial one.
        """
        d.check_initial(items)
        if not items:
            return []
        try:
            await self._plan_many(thread_id, run_id, items, owner, actor, read_back=False)
        except Exception as exc:
            if not (isinstance(exc, DuplicateIdempotencyKeyError) or d.is_unique_violation(exc)):
                raise
            entries = await self._plan_each(thread_id, run_id, items, owner, actor)
            return [e if isinstance(e, DuplicateIdempotencyKeyError) else None for e in entries]
        return [None] * len(items)

    async def _plan_each(
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
                found[item.tool_call_id] = await self._plan(
                    **d.plan_fields(thread_id, run_id, item), owner=owner, actor=actor
                )
            except DuplicateIdempotencyKeyError as dup:
                errors[item.tool_call_id] = dup
        out: list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError] = [
            errors.get(item.tool_call_id) or found[item.tool_call_id] for item in items
        ]
        return d.first_created_once(items, out)

    @atransient_retry()
    async def _plan_many(
        self,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        owner: str | None,
        actor: str,
        *,
        read_back: bool,
    ) -> dict[str, tuple[EffectRecord, bool]]:
        b = self.backend
        unique: dict[str, NewEffect] = {}
        for item in items:
            unique.setdefault(item.tool_call_id, item)
        if b.dialect != "postgres":
            return await self._sqlite_plan_many(thread_id, run_id, unique, owner, actor, read_back)
        if len(unique) == 1:  # the one-row statement plans and runs faster than a row set
            ((call_id, item),) = unique.items()
            return {
                call_id: await self._plan_once(
                    **d.plan_fields(thread_id, run_id, item), owner=owner, actor=actor
                )
            }
        rows = d.pg_plan_rows(thread_id, run_id, unique)
        params = {
            "rows": json_text(rows),
            "thread_id": thread_id,
            "run_id": run_id,
            "owner": owner,
            "actor": actor,
            "now": b.ts_in(utcnow()),
        }
        found: dict[str, tuple[EffectRecord, bool]] = {}
        async with b.statement() as cur:
            await cur.execute(q.PG_INSERT_EFFECTS, params)
            if not read_back:
                return found
            for row in await cur.fetchall():
                found[row["tool_call_id"]] = (self._effect(row), True)
            missing = [r["effect_id"] for r in rows if r["tool_call_id"] not in found]
            if missing:
                await cur.execute(q.PG_SELECT_EFFECTS_ANY, {"ids": missing})
                for row in await cur.fetchall():
                    found[row["tool_call_id"]] = (self._effect(row), False)
        return found

    async def _sqlite_plan_many(
        self,
        thread_id: str,
        run_id: str,
        unique: dict[str, NewEffect],
        owner: str | None,
        actor: str,
        read_back: bool,
    ) -> dict[str, tuple[EffectRecord, bool]]:
        """SQLite: one transaction, a statement per step (see ``Ledger._sqlite_plan_many``)."""
        b = self.backend
        now = b.ts_in(utcnow())
        ids = {call_id: d.derive_effect_id(thread_id, call_id) for call_id in unique}
        found: dict[str, tuple[EffectRecord, bool]] = {}
        async with b.transaction() as cur:
            template = q.SELECT_EFFECTS_IN if read_back else q.SELECT_EFFECT_IDS_IN
            known = {
                row["effect_id"]: row for row in await _select_in(cur, template, list(ids.values()))
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
                await cur.executemany(q.INSERT_EFFECT_ROW, rows)
                await cur.executemany(q.INSERT_TRANSITION, audits)
        if read_back:
            for row in rows:
                found[row["tool_call_id"]] = (d.inserted_record(row, now, b), True)
        return found

    @atransient_retry()
    async def afind_effects(
        self, thread_id: str, tool_call_ids: Sequence[str]
    ) -> dict[str, EffectRecord]:
        """The recorded effects of several tool calls of a thread, by tool-call id."""
        ids = list(dict.fromkeys(d.derive_effect_id(thread_id, c) for c in tool_call_ids))
        if not ids:
            return {}
        if self.backend.dialect == "postgres":
            rows = await self._all(q.PG_SELECT_EFFECTS_ANY, {"ids": ids})
        else:
            async with self.backend.read() as cur:
                rows = await _select_in(cur, q.SELECT_EFFECTS_IN, ids)
        return {row["tool_call_id"]: self._effect(row) for row in rows}

    async def atransition(
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
        """``Ledger.transition``: move an effect to ``to`` if, and only if, it is in an
        allowed status.

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
        return await self._transition(req, allowed, guard, uuid.uuid4().hex)

    async def atransition_many(
        self, requests: Sequence[TransitionRequest]
    ) -> list[EffectRecord | LedgerError]:
        """``Ledger.transition_many``: several compare-and-sets at once, each on its own.

        Returns:
            One entry per request, in order: the moved record, or the error.

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
        return await self._transition_many(requests, checked, tokens)

    @atransient_retry()
    async def _transition_many(
        self,
        requests: Sequence[TransitionRequest],
        checked: Sequence[tuple[frozenset[EffectStatus], bool]],
        tokens: Sequence[str],
    ) -> list[EffectRecord | LedgerError]:
        b = self.backend
        out: list[EffectRecord | LedgerError] = []
        jobs = list(zip(requests, checked, tokens, strict=True))
        if b.dialect != "postgres":
            async with b.transaction():  # one transaction for all of them
                for req, (allowed, guard), token in jobs:
                    try:
                        out.append(await self._transition_once(req, allowed, guard, token))
                    except LedgerError as exc:
                        out.append(exc)
            return out
        rows = await self._pg_transitions(jobs)
        lost: list[tuple[int, str]] = []
        for n, ((req, _, _), row) in enumerate(zip(jobs, rows, strict=True)):
            out.append(self._effect(row) if row is not None else UnknownEffectError(req.effect_id))
            if row is None:
                lost.append((n, req.effect_id))
        if lost:
            before = {
                row["effect_id"]: row
                for row in await self._all(q.PG_SELECT_EFFECTS_ANY, {"ids": [e for _, e in lost]})
            }
            for n, effect_id in lost:
                req, (allowed, guard), token = jobs[n]
                row = before.get(effect_id)
                if row is None:
                    out[n] = UnknownEffectError(f"no effect {effect_id!r} in the ledger")
                    continue
                try:
                    out[n] = await self._lost_transition(row, req.to, allowed, guard, token)
                except LedgerError as exc:
                    out[n] = exc
        return out

    async def _pg_transitions(
        self, jobs: Sequence[tuple[TransitionRequest, tuple[frozenset[EffectStatus], bool], str]]
    ) -> list[dict[str, Any] | None]:
        """PostgreSQL: the compare-and-sets of ``jobs`` in one statement (None: not applied)."""
        b = self.backend
        if len(jobs) == 1:  # the one-row statement runs faster than a row set
            ((req, (allowed, guard), token),) = jobs
            async with b.statement() as cur:
                await cur.execute(
                    *d.cas_statement(
                        q.PG_TRANSITION_EFFECT, req, allowed, guard, token, utcnow(), b
                    )
                )
                return [await cur.fetchone()]
        moved: list[dict[str, Any] | None] = [None] * len(jobs)
        async with b.statement() as cur:
            await cur.execute(
                q.PG_TRANSITION_EFFECTS,
                {
                    "rows": json_text(d.pg_transition_rows(jobs)),
                    "ids": [req.effect_id for req, _, _ in jobs],
                    "now": b.ts_in(utcnow()),
                },
            )
            for row in await cur.fetchall():
                moved[row["n"]] = row
        return moved

    async def _transition_once(
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
            async with b.statement() as cur:
                await cur.execute(
                    *d.cas_statement(q.PG_TRANSITION_EFFECT, req, allowed, guard, token, now, b)
                )
                row = await cur.fetchone()
                if row is not None:
                    return self._effect(row)
                await cur.execute(q.SELECT_EFFECT, {"effect_id": effect_id})
                before = await cur.fetchone()
        else:
            audit, params = d.cas_statement(
                q.SQLITE_AUDIT_TRANSITION, req, allowed, guard, token, now, b
            )
            update, _ = d.cas_statement(
                q.SQLITE_TRANSITION_EFFECT, req, allowed, guard, token, now, b
            )
            async with b.transaction() as cur:
                await cur.execute(audit, params)
                await cur.execute(update, params)
                row = await cur.fetchone()
                if row is not None:
                    return self._effect(row)
                await cur.execute(q.SELECT_EFFECT, {"effect_id": effect_id})
                before = await cur.fetchone()
        if before is None:
            raise UnknownEffectError(f"no effect {effect_id!r} in the ledger")
        return await self._lost_transition(before, req.to, allowed, guard, token)

    _transition = atransient_retry()(_transition_once)

    async def _lost_transition(
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
        run = await self.aget_run(current.run_id)
        raise DispatchRefusedError(current.effect_id, f"run {run.run_id} is {run.status.value}")

    @atransient_retry()
    async def aget_effect(self, effect_id: str) -> EffectRecord:
        """The effect with this id.

        Raises:
            UnknownEffectError: If there is none.
        """
        row = await self._one(q.SELECT_EFFECT, {"effect_id": effect_id})
        if row is None:
            raise UnknownEffectError(f"no effect {effect_id!r} in the ledger")
        return self._effect(row)

    @atransient_retry()
    async def afind_effect(self, thread_id: str, tool_call_id: str) -> EffectRecord | None:
        """The effect of a tool call, if recorded."""
        row = await self._one(
            q.SELECT_EFFECT, {"effect_id": d.derive_effect_id(thread_id, tool_call_id)}
        )
        return None if row is None else self._effect(row)

    @atransient_retry()
    async def afind_moved(self, thread_id: str, tool_call_id: str) -> list[EffectRecord]:
        """Effects of calls recorded as ``<tool_call_id>~<digest>`` (oldest first)."""
        rows = await self._all(
            q.SELECT_MOVED_EFFECTS, {"thread_id": thread_id, "prefix": d.moved_prefix(tool_call_id)}
        )
        # SQLite's LIKE ignores ASCII case: keep exact matches only.
        prefix = f"{tool_call_id}~"
        return [self._effect(r) for r in rows if r["tool_call_id"].startswith(prefix)]

    @atransient_retry()
    async def aeffect_by_key(self, key: str) -> EffectRecord | None:
        """The effect holding an idempotency key, if any."""
        row = await self._one(q.SELECT_EFFECT_BY_KEY, {"key": key})
        return None if row is None else self._effect(row)

    @atransient_retry()
    async def aeffects(self, thread_id: str) -> list[EffectRecord]:
        """Every effect of a thread, in plan order."""
        rows = await self._all(q.SELECT_THREAD_EFFECTS, {"thread_id": thread_id})
        return [self._effect(r) for r in rows]

    @atransient_retry()
    async def arun_effects(self, run_id: str) -> list[EffectRecord]:
        """Every effect of a run, in plan order."""
        rows = await self._all(q.SELECT_RUN_EFFECTS, {"run_id": run_id})
        return [self._effect(r) for r in rows]

    @atransient_retry()
    async def aunsettled(self, thread_id: str) -> list[EffectRecord]:
        """Effects of a thread that still need something done."""
        rows = await self._all(q.SELECT_UNSETTLED, {"thread_id": thread_id})
        return [self._effect(r) for r in rows]

    @atransient_retry()
    async def aeffects_by_status(
        self, status: EffectStatus | str, *, limit: int = 1000
    ) -> list[EffectRecord]:
        """Effects in one status across all threads."""
        rows = await self._all(
            q.SELECT_BY_STATUS, {"status": effect_status(status).value, "limit": limit}
        )
        return [self._effect(r) for r in rows]

    @atransient_retry()
    async def ahistory(self, effect_id: str) -> list[TransitionRecord]:
        """The audit trail of an effect, oldest first."""
        rows = await self._all(q.SELECT_TRANSITIONS, {"effect_id": effect_id})
        return [d.transition_record(r, self.backend) for r in rows]

    # ----------------------------------------------------------------- leases
    @atransient_retry()
    async def aacquire_lease(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> LeaseRecord:
        """Claim a thread for ``owner`` (re-entrant for the same owner).

        Raises:
            ThreadBusyError: Another owner holds a live lease.
        """
        b = self.backend
        now = utcnow()
        params = {
            "thread_id": thread_id,
            "owner": owner,
            "now": b.ts_in(now),
            "expires_at": b.ts_in(now + timedelta(seconds=ttl)),
        }
        async with b.statement() as cur:
            await cur.execute(q.ACQUIRE_LEASE, params)
            row = await cur.fetchone()
            if row is not None:
                return self._lease(row)
            await cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
            held = await cur.fetchone()
            if held is None:  # released between our insert and our look
                await cur.execute(q.ACQUIRE_LEASE, params)
                taken = await cur.fetchone()
                if taken is not None:
                    return self._lease(taken)
                await cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
                held = await cur.fetchone()
                assert held is not None
            lease = self._lease(held)
            raise ThreadBusyError(thread_id, lease.owner, lease.expires_at.isoformat())

    @atransient_retry()
    async def aheartbeat(self, thread_id: str, owner: str, *, ttl: float = 30.0) -> bool:
        """Extend ``owner``'s lease; False if it no longer holds it."""
        b = self.backend
        now = utcnow()
        async with b.statement() as cur:
            await cur.execute(
                q.HEARTBEAT_LEASE,
                {
                    "thread_id": thread_id,
                    "owner": owner,
                    "now": b.ts_in(now),
                    "expires_at": b.ts_in(now + timedelta(seconds=ttl)),
                },
            )
            await cur.execute(q.SELECT_LEASE, {"thread_id": thread_id})
            row = await cur.fetchone()
        return row is not None and row["owner"] == owner

    @atransient_retry()
    async def arelease_lease(self, thread_id: str, owner: str) -> None:
        """Give the thread back (no-op if ``owner`` does not hold it)."""
        async with self.backend.statement() as cur:
            await cur.execute(q.RELEASE_LEASE, {"thread_id": thread_id, "owner": owner})

    @atransient_retry()
    async def alease(self, thread_id: str) -> LeaseRecord | None:
        """The lease on a thread, live or expired."""
        row = await self._one(q.SELECT_LEASE, {"thread_id": thread_id})
        return None if row is None else self._lease(row)

    @atransient_retry()
    async def aexpired_leases(self) -> list[LeaseRecord]:
        """Leases whose holder stopped heartbeating (a crashed worker)."""
        rows = await self._all(q.SELECT_EXPIRED_LEASES, {"now": self.backend.ts_in(utcnow())})
        return [self._lease(r) for r in rows]

    # ------------------------------------------------------------------ admin
    @atransient_retry()
    async def adelete_thread(self, thread_id: str) -> None:
        """Forget a thread's runs and effects (audit rows are kept)."""
        async with self.backend.transaction() as cur:
            await cur.execute(q.DELETE_THREAD_EFFECTS, {"thread_id": thread_id})
            await cur.execute(q.DELETE_THREAD_RUNS, {"thread_id": thread_id})


async def _select_in(cur: AsyncCursor, template: str, ids: list[str]) -> list[dict[str, Any]]:
    """SQLite: the rows of ``template`` (an ``IN ({ids})`` query) for many ids."""
    rows: list[dict[str, Any]] = []
    for sql, params in d.in_chunks(template, ids):
        await cur.execute(sql, params)
        rows.extend(await cur.fetchall())
    return rows


async def _open_like(backend: Any) -> AsyncBackend:
    """An async backend on the database of a sync file or server backend."""
    if isinstance(backend, SqliteBackend):
        return await AsyncSqliteBackend.open(backend.path, url=backend.url)
    if isinstance(backend, PostgresBackend):
        return await AsyncPostgresBackend.open(backend.conninfo, max_size=4)
    raise InvalidURLError(f"no async backend for {type(backend).__name__}")


_twins: weakref.WeakKeyDictionary[Ledger, AsyncLedger] = weakref.WeakKeyDictionary()
_twins_lock = threading.Lock()


def bind_async_twin(ledger: Ledger, twin: AsyncLedger) -> None:
    """Make ``twin`` (on the same database) the one the async path awaits for ``ledger``."""
    with _twins_lock:
        _twins[ledger] = twin


def unbind_async_twin(ledger: Ledger, twin: AsyncLedger) -> None:
    """Undo ``bind_async_twin`` (no-op if another twin was bound since)."""
    with _twins_lock:
        if _twins.get(ledger) is twin:
            del _twins[ledger]


def async_twin_of(ledger: Ledger) -> AsyncLedger | None:
    """The async ledger bound to ``ledger`` that can be awaited here, if any.

    Only on the twin's own loop (its connections belong to it); an in-memory
    twin, which has no connection of its own, on any loop. None elsewhere, and
    for a ledger without a twin: the caller then uses the sync ledger's
    threaded ``a*`` methods.
    """
    with _twins_lock:
        twin = _twins.get(ledger)
    if twin is None or twin.loop is None:
        return twin
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return twin if twin.loop is running else None


__all__ = ["AsyncLedger", "async_twin_of", "bind_async_twin", "unbind_async_twin"]

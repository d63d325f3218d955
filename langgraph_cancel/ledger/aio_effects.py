"""The async ledger's effects: planning tool calls and their compare-and-set transitions.

Mirrors the sync ``Ledger``'s effect methods, on an async backend, with the same
statements (``sql.py``) and decisions (``decisions.py``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from langgraph_cancel.errors import (
    DispatchRefusedError,
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    LedgerError,
    UnknownEffectError,
)
from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.aio_backends import AsyncCursor, atransient_retry
from langgraph_cancel.ledger.aio_runs import AsyncRunLedger
from langgraph_cancel.ledger.backends import json_text
from langgraph_cancel.types import (
    EffectKind,
    EffectRecord,
    EffectStatus,
    NewEffect,
    TransitionRecord,
    TransitionRequest,
    effect_kind,
    effect_status,
    utcnow,
)


class AsyncEffectLedger(AsyncRunLedger):
    """``AsyncRunLedger`` plus the effects of tool calls."""

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


async def _select_in(cur: AsyncCursor, template: str, ids: list[str]) -> list[dict[str, Any]]:
    """SQLite: the rows of ``template`` (an ``IN ({ids})`` query) for many ids."""
    rows: list[dict[str, Any]] = []
    for sql, params in d.in_chunks(template, ids):
        await cur.execute(sql, params)
        rows.extend(await cur.fetchall())
    return rows


__all__ = ["AsyncEffectLedger"]

"""The async ledger's effects: ``effects.py``'s twin, awaited on the caller's loop.

Mirrors the sync ``EffectLedger``'s methods, on an async backend, with the same
statements (``sql.py``) and decisions (``decisions.py``); how the insert and the
compare-and-set are written is the async backend's business.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from langgraph_cancel.errors import (
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    UnknownEffectError,
)
from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.aio_backends import atransient_retry
from langgraph_cancel.ledger.aio_transitions import AsyncTransitionLedger
from langgraph_cancel.types import (
    EffectKind,
    EffectRecord,
    EffectStatus,
    NewEffect,
    effect_kind,
    effect_status,
    utcnow,
)


class AsyncEffectLedger(AsyncTransitionLedger):
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
        item = NewEffect(
            tool_call_id=tool_call_id,
            tool=tool,
            kind=effect_kind(kind),
            args=args,
            idempotency_key=idempotency_key,
            seq=seq,
            status=st,
            result=result,
            error=error,
            detail=detail,
        )
        return await self._plan(thread_id, run_id, item, owner, actor)

    async def _plan_once(
        self, thread_id: str, run_id: str, item: NewEffect, owner: str | None, actor: str
    ) -> tuple[EffectRecord, bool]:
        """Insert one call's record with its audit row, or find the one already there."""
        params = d.plan_params(
            thread_id,
            run_id,
            item,
            owner=owner,
            actor=actor,
            stamp=self.backend.ts_in(utcnow()),
            codec=self.backend,
        )
        try:
            row, created = await self.backend.insert_effect(params)
        except Exception as exc:
            if not d.is_unique_violation(exc):
                raise
            return await self._plan_despite_key_clash(thread_id, run_id, item, owner, actor, exc)
        return self._effect(row), created

    async def _plan_despite_key_clash(
        self,
        thread_id: str,
        run_id: str,
        item: NewEffect,
        owner: str | None,
        actor: str,
        clash: Exception,
    ) -> tuple[EffectRecord, bool]:
        """``EffectLedger._plan_despite_key_clash``: ours after all, freed, or a duplicate.

        Raises:
            DuplicateIdempotencyKeyError: The key belongs to another effect.
        """
        key = d.planned_key(thread_id, item)
        effect_id = d.derive_effect_id(thread_id, item.tool_call_id)
        other = await self._one(q.SELECT_EFFECT_BY_KEY, {"key": key})
        if other is not None and other["effect_id"] == effect_id:
            # The same tool call planned concurrently (see the sync ledger).
            return self._effect(other), False
        if other is not None and other["status"] == EffectStatus.NOT_APPLIED.value:
            await self._give_up_not_applied(other["effect_id"], taker=effect_id, actor=actor)
        if other is not None and await self._release_unsent_key(key, effect_id):
            # The holder never reached the external system: the key is free.
            return await self._plan_once(thread_id, run_id, item, owner, actor)
        raise DuplicateIdempotencyKeyError(key, other["effect_id"] if other else None) from clash

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
                found[item.tool_call_id] = await self._plan(thread_id, run_id, item, owner, actor)
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
        """Insert the batch; with ``read_back``, every item's record by tool-call id
        (else an empty dict)."""
        unique: dict[str, NewEffect] = {}
        for item in items:
            unique.setdefault(item.tool_call_id, item)
        if len(unique) == 1:  # the one-row statement plans and runs faster than a row set
            ((call_id, item),) = unique.items()
            return {call_id: await self._plan_once(thread_id, run_id, item, owner, actor)}
        return await self.backend.insert_effects(
            thread_id, run_id, unique, owner=owner, actor=actor, read_back=read_back
        )

    @atransient_retry()
    async def afind_effects(
        self, thread_id: str, tool_call_ids: Sequence[str]
    ) -> dict[str, EffectRecord]:
        """The recorded effects of several tool calls of a thread, by tool-call id."""
        ids = list(dict.fromkeys(d.derive_effect_id(thread_id, c) for c in tool_call_ids))
        if not ids:
            return {}
        rows = await self.backend.effect_rows(ids)
        return {row["tool_call_id"]: self._effect(row) for row in rows}

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


__all__ = ["AsyncEffectLedger"]

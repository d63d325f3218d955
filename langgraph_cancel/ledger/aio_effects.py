"""The async ledger's effects: ``effects.py``'s twin, the same operations (``effect_ops.py``)
awaited on the caller's loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph_cancel.errors import DuplicateIdempotencyKeyError
from langgraph_cancel.ledger import effect_ops as ops
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.aio_backends import atransient_retry
from langgraph_cancel.ledger.aio_transitions import AsyncTransitionLedger
from langgraph_cancel.ledger.decisions import derive_effect_id
from langgraph_cancel.ledger.steps import arun
from langgraph_cancel.types import (
    EffectKind,
    EffectRecord,
    EffectStatus,
    NewEffect,
    effect_kind,
    effect_status,
)


class AsyncEffectLedger(AsyncTransitionLedger):
    """``AsyncRunLedger`` plus the effects of tool calls."""

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
        item = NewEffect(
            tool_call_id=tool_call_id,
            tool=tool,
            kind=effect_kind(kind),
            args=args,
            idempotency_key=idempotency_key,
            seq=seq,
            status=effect_status(status),
            result=result,
            error=error,
            detail=detail,
        )
        return await arun(
            self.backend, ops.plan(self.backend, thread_id, run_id, item, owner, actor)
        )

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
        return await arun(
            self.backend, ops.plan_many(self.backend, thread_id, run_id, items, owner, actor)
        )

    async def aplan_many_and_begin(
        self,
        *,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        begin: str | Sequence[str],
        owner: str | None = None,
        actor: str = "system",
    ) -> tuple[list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError], list[EffectRecord]]:
        """``Ledger.plan_many_and_begin``: a batch's plan with the intents of the calls
        to go out first.

        Returns:
            ``aplan_many``'s entries, and the records moved to ``dispatched``.

        Raises:
            IllegalTransitionError: An item's status is not an initial one.
            ValueError: ``begin`` is empty, or names no planned item of the batch.
        """
        return await arun(
            self.backend,
            ops.plan_many_and_begin(self.backend, thread_id, run_id, items, owner, actor, begin),
        )

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
        return await arun(
            self.backend, ops.record_many(self.backend, thread_id, run_id, items, owner, actor)
        )

    @atransient_retry()
    async def afind_effects(
        self, thread_id: str, tool_call_ids: Sequence[str]
    ) -> dict[str, EffectRecord]:
        """The recorded effects of several tool calls of a thread, by tool-call id."""
        return await arun(self.backend, ops.find_effects(self.backend, thread_id, tool_call_ids))

    @atransient_retry()
    async def aget_effect(self, effect_id: str) -> EffectRecord:
        """The effect with this id.

        Raises:
            UnknownEffectError: If there is none.
        """
        return await arun(self.backend, ops.get_effect(self.backend, effect_id))

    @atransient_retry()
    async def afind_effect(self, thread_id: str, tool_call_id: str) -> EffectRecord | None:
        """The effect of a tool call, if recorded."""
        effect_id = derive_effect_id(thread_id, tool_call_id)
        return await arun(
            self.backend,
            ops.one_effect(self.backend, ledger_sql.SELECT_EFFECT, {"effect_id": effect_id}),
        )

    @atransient_retry()
    async def afind_moved(self, thread_id: str, tool_call_id: str) -> list[EffectRecord]:
        """Effects of calls recorded as ``<tool_call_id>~<digest>`` (oldest first)."""
        return await arun(self.backend, ops.find_moved(self.backend, thread_id, tool_call_id))

    @atransient_retry()
    async def aeffect_by_key(self, key: str) -> EffectRecord | None:
        """The effect holding an idempotency key, if any."""
        return await arun(
            self.backend,
            ops.one_effect(self.backend, ledger_sql.SELECT_EFFECT_BY_KEY, {"key": key}),
        )

    @atransient_retry()
    async def aeffects(self, thread_id: str) -> list[EffectRecord]:
        """Every effect of a thread, in plan order."""
        params = {"thread_id": thread_id}
        return await arun(
            self.backend, ops.some_effects(self.backend, ledger_sql.SELECT_THREAD_EFFECTS, params)
        )

    @atransient_retry()
    async def arun_effects(self, run_id: str) -> list[EffectRecord]:
        """Every effect of a run, in plan order."""
        params = {"run_id": run_id}
        return await arun(
            self.backend, ops.some_effects(self.backend, ledger_sql.SELECT_RUN_EFFECTS, params)
        )

    @atransient_retry()
    async def aunsettled(self, thread_id: str) -> list[EffectRecord]:
        """Effects of a thread that still need something done."""
        params = {"thread_id": thread_id}
        return await arun(
            self.backend, ops.some_effects(self.backend, ledger_sql.SELECT_UNSETTLED, params)
        )

    @atransient_retry()
    async def aeffects_by_status(
        self, status: EffectStatus | str, *, limit: int = 1000
    ) -> list[EffectRecord]:
        """Effects in one status across all threads."""
        params = {"status": effect_status(status).value, "limit": limit}
        return await arun(
            self.backend, ops.some_effects(self.backend, ledger_sql.SELECT_BY_STATUS, params)
        )


__all__ = ["AsyncEffectLedger"]

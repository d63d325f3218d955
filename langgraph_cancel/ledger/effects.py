"""The sync ledger's effects: planning tool calls (one or a batch) and reading them.

Each method drives an operation of ``effect_ops.py`` (written once, shared with
``aio_effects.py``) on the sync backend; transitions are in ``transitions.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph_cancel.errors import DuplicateIdempotencyKeyError
from langgraph_cancel.ledger import effect_ops as ops
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.decisions import derive_effect_id
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.steps import run as drive
from langgraph_cancel.ledger.store import to_thread
from langgraph_cancel.ledger.transitions import TransitionLedger
from langgraph_cancel.types import (
    EffectKind,
    EffectRecord,
    EffectStatus,
    NewEffect,
    effect_kind,
    effect_status,
)


class EffectLedger(TransitionLedger):
    """Effects: plans (one or a batch) and reads; ``TransitionLedger`` moves them."""

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
        return drive(self.backend, ops.plan(self.backend, thread_id, run_id, item, owner, actor))

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
        return drive(
            self.backend, ops.plan_many(self.backend, thread_id, run_id, items, owner, actor)
        )

    def plan_many_and_begin(
        self,
        *,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        begin: str | Sequence[str],
        owner: str | None = None,
        actor: str = "system",
    ) -> tuple[list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError], list[EffectRecord]]:
        """``plan_many``, with the intents of the calls to go out first in the same write.

        Each call of ``begin`` (tool-call ids of ``items``, planned; one id or several)
        is recorded ``dispatched`` with its plan when this write creates its record
        and the run is running: one commit, waiting for the disk, makes the batch's
        plan and those intents durable together. A record found from before, a
        refused run or a taken key leave it as ``plan_many`` would; its intent is then
        written the usual way, if at all.

        Returns:
            ``plan_many``'s entries, and the records moved to ``dispatched`` (in the
            order of ``begin``; none when the run is not running).

        Raises:
            IllegalTransitionError: An item's status is not an initial one.
            ValueError: ``begin`` is empty, or names no planned item of the batch.
        """
        return drive(
            self.backend,
            ops.plan_many_and_begin(self.backend, thread_id, run_id, items, owner, actor, begin),
        )

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
        return drive(
            self.backend, ops.record_many(self.backend, thread_id, run_id, items, owner, actor)
        )

    @transient_retry()
    def find_effects(self, thread_id: str, tool_call_ids: Sequence[str]) -> dict[str, EffectRecord]:
        """The recorded effects of several tool calls of a thread, in one read.

        Returns:
            The records found, by tool-call id (calls never recorded are absent).
        """
        return drive(self.backend, ops.find_effects(self.backend, thread_id, tool_call_ids))

    @transient_retry()
    def get_effect(self, effect_id: str) -> EffectRecord:
        """The effect with this id.

        Raises:
            UnknownEffectError: If there is none.
        """
        return drive(self.backend, ops.get_effect(self.backend, effect_id))

    @transient_retry()
    def find_effect(self, thread_id: str, tool_call_id: str) -> EffectRecord | None:
        """The effect of a tool call, if recorded."""
        effect_id = derive_effect_id(thread_id, tool_call_id)
        return drive(
            self.backend,
            ops.one_effect(self.backend, ledger_sql.SELECT_EFFECT, {"effect_id": effect_id}),
        )

    @transient_retry()
    def find_moved(self, thread_id: str, tool_call_id: str) -> list[EffectRecord]:
        """Effects of calls that came under ``tool_call_id`` once it named another call's
        record, each recorded as ``<tool_call_id>~<digest>`` (oldest first)."""
        return drive(self.backend, ops.find_moved(self.backend, thread_id, tool_call_id))

    @transient_retry()
    def effect_by_key(self, key: str) -> EffectRecord | None:
        """The effect holding an idempotency key, if any."""
        return drive(
            self.backend,
            ops.one_effect(self.backend, ledger_sql.SELECT_EFFECT_BY_KEY, {"key": key}),
        )

    @transient_retry()
    def effects(self, thread_id: str) -> list[EffectRecord]:
        """Every effect of a thread, in plan order."""
        params = {"thread_id": thread_id}
        return drive(
            self.backend, ops.some_effects(self.backend, ledger_sql.SELECT_THREAD_EFFECTS, params)
        )

    @transient_retry()
    def run_effects(self, run_id: str) -> list[EffectRecord]:
        """Every effect of a run, in plan order."""
        params = {"run_id": run_id}
        return drive(
            self.backend, ops.some_effects(self.backend, ledger_sql.SELECT_RUN_EFFECTS, params)
        )

    @transient_retry()
    def unsettled(self, thread_id: str) -> list[EffectRecord]:
        """Effects of a thread that still need something done (uses a partial index)."""
        params = {"thread_id": thread_id}
        return drive(
            self.backend, ops.some_effects(self.backend, ledger_sql.SELECT_UNSETTLED, params)
        )

    @transient_retry()
    def effects_by_status(
        self, status: EffectStatus | str, *, limit: int = 1000
    ) -> list[EffectRecord]:
        """Effects in one status across all threads (e.g. every ``unknown``)."""
        params = {"status": effect_status(status).value, "limit": limit}
        return drive(
            self.backend, ops.some_effects(self.backend, ledger_sql.SELECT_BY_STATUS, params)
        )

    aplan = to_thread(plan)
    aplan_many = to_thread(plan_many)
    aplan_many_and_begin = to_thread(plan_many_and_begin)
    arecord_many = to_thread(record_many)
    afind_effects = to_thread(find_effects)
    aget_effect = to_thread(get_effect)
    afind_effect = to_thread(find_effect)
    afind_moved = to_thread(find_moved)
    aeffects = to_thread(effects)
    arun_effects = to_thread(run_effects)
    aunsettled = to_thread(unsettled)
    aeffect_by_key = to_thread(effect_by_key)


__all__ = ["EffectLedger"]

"""The sync ledger's effects: planning tool calls (one or a batch) and reading them.

A plan is an insert that finds the call's earlier record instead of creating
another (the effect id derives from thread and tool-call id); its transitions
are in ``transitions.py``. How the insert is written (one statement with a
writable CTE, or a transaction) is the backend's business.
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
from langgraph_cancel.ledger.decisions import derive_effect_id
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.store import to_thread
from langgraph_cancel.ledger.transitions import TransitionLedger
from langgraph_cancel.types import (
    EffectKind,
    EffectRecord,
    EffectStatus,
    NewEffect,
    effect_kind,
    effect_status,
    utcnow,
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
        return self._plan(thread_id, run_id, item, owner, actor)

    def _plan_once(
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
            row, created = self.backend.insert_effect(params)
        except Exception as exc:
            if not d.is_unique_violation(exc):
                raise
            return self._plan_despite_key_clash(thread_id, run_id, item, owner, actor, exc)
        return self._effect(row), created

    def _plan_despite_key_clash(
        self,
        thread_id: str,
        run_id: str,
        item: NewEffect,
        owner: str | None,
        actor: str,
        clash: Exception,
    ) -> tuple[EffectRecord, bool]:
        """Another record holds the call's idempotency key: ours after all, or freed
        because its holder never reached the external system, or a duplicate.

        Raises:
            DuplicateIdempotencyKeyError: The key belongs to another effect.
        """
        key = d.planned_key(thread_id, item)
        effect_id = derive_effect_id(thread_id, item.tool_call_id)
        other = self._one(q.SELECT_EFFECT_BY_KEY, {"key": key})
        if other is not None and other["effect_id"] == effect_id:
            # The same tool call planned concurrently: on PostgreSQL ON CONFLICT
            # (effect_id) does not cover the racing insert's key index.
            return self._effect(other), False
        if other is not None and other["status"] == EffectStatus.NOT_APPLIED.value:
            self._give_up_not_applied(other["effect_id"], taker=effect_id, actor=actor)
        if other is not None and self._release_unsent_key(key, effect_id):
            # The holder never reached the external system: the key is free.
            return self._plan_once(thread_id, run_id, item, owner, actor)
        raise DuplicateIdempotencyKeyError(key, other["effect_id"] if other else None) from clash

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
                found[item.tool_call_id] = self._plan(thread_id, run_id, item, owner, actor)
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
        unique: dict[str, NewEffect] = {}
        for item in items:
            unique.setdefault(item.tool_call_id, item)
        if len(unique) == 1:  # the one-row statement plans and runs faster than a row set
            ((call_id, item),) = unique.items()
            return {call_id: self._plan_once(thread_id, run_id, item, owner, actor)}
        return self.backend.insert_effects(
            thread_id, run_id, unique, owner=owner, actor=actor, read_back=read_back
        )

    @transient_retry()
    def find_effects(self, thread_id: str, tool_call_ids: Sequence[str]) -> dict[str, EffectRecord]:
        """The recorded effects of several tool calls of a thread, in one read.

        Returns:
            The records found, by tool-call id (calls never recorded are absent).
        """
        ids = list(dict.fromkeys(derive_effect_id(thread_id, c) for c in tool_call_ids))
        if not ids:
            return {}
        return {row["tool_call_id"]: self._effect(row) for row in self.backend.effect_rows(ids)}

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

    aplan = to_thread(plan)
    aplan_many = to_thread(plan_many)
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

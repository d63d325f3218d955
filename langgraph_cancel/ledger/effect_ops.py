"""The effects' operations, written once for the sync and the async ledger (see ``steps.py``).

A plan is an insert that finds the call's earlier record instead of creating
another (the effect id derives from thread and tool-call id). How the insert is
written (one statement with a writable CTE, or a transaction) is the dialect's
business (``dialects.py``). ``effects.py`` drives these on a sync backend,
``aio_effects.py`` awaits them.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

from langgraph_cancel.errors import (
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    UnknownEffectError,
)
from langgraph_cancel.ledger import decisions, transition_ops
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.decisions import derive_effect_id
from langgraph_cancel.ledger.dialects import DialectStatements
from langgraph_cancel.ledger.records import Codec, effect_record
from langgraph_cancel.ledger.steps import Execute, Operation, Retry, Unit, in_order, read
from langgraph_cancel.types import EffectRecord, EffectStatus, NewEffect, TransitionRequest, utcnow

Planned = tuple[EffectRecord, bool]


def plan(
    backend: DialectStatements,
    thread_id: str,
    run_id: str,
    item: NewEffect,
    owner: str | None,
    actor: str,
) -> Operation[Planned]:
    """Insert a tool call's record, or return the one already there: ``(record, created)``.

    Raises:
        IllegalTransitionError: The item's status is not one a record starts in.
        DuplicateIdempotencyKeyError: When another effect already owns the key.
    """
    decisions.check_initial([item])
    planned: Planned = yield Retry(
        lambda: plan_once(backend, thread_id, run_id, item, owner, actor)
    )
    return planned


def plan_once(
    backend: DialectStatements,
    thread_id: str,
    run_id: str,
    item: NewEffect,
    owner: str | None,
    actor: str,
) -> Operation[Planned]:
    """One attempt at recording one call with its audit row."""
    params = decisions.plan_params(
        thread_id,
        run_id,
        item,
        owner=owner,
        actor=actor,
        stamp=backend.ts_in(utcnow()),
        codec=backend,
    )
    try:
        row, created = yield from backend.insert_effect(params)
    except Exception as exc:
        if not decisions.is_unique_violation(exc):
            raise
        return (yield from _despite_key_clash(backend, thread_id, run_id, item, owner, actor, exc))
    return effect_record(row, backend), created


def _despite_key_clash(
    backend: DialectStatements,
    thread_id: str,
    run_id: str,
    item: NewEffect,
    owner: str | None,
    actor: str,
    clash: Exception,
) -> Operation[Planned]:
    """Another record holds the call's idempotency key: ours after all, or freed
    because its holder never reached the external system, or a duplicate.

    Raises:
        DuplicateIdempotencyKeyError: The key belongs to another effect.
    """
    key = decisions.planned_key(thread_id, item)
    effect_id = derive_effect_id(thread_id, item.tool_call_id)
    other = yield read(ledger_sql.SELECT_EFFECT_BY_KEY, {"key": key})
    if other is not None and other["effect_id"] == effect_id:
        # The same tool call planned concurrently: on PostgreSQL ON CONFLICT
        # (effect_id) does not cover the racing insert's key index.
        return effect_record(other, backend), False
    if other is not None and other["status"] == EffectStatus.NOT_APPLIED.value:
        yield from _give_up_not_applied(backend, other["effect_id"], taker=effect_id, actor=actor)
    if other is not None:
        released = Execute(ledger_sql.RELEASE_UNSENT_KEY, decisions.released_key(key, effect_id))
        if (yield Unit("statement", in_order(released))) is not None:
            # The holder was never dispatched (dropped or rejected): the key is free.
            return (yield from plan_once(backend, thread_id, run_id, item, owner, actor))
    raise DuplicateIdempotencyKeyError(key, other["effect_id"] if other else None) from clash


def _give_up_not_applied(
    backend: DialectStatements, holder: str, *, taker: str, actor: str
) -> Operation[None]:
    """Drop a ``not_applied`` key holder so that its key can go to ``taker``.

    The external system has no record of the holder's call, so the key may
    serve a new call as if the holder had never been sent. Dropped first, it
    cannot be dispatched again under the key it gives away: a racing re-run
    of the holder wins the compare-and-set or finds it dropped.
    """
    drop = TransitionRequest(
        effect_id=holder,
        to=EffectStatus.DROPPED,
        expected=frozenset({EffectStatus.NOT_APPLIED}),
        actor=actor,
        detail={"key_taken_by": taker},
    )
    with contextlib.suppress(IllegalTransitionError):
        yield from transition_ops.transition(backend, drop)


def plan_many(
    backend: DialectStatements,
    thread_id: str,
    run_id: str,
    items: Sequence[NewEffect],
    owner: str | None,
    actor: str,
) -> Operation[list[Planned | DuplicateIdempotencyKeyError]]:
    """Record a batch at once: per item, ``(record, created)`` or, when another effect
    holds its key, the ``DuplicateIdempotencyKeyError``.

    Raises:
        IllegalTransitionError: An item's status is not an initial one.
    """
    entries = yield from _plan_all(backend, thread_id, run_id, items, owner, actor, True)
    assert entries is not None
    return entries


def plan_many_and_begin(
    backend: DialectStatements,
    thread_id: str,
    run_id: str,
    items: Sequence[NewEffect],
    owner: str | None,
    actor: str,
    begin: str | Sequence[str],
) -> Operation[tuple[list[Planned | DuplicateIdempotencyKeyError], list[EffectRecord]]]:
    """``plan_many``, and the intents of the calls ``begin`` (tool-call ids of ``items``)
    in the same write: each of their records is ``dispatched`` when this write created
    it and the run is running; otherwise it stays as ``plan_many`` leaves it.

    Returns:
        ``plan_many``'s entries, and the records moved to ``dispatched``, in the order
        of ``begin``.

    Raises:
        IllegalTransitionError: An item's status is not an initial one.
        ValueError: ``begin`` is empty, or names no item, or one that does not start
            ``planned``.
    """
    decisions.check_initial(items)
    calls = [begin] if isinstance(begin, str) else list(begin)
    if not calls:
        raise ValueError("plan_many_and_begin: no call to begin")
    by_call = {item.tool_call_id: item for item in reversed(items)}
    intents: list[TransitionRequest] = []
    for call_id in dict.fromkeys(calls):
        item = by_call.get(call_id)
        if item is None or item.status is not EffectStatus.PLANNED:
            raise ValueError(f"plan_many_and_begin: no planned item {call_id!r} in the batch")
        intents.append(
            TransitionRequest(
                effect_id=derive_effect_id(thread_id, call_id),
                to=EffectStatus.DISPATCHED,
                actor=actor,
                owner=owner,
                detail={"idempotency_key": decisions.planned_key(thread_id, item)},
            )
        )
    unique: dict[str, NewEffect] = {}
    for each in items:
        unique.setdefault(each.tool_call_id, each)
    token = uuid.uuid4().hex
    try:
        found, begun_now = yield Retry(
            lambda: backend.insert_effects_beginning(
                thread_id, run_id, unique, owner=owner, actor=actor, intents=intents, token=token
            )
        )
    except Exception as exc:
        if not _key_clash(exc):
            raise
        # A key is taken: the calls go one at a time, and the intents their own way after.
        return (yield from _plan_each(backend, thread_id, run_id, items, owner, actor)), []
    entries = decisions.first_created_once(items, [found[each.tool_call_id] for each in items])
    return entries, begun_now


def record_many(
    backend: DialectStatements,
    thread_id: str,
    run_id: str,
    items: Sequence[NewEffect],
    owner: str | None,
    actor: str,
) -> Operation[list[DuplicateIdempotencyKeyError | None]]:
    """``plan_many`` without reading the records back: per item, None or the error.

    Raises:
        IllegalTransitionError: An item's status is not an initial one.
    """
    entries = yield from _plan_all(backend, thread_id, run_id, items, owner, actor, False)
    if entries is None:
        return [None] * len(items)
    return [e if isinstance(e, DuplicateIdempotencyKeyError) else None for e in entries]


def _plan_all(
    backend: DialectStatements,
    thread_id: str,
    run_id: str,
    items: Sequence[NewEffect],
    owner: str | None,
    actor: str,
    read_back: bool,
) -> Operation[list[Planned | DuplicateIdempotencyKeyError] | None]:
    """The batch in one statement, or call by call when a key is taken; None when it
    went in at once and ``read_back`` is false (nothing was read)."""
    decisions.check_initial(items)
    if not items:
        return []
    try:
        found = yield Retry(
            lambda: plan_batch(backend, thread_id, run_id, items, owner, actor, read_back)
        )
    except Exception as exc:
        if not _key_clash(exc):
            raise
        return (yield from _plan_each(backend, thread_id, run_id, items, owner, actor))
    if not read_back:
        return None
    return decisions.first_created_once(items, [found[item.tool_call_id] for item in items])


def _key_clash(exc: Exception) -> bool:
    """Whether a batch's insert failed because a key it plans is another effect's."""
    return isinstance(exc, DuplicateIdempotencyKeyError) or decisions.is_unique_violation(exc)


def _plan_each(
    backend: DialectStatements,
    thread_id: str,
    run_id: str,
    items: Sequence[NewEffect],
    owner: str | None,
    actor: str,
) -> Operation[list[Planned | DuplicateIdempotencyKeyError]]:
    """Some key of the batch is taken: record it one call at a time to tell which."""
    found: dict[str, Planned] = {}
    errors: dict[str, DuplicateIdempotencyKeyError] = {}
    for item in items:
        if item.tool_call_id in found or item.tool_call_id in errors:
            continue
        try:
            found[item.tool_call_id] = yield from plan(
                backend, thread_id, run_id, item, owner, actor
            )
        except DuplicateIdempotencyKeyError as dup:
            errors[item.tool_call_id] = dup
    out: list[Planned | DuplicateIdempotencyKeyError] = [
        errors.get(item.tool_call_id) or found[item.tool_call_id] for item in items
    ]
    return decisions.first_created_once(items, out)


def plan_batch(
    backend: DialectStatements,
    thread_id: str,
    run_id: str,
    items: Sequence[NewEffect],
    owner: str | None,
    actor: str,
    read_back: bool,
) -> Operation[dict[str, Planned]]:
    """One attempt at inserting the batch; with ``read_back``, every item's record by
    tool-call id (else an empty dict)."""
    unique: dict[str, NewEffect] = {}
    for item in items:
        unique.setdefault(item.tool_call_id, item)
    if len(unique) == 1:  # the one-row statement plans and runs faster than a row set
        ((call_id, item),) = unique.items()
        return {call_id: (yield from plan_once(backend, thread_id, run_id, item, owner, actor))}
    return (
        yield from backend.insert_effects(
            thread_id, run_id, unique, owner=owner, actor=actor, read_back=read_back
        )
    )


def find_effects(
    backend: DialectStatements, thread_id: str, tool_call_ids: Sequence[str]
) -> Operation[dict[str, EffectRecord]]:
    """The recorded effects of several tool calls of a thread, by tool-call id."""
    ids = list(dict.fromkeys(derive_effect_id(thread_id, c) for c in tool_call_ids))
    if not ids:
        return {}
    rows = yield from backend.effect_rows(ids)
    return {row["tool_call_id"]: effect_record(row, backend) for row in rows}


def get_effect(codec: Codec, effect_id: str) -> Operation[EffectRecord]:
    """The effect with this id.

    Raises:
        UnknownEffectError: If there is none.
    """
    found = yield from one_effect(codec, ledger_sql.SELECT_EFFECT, {"effect_id": effect_id})
    if found is None:
        raise UnknownEffectError(f"no effect {effect_id!r} in the ledger")
    return found


def one_effect(codec: Codec, sql: str, params: dict[str, Any]) -> Operation[EffectRecord | None]:
    """The effect one ``SELECT`` finds, if any."""
    row = yield read(sql, params)
    return None if row is None else effect_record(row, codec)


def some_effects(codec: Codec, sql: str, params: dict[str, Any]) -> Operation[list[EffectRecord]]:
    """The effects one ``SELECT`` finds."""
    rows = yield read(sql, params, "all")
    return [effect_record(r, codec) for r in rows]


def find_moved(codec: Codec, thread_id: str, tool_call_id: str) -> Operation[list[EffectRecord]]:
    """Effects of calls that came under ``tool_call_id`` once it named another call's
    record, each recorded as ``<tool_call_id>~<digest>`` (oldest first)."""
    params = {"thread_id": thread_id, "prefix": decisions.moved_prefix(tool_call_id)}
    found = yield from some_effects(codec, ledger_sql.SELECT_MOVED_EFFECTS, params)
    # SQLite's LIKE ignores ASCII case: keep exact matches only.
    prefix = f"{tool_call_id}~"
    return [record for record in found if record.tool_call_id.startswith(prefix)]


__all__ = [
    "Planned",
    "find_effects",
    "find_moved",
    "get_effect",
    "one_effect",
    "plan",
    "plan_batch",
    "plan_many",
    "plan_many_and_begin",
    "plan_once",
    "record_many",
    "some_effects",
]

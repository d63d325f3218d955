"""What the ledger decides, without doing any I/O: one copy for the sync and async ledgers.

The sync ``Ledger`` (``core.py``) and the async one (``aio.py``) differ only in how
they talk to the database. Everything else lives here, as pure functions: the
legal "from" statuses of a compare-and-set, what a compare-and-set that did not
apply means (our own lost acknowledgement, a refusal, a conflict), the answer to a
cancel request, and the parameters of each statement. Rows become records in
``records.py``.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from langgraph_cancel.errors import (
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    TransitionConflictError,
)
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.records import Codec, run_record
from langgraph_cancel.types import (
    EFFECT_TRANSITIONS,
    RUN_TRANSITIONS,
    TERMINAL_RUN_STATUSES,
    UNSETTLED_STATUSES,
    CancelRequestResult,
    EffectRecord,
    EffectStatus,
    NewEffect,
    RunRecord,
    RunStatus,
    TransitionRequest,
    effect_kind,
    run_status,
)
from langgraph_cancel.workers import new_worker_id


def default_owner() -> str:
    """A worker identity: host, pid, a random suffix and what makes it checkable on its
    host (see ``langgraph_cancel.ledger.workers``)."""
    return new_worker_id()


def derive_effect_id(thread_id: str, tool_call_id: str) -> str:
    """The stable id of a tool call's effect: the same call always maps to the same row."""
    return f"{thread_id}:{tool_call_id}"


def derive_idempotency_key(thread_id: str, tool_call_id: str) -> str:
    """The default idempotency key: derived from the thread and the tool-call id."""
    digest = hashlib.sha256(f"{thread_id}\x00{tool_call_id}".encode()).hexdigest()[:32]
    return f"lgc-{digest}"


def predecessors(target: EffectStatus) -> frozenset[EffectStatus]:
    """The statuses an effect may move to ``target`` from."""
    return frozenset(s for s, nxt in EFFECT_TRANSITIONS.items() if target in nxt)


#: Every status's legal predecessors.
PREDECESSORS: dict[EffectStatus, frozenset[EffectStatus]] = {
    s: predecessors(s) for s in EffectStatus
}
#: The statuses a new record may start in.
INITIAL_STATUSES = frozenset(
    {
        EffectStatus.PLANNED,
        EffectStatus.PENDING_APPROVAL,
        EffectStatus.COMMITTED,
        EffectStatus.FAILED,
        EffectStatus.DROPPED,
        EffectStatus.REJECTED,
    }
)
#: The statuses whose arrival settles an effect (stamps ``settled_at``).
SETTLING = frozenset(EffectStatus) - UNSETTLED_STATUSES


def lease_params(
    thread_id: str, owner: str, now: datetime, ttl: float, codec: Codec
) -> dict[str, Any]:
    """The parameters of ``ACQUIRE_LEASE`` / ``TAKE_OVER_LEASE`` for ``owner`` at ``now``."""
    return {
        "thread_id": thread_id,
        "owner": owner,
        "now": codec.ts_in(now),
        "expires_at": codec.ts_in(now + timedelta(seconds=ttl)),
    }


# ------------------------------------------------------------------------- runs
def cancel_answer(
    run: RunRecord, *, accepted: bool, first: bool, message: str
) -> CancelRequestResult:
    """The answer to a cancel request, as the run now stands."""
    return CancelRequestResult(
        thread_id=run.thread_id,
        run_id=run.run_id,
        accepted=accepted,
        first=first,
        status=run.status,
        reason=run.reason,
        message=message,
    )


def nothing_to_cancel(run: RunRecord) -> CancelRequestResult:
    """The answer to a cancel request on a thread whose last run is over."""
    return cancel_answer(
        run,
        accepted=False,
        first=False,
        message=f"nothing to cancel: run {run.run_id} is already {run.status.value}",
    )


def cancel_verdict(
    updated: dict[str, Any] | None, active: dict[str, Any], token: str, codec: Codec
) -> CancelRequestResult:
    """What a cancel request's compare-and-set means.

    Args:
        updated: The run row the compare-and-set returned (None: it did not apply).
        active: The run row as last read (after a lost compare-and-set, re-read).
        token: This request's write token.
        codec: The dialect's codec.
    """
    if updated is not None or active.get("last_token") == token:
        # Made now, or by our own earlier attempt whose acknowledgement was lost.
        run = run_record(updated if updated is not None else active, codec)
        return cancel_answer(
            run, accepted=True, first=True, message=f"cancel requested for run {run.run_id}"
        )
    run = run_record(active, codec)
    if run.terminal:  # finished between our SELECT and our UPDATE
        return nothing_to_cancel(run)
    return cancel_answer(
        run,
        accepted=True,
        first=False,
        message=f"cancel already requested for run {run.run_id} ({run.reason!r} wins)",
    )


def cancel_params(
    run_id: str, *, reason: str, requested_by: str, token: str, now: datetime, codec: Codec
) -> dict[str, Any]:
    """The parameters of ``REQUEST_CANCEL``."""
    return {
        "run_id": run_id,
        "now": codec.ts_in(now),
        "reason": reason,
        "requested_by": requested_by,
        "token": token,
    }


def cancel_notice(thread_id: str, run_id: str) -> dict[str, Any]:
    """The parameters of ``NOTIFY_CANCEL``: the thread and run, separated by a unit separator."""
    return {"payload": f"{thread_id}\x1f{run_id}"}


def parse_cancel_notice(payload: str) -> tuple[str, str]:
    """The thread and run of a ``NOTIFY lgc_cancel`` payload."""
    thread_id, _, run_id = payload.partition("\x1f")
    return thread_id, run_id


@functools.cache
def finish_statement(target: RunStatus) -> str:
    """``FINISH_RUN`` for ``target``: the compare-and-set from its legal predecessors.

    Raises:
        IllegalTransitionError: ``target`` is not a terminal status.
    """
    allowed = [s for s, nxt in RUN_TRANSITIONS.items() if target in nxt]
    return ledger_sql.FINISH_RUN.format(allowed=", ".join(f"'{s.value}'" for s in allowed))


def check_finish_target(run_id: str, target: RunStatus) -> None:
    """Refuse a non-terminal target for ``finish_run``.

    Raises:
        IllegalTransitionError: ``target`` is not terminal.
    """
    if target not in TERMINAL_RUN_STATUSES:
        raise IllegalTransitionError(run_id, "?", target.value, "not a terminal status")


def finish_params(
    run_id: str,
    target: RunStatus,
    *,
    report: dict[str, Any] | None,
    quiesced_at: datetime | None,
    tokens_after_cancel: int | None,
    token: str,
    release_lease: str | None,
    now: datetime,
    codec: Codec,
) -> dict[str, Any]:
    """The parameters of ``FINISH_RUN`` (and of ``RELEASE_LEASE_AFTER_FINISH``)."""
    return {
        "run_id": run_id,
        "status": target.value,
        "now": codec.ts_in(now),
        "quiesced_at": codec.ts_in(quiesced_at),
        "tokens_after_cancel": tokens_after_cancel,
        "report": codec.json_in(report),
        "token": token,
        "lease_owner": release_lease,
    }


def finish_verdict(row: dict[str, Any], target: RunStatus, token: str) -> bool:
    """What a finish's compare-and-set that did not apply means, from the run's row.

    Returns:
        True when our own earlier attempt made the transition (its acknowledgement
        was lost); False when the run was already terminal otherwise.

    Raises:
        IllegalTransitionError: The run is live in a status that cannot reach ``target``.
    """
    current = run_status(row["status"])
    if current in TERMINAL_RUN_STATUSES:
        return bool(current is target and row["last_token"] == token)
    raise IllegalTransitionError(row["run_id"], current.value, target.value)


# ---------------------------------------------------------------------- effects
def check_initial(items: Sequence[NewEffect]) -> None:
    """Refuse a batch holding an item whose status a new record cannot start in.

    Raises:
        IllegalTransitionError: For the first such item.
    """
    for item in items:
        if item.status not in INITIAL_STATUSES:
            raise IllegalTransitionError(
                item.tool_call_id, "(new)", item.status.value, "not an initial status"
            )


def first_created_once(
    items: Sequence[NewEffect],
    out: list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError],
) -> list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError]:
    """A tool-call id repeated in one batch is created once: later slots say ``False``."""
    seen: set[str] = set()
    for slot, (item, entry) in enumerate(zip(items, out, strict=True)):
        if item.tool_call_id in seen and isinstance(entry, tuple):
            out[slot] = (entry[0], False)
        seen.add(item.tool_call_id)
    return out


def planned_key(thread_id: str, item: NewEffect) -> str:
    """The idempotency key an item is recorded under: its own, or the derived one."""
    return item.idempotency_key or derive_idempotency_key(thread_id, item.tool_call_id)


def plan_params(
    thread_id: str,
    run_id: str,
    item: NewEffect,
    *,
    owner: str | None,
    actor: str,
    stamp: Any,
    codec: Codec,
) -> dict[str, Any]:
    """The parameters of ``INSERT_EFFECT`` / ``PG_INSERT_EFFECT`` (the audit row's too).

    Args:
        thread_id: The thread.
        run_id: The run.
        item: The tool call to record.
        owner: The worker planning it.
        actor: Who acts (kept in the audit trail).
        stamp: The timestamp, already adapted for the column (``codec.ts_in``).
        codec: The dialect's codec.
    """
    settles = item.status not in UNSETTLED_STATUSES
    return {
        "effect_id": derive_effect_id(thread_id, item.tool_call_id),
        "thread_id": thread_id,
        "run_id": run_id,
        "tool_call_id": item.tool_call_id,
        "tool": item.tool,
        "kind": effect_kind(item.kind).value,
        "status": item.status.value,
        "idempotency_key": planned_key(thread_id, item),
        "args": codec.json_in(item.args),
        "seq": item.seq,
        "result": codec.json_in(item.result),
        "error": item.error,
        "owner": owner,
        "next_action": None,
        "approval": None,
        "token": None,
        "now": stamp,
        "dispatched_at": None,
        "settled_at": stamp if settles else None,
        "actor": actor,
        "detail": codec.json_in(item.detail or {}),
    }


def plan_audit(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of ``INSERT_TRANSITION`` for a record just planned with ``params``."""
    return {
        "effect_id": params["effect_id"],
        "from_status": None,
        "to_status": params["status"],
        "now": params["now"],
        "actor": params["actor"],
        "detail": params["detail"],
    }


def released_key(key: str, taker: str) -> dict[str, Any]:
    """The parameters of ``RELEASE_UNSENT_KEY``: the key, and what its holder keeps."""
    return {"key": key, "released": f"{key}#released-to:{taker}"}


def pg_plan_rows(thread_id: str, run_id: str, unique: dict[str, NewEffect]) -> list[dict[str, Any]]:
    """PostgreSQL: the JSON rows of ``PG_INSERT_EFFECTS`` for a batch (one per call id)."""
    return [
        {
            "effect_id": derive_effect_id(thread_id, item.tool_call_id),
            "tool_call_id": item.tool_call_id,
            "tool": item.tool,
            "kind": effect_kind(item.kind).value,
            "status": item.status.value,
            "idempotency_key": planned_key(thread_id, item),
            "args": item.args,
            "seq": item.seq,
            "result": item.result,
            "error": item.error,
            "settles": item.status not in UNSETTLED_STATUSES,
            "detail": item.detail or {},
        }
        for item in unique.values()
    ]


def sqlite_plan_rows(
    thread_id: str,
    run_id: str,
    new: dict[str, NewEffect],
    *,
    owner: str | None,
    actor: str,
    stamp: Any,
    codec: Codec,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """SQLite: the rows of ``INSERT_EFFECT_ROW`` and ``INSERT_TRANSITION`` for new calls.

    Arguments as ``plan_params``; ``new`` holds the calls not recorded yet, by
    tool-call id.
    """
    rows = [
        plan_params(thread_id, run_id, item, owner=owner, actor=actor, stamp=stamp, codec=codec)
        for item in new.values()
    ]
    return rows, [plan_audit(row) for row in rows]


#: SQLite binds at most 32766 parameters per statement (fewer before 3.32).
IN_CHUNK = 500


def in_chunks(template: str, ids: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """SQLite: ``template`` (an ``IN ({ids})`` query) as statements of at most ``IN_CHUNK`` ids."""
    out: list[tuple[str, dict[str, Any]]] = []
    for start in range(0, len(ids), IN_CHUNK):
        chunk = ids[start : start + IN_CHUNK]
        params = {f"i{n}": effect_id for n, effect_id in enumerate(chunk)}
        out.append((template.format(ids=", ".join(f"%({k})s" for k in params)), params))
    return out


def moved_prefix(tool_call_id: str) -> str:
    """The ``LIKE`` pattern (``!`` escapes) of the calls moved away from ``tool_call_id``."""
    escaped = tool_call_id.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return f"{escaped}~%"


# ------------------------------------------------------------------ transitions
#: One compare-and-set: the request, its allowed "from" statuses and whether the
#: run must be running, and the write token that recognises a retry's own write.
CasJob = tuple[TransitionRequest, tuple[frozenset[EffectStatus], bool], str]

#: What a compare-and-set found: ``(moved, None)`` when it applied, ``(None, current)``
#: when it did not (``current`` None: no such effect).
CasOutcome = tuple[dict[str, Any] | None, dict[str, Any] | None]


def checked(req: TransitionRequest) -> tuple[frozenset[EffectStatus], bool]:
    """The statuses a transition may start from, and whether the run guard applies.

    Raises:
        IllegalTransitionError: The state machine forbids the move outright.
    """
    target = req.to
    legal = PREDECESSORS[target]
    # A repeat dispatch (dispatched -> dispatched) must be asked for explicitly, or two
    # workers dispatching the same effect would both win the compare-and-set.
    default = legal - {target} if target is EffectStatus.DISPATCHED else legal
    allowed = default if req.expected is None else req.expected
    illegal = allowed - legal
    if illegal:
        raise IllegalTransitionError(
            req.effect_id, ",".join(sorted(s.value for s in illegal)), target.value
        )
    if target is EffectStatus.UNKNOWN and (req.owner is None or req.next_action in (None, ...)):
        raise IllegalTransitionError(
            req.effect_id, "?", target.value, "unknown needs an owner and a next_action"
        )
    guard = (
        req.require_active_run
        if req.require_active_run is not None
        else target is EffectStatus.DISPATCHED
    )
    return allowed, guard


def cas_params(req: TransitionRequest, token: str, now: datetime, codec: Codec) -> dict[str, Any]:
    """The parameters of an effect's compare-and-set (both dialects)."""
    return {
        "effect_id": req.effect_id,
        "to": req.to.value,
        "token": token,
        "now": codec.ts_in(now),
        "set_result": 0 if req.result is ... else 1,
        "result": None if req.result is ... else codec.json_in(req.result),
        "set_error": 0 if req.error is ... else 1,
        "error": None if req.error is ... else req.error,
        "owner": req.owner,
        "set_next_action": 0 if req.next_action is ... else 1,
        "next_action": None if req.next_action is ... else req.next_action,
        "approval": codec.json_in(req.approval),
        "args": codec.json_in(req.args),
        "settles": 1 if req.to in SETTLING else 0,
        "release_at": codec.ts_in(req.release_at),
    }


def cas_statement(
    template: str,
    req: TransitionRequest,
    allowed: frozenset[EffectStatus],
    guard: bool,
    token: str,
    now: datetime,
    codec: Codec,
) -> tuple[str, dict[str, Any]]:
    """A compare-and-set statement (``template`` has ``{statuses}`` and ``{guard}``) and
    its parameters, the audit row's included."""
    names = sorted(s.value for s in allowed)
    params: dict[str, Any] = {f"s{i}": v for i, v in enumerate(names)}
    params.update(cas_params(req, token, now, codec))
    params.update({"actor": req.actor, "detail": codec.json_in(req.detail or {})})
    return _cas_sql(template, len(names), guard), params


@functools.lru_cache(maxsize=256)
def _cas_sql(template: str, statuses: int, guard: bool) -> str:
    """``template`` with ``statuses`` placeholders and the run guard if asked: the text
    depends on nothing else, so each shape is formatted once."""
    placeholders = ", ".join(f"%(s{i})s" for i in range(statuses)) or "NULL"
    return template.format(
        statuses=placeholders, guard=ledger_sql.RUN_ACTIVE_GUARD if guard else ""
    )


def pg_transition_rows(jobs: Sequence[CasJob]) -> list[dict[str, Any]]:
    """PostgreSQL: the JSON rows of ``PG_TRANSITION_EFFECTS``, one per job."""
    return [
        {
            "n": n,
            "effect_id": req.effect_id,
            "to": req.to.value,
            "token": token,
            "allowed": sorted(s.value for s in allowed),
            "guard": guard,
            "set_result": req.result is not ...,
            "result": None if req.result is ... else req.result,
            "set_error": req.error is not ...,
            "error": None if req.error is ... else req.error,
            "owner": req.owner,
            "set_next_action": req.next_action is not ...,
            "next_action": None if req.next_action is ... else req.next_action,
            "approval": req.approval,
            "args": req.args,
            "settles": req.to in SETTLING,
            "release_at": None if req.release_at is None else req.release_at.isoformat(),
            "actor": req.actor,
            "detail": req.detail or {},
        }
        for n, (req, (allowed, guard), token) in enumerate(jobs)
    ]


class LostCas(enum.Enum):
    """What a compare-and-set that did not apply means, when it is not an error."""

    #: Our own earlier attempt committed; its acknowledgement was lost.
    OWN_WRITE = "own_write"
    #: The run guard refused a dispatch: the run is no longer running.
    REFUSED = "refused"


def lost_transition(
    current: EffectRecord,
    last_token: str | None,
    target: EffectStatus,
    allowed: frozenset[EffectStatus],
    guard: bool,
    token: str,
) -> LostCas:
    """Why an effect's compare-and-set did not apply, from the effect as it now is.

    Raises:
        TransitionConflictError: Another writer moved the effect first.
        IllegalTransitionError: The effect's status cannot reach ``target``.
    """
    if current.status is target and last_token == token:
        return LostCas.OWN_WRITE
    if guard and current.status in allowed:
        return LostCas.REFUSED
    if current.status in PREDECESSORS[target]:
        raise TransitionConflictError(
            current.effect_id, current.status.value, target.value, "moved by another writer"
        )
    raise IllegalTransitionError(current.effect_id, current.status.value, target.value)


def is_unique_violation(exc: BaseException) -> bool:
    """True for a unique-constraint violation, in either dialect."""
    if isinstance(exc, sqlite3.IntegrityError):
        return "UNIQUE" in str(exc).upper()
    try:
        from psycopg import errors as pge
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, pge.UniqueViolation)


__all__ = [
    "INITIAL_STATUSES",
    "IN_CHUNK",
    "PREDECESSORS",
    "SETTLING",
    "CasJob",
    "CasOutcome",
    "LostCas",
    "cancel_answer",
    "cancel_notice",
    "cancel_params",
    "cancel_verdict",
    "cas_params",
    "cas_statement",
    "check_finish_target",
    "check_initial",
    "checked",
    "default_owner",
    "derive_effect_id",
    "derive_idempotency_key",
    "finish_params",
    "finish_statement",
    "finish_verdict",
    "first_created_once",
    "in_chunks",
    "is_unique_violation",
    "lease_params",
    "lost_transition",
    "moved_prefix",
    "nothing_to_cancel",
    "parse_cancel_notice",
    "pg_plan_rows",
    "pg_transition_rows",
    "plan_audit",
    "plan_params",
    "planned_key",
    "predecessors",
    "released_key",
    "sqlite_plan_rows",
]

"""The runs' operations, written once for the sync and the async ledger (see ``steps.py``).

``runs.py`` drives them on a sync backend, ``aio_runs.py`` awaits them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator, Sequence
from datetime import datetime, timedelta
from typing import Any

from langgraph_cancel.errors import UnknownRunError, UnknownThreadError
from langgraph_cancel.ledger import decisions, lease_ops
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.dialects import DialectStatements
from langgraph_cancel.ledger.records import Codec, effect_record, run_record
from langgraph_cancel.ledger.steps import (
    Execute,
    Operation,
    Pipeline,
    Retry,
    Step,
    Unit,
    in_order,
    read,
)
from langgraph_cancel.types import CancelRequestResult, EffectRecord, RunRecord, RunStatus, utcnow

#: Called with ``(thread_id, run_id)`` when this process requests a cancel.
CancelListener = Callable[[str, str], None]


def start_run(
    codec: DialectStatements,
    thread_id: str,
    run_id: str | None,
    owner: str | None,
    parent_run_id: str | None,
    lease_ttl: float | None,
    with_unsettled: bool,
) -> Operation[tuple[RunRecord, list[EffectRecord] | None]]:
    """The thread's live run or a new one (with the lease first, and the unsettled
    effects after, when asked for), in one round trip.

    Raises:
        ThreadBusyError: With ``lease_ttl``: another owner holds a live lease.
    """
    now = utcnow()
    params = {
        "run_id": run_id or str(uuid.uuid4()),
        "thread_id": thread_id,
        "now": codec.ts_in(now),
        "owner": owner,
        "parent_run_id": parent_run_id,
    }
    # Insert first: new input on a finished thread (the common case) is one
    # statement. The partial unique index turns it into a no-op when the thread
    # has a live run, which is then read.
    unsettled_rows: list[dict[str, Any]] | None = None
    if lease_ttl is not None:
        if owner is None:
            raise ValueError("start_run: a lease needs an owner")
        lease = {
            "thread_id": thread_id,
            "owner": owner,
            "now": params["now"],
            "expires_at": codec.ts_in(now + timedelta(seconds=lease_ttl)),
        }
        leased, row, unsettled_rows = yield from codec.start_leased_run(
            params, lease, with_unsettled
        )
        if not leased:
            # Held by another owner, or let go in between: acquire_lease tells which.
            yield from lease_ops.acquire_lease(codec, thread_id, owner, lease_ttl)
            return (
                yield from start_run(
                    codec, thread_id, run_id, owner, parent_run_id, None, with_unsettled
                )
            )
    else:
        statements = [(ledger_sql.INSERT_RUN, params)]
        if with_unsettled:
            statements.append((ledger_sql.SELECT_UNSETTLED, {"thread_id": thread_id}))
        results = yield Pipeline(statements)
        row = results[0][0] if results[0] else None
        unsettled_rows = results[1] if with_unsettled else None
    unsettled = (
        None if unsettled_rows is None else [effect_record(r, codec) for r in unsettled_rows]
    )
    if row is None:  # the thread's live run (or a run id clash)
        row = yield read(ledger_sql.SELECT_ACTIVE_RUN, {"thread_id": thread_id})
        if row is None:
            raise UnknownRunError(run_id or "")
    return run_record(row, codec), unsettled


def get_run(codec: Codec, run_id: str) -> Operation[RunRecord]:
    """The run with this id.

    Raises:
        UnknownRunError: If there is none.
    """
    row = yield read(ledger_sql.SELECT_RUN, {"run_id": run_id})
    if row is None:
        raise UnknownRunError(run_id)
    return run_record(row, codec)


def one_run(codec: Codec, sql: str, params: dict[str, Any]) -> Operation[RunRecord | None]:
    """The run one ``SELECT`` finds, if any."""
    row = yield read(sql, params)
    return None if row is None else run_record(row, codec)


def some_runs(codec: Codec, sql: str, params: dict[str, Any]) -> Operation[list[RunRecord]]:
    """The runs one ``SELECT`` finds."""
    rows = yield read(sql, params, "all")
    return [run_record(r, codec) for r in rows]


def require_latest_run(codec: Codec, thread_id: str) -> Operation[RunRecord]:
    """The thread's most recent run.

    Raises:
        UnknownThreadError: If the ledger has never seen the thread.
    """
    run = yield from one_run(codec, ledger_sql.SELECT_LATEST_RUN, {"thread_id": thread_id})
    if run is None:
        raise UnknownThreadError(thread_id)
    return run


def request_cancel(
    backend: DialectStatements,
    listeners: Sequence[CancelListener],
    thread_id: str,
    reason: str,
    requested_by: str,
    cascade: bool,
) -> Operation[CancelRequestResult]:
    """Ask the thread's live run to stop (first reason wins), then its children's.

    Raises:
        UnknownThreadError: If the ledger has never seen the thread.
    """
    token = uuid.uuid4().hex  # made once: a retry recognises its own earlier write
    result: CancelRequestResult = yield Retry(
        lambda: _request_once(backend, thread_id, reason, requested_by, token)
    )
    if result.accepted and result.run_id is not None:
        for listener in list(listeners):
            listener(thread_id, result.run_id)
        if cascade:
            children = yield Retry(
                lambda: some_runs(backend, ledger_sql.SELECT_CHILD_RUNS, {"run_id": result.run_id})
            )
            for child in children:
                if not child.terminal:
                    yield from request_cancel(
                        backend,
                        listeners,
                        child.thread_id,
                        f"parent run {result.run_id} cancelled: {reason}",
                        requested_by,
                        True,
                    )
    return result


def _request_once(
    backend: DialectStatements, thread_id: str, reason: str, requested_by: str, token: str
) -> Operation[CancelRequestResult]:
    verdict: CancelRequestResult = yield Unit(
        "transaction", _request_body(backend, thread_id, reason, requested_by, token)
    )
    return verdict


def _request_body(
    backend: DialectStatements, thread_id: str, reason: str, requested_by: str, token: str
) -> Generator[Step, Any, CancelRequestResult]:
    active = yield Execute(ledger_sql.SELECT_ACTIVE_RUN, {"thread_id": thread_id})
    if active is None:
        latest = yield Execute(ledger_sql.SELECT_LATEST_RUN, {"thread_id": thread_id})
        if latest is None:
            raise UnknownThreadError(thread_id)
        return decisions.nothing_to_cancel(run_record(latest, backend))
    params = decisions.cancel_params(
        active["run_id"],
        reason=reason,
        requested_by=requested_by,
        token=token,
        now=utcnow(),
        codec=backend,
    )
    updated = yield Execute(ledger_sql.REQUEST_CANCEL, params)
    if updated is not None:
        yield from backend.announce_cancel(thread_id, active["run_id"])
    else:
        # Another writer moved the run since our SELECT (PostgreSQL, READ
        # COMMITTED): answer with its current state, not the stale snapshot.
        active = (yield Execute(ledger_sql.SELECT_RUN, {"run_id": active["run_id"]})) or active
    return decisions.cancel_verdict(updated, active, token, backend)


def mark_observed(codec: Codec, run_id: str) -> Operation[RunRecord]:
    """``cancel_requested -> cancelling``; the run as it is now.

    Raises:
        UnknownRunError: If there is no such run.
    """
    row = yield Unit("statement", _observe(run_id, codec.ts_in(utcnow())))
    return run_record(row, codec)


def _observe(run_id: str, now: Any) -> Generator[Step, Any, dict[str, Any]]:
    row: dict[str, Any] | None = yield Execute(
        ledger_sql.MARK_OBSERVED, {"run_id": run_id, "now": now}
    )
    if row is None:
        row = yield Execute(ledger_sql.SELECT_RUN, {"run_id": run_id})
        if row is None:
            raise UnknownRunError(run_id)
    return row


def finish_run(
    codec: DialectStatements,
    run_id: str,
    target: RunStatus,
    *,
    report: dict[str, Any] | None,
    quiesced_at: datetime | None,
    tokens_after_cancel: int | None,
    release_lease: str | None,
) -> Operation[bool]:
    """The run's one terminal transition: True if this call made it.

    Raises:
        IllegalTransitionError: For a target the run's status cannot reach.
        UnknownRunError: If there is no such run.
    """
    decisions.check_finish_target(run_id, target)
    token = uuid.uuid4().hex  # made once: a retry recognises its own earlier write
    finish = decisions.finish_statement(target)

    def attempt() -> Operation[bool]:
        params = decisions.finish_params(
            run_id,
            target,
            report=report,
            quiesced_at=quiesced_at,
            tokens_after_cancel=tokens_after_cancel,
            token=token,
            release_lease=release_lease,
            now=utcnow(),
            codec=codec,
        )
        if release_lease is None:
            finished = yield Unit("statement", in_order(Execute(finish, params)))
        else:  # the release is a no-op unless this finish wrote the run's status
            finished = yield from codec.finish_releasing(finish, params)
        if finished is not None:
            return True
        row = yield read(ledger_sql.SELECT_RUN, {"run_id": run_id})
        if row is None:
            raise UnknownRunError(run_id)
        return decisions.finish_verdict(row, target, token)

    finished: bool = yield Retry(attempt)
    return finished


def add_tokens_after_cancel(run_id: str, tokens: int) -> Operation[None]:
    """Count model tokens received after the run's cancel signal."""
    add = Execute(
        ledger_sql.ADD_TOKENS_AFTER_CANCEL, {"run_id": run_id, "tokens": int(tokens)}, "none"
    )
    yield Unit("transaction", in_order(add))


def add_tokens_used(run_id: str, tokens: int) -> Operation[int]:
    """Count model tokens the run used; the run's new total.

    Raises:
        UnknownRunError: If there is no such run.
    """
    add = Execute(ledger_sql.ADD_TOKENS_USED, {"run_id": run_id, "tokens": int(tokens)})
    row = yield Unit("transaction", in_order(add))
    if row is None:
        raise UnknownRunError(run_id)
    return int(row["tokens_used"])


def delete_thread(thread_id: str) -> Operation[None]:
    """Forget a thread's runs and effects (audit rows are kept)."""
    yield Unit(
        "transaction",
        in_order(
            Execute(ledger_sql.DELETE_THREAD_EFFECTS, {"thread_id": thread_id}, "none"),
            Execute(ledger_sql.DELETE_THREAD_RUNS, {"thread_id": thread_id}, "none"),
        ),
    )


__all__ = [
    "CancelListener",
    "add_tokens_after_cancel",
    "add_tokens_used",
    "delete_thread",
    "finish_run",
    "get_run",
    "mark_observed",
    "one_run",
    "request_cancel",
    "require_latest_run",
    "some_runs",
    "start_run",
]

"""The transitions' operations, written once for the sync and the async ledger (see
``steps.py``).

Every transition is a compare-and-set whose ``WHERE`` clause the database
evaluates; Python only decides which "from" statuses are legal
(``decisions.py``), and what a compare-and-set that did not apply means: our own
retry's earlier write (recognised by its write token), a refusal, or a conflict.
``transitions.py`` drives them on a sync backend, ``aio_transitions.py`` awaits them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from langgraph_cancel.errors import DispatchRefusedError, LedgerError, UnknownEffectError
from langgraph_cancel.ledger import decisions, run_ops
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.decisions import CasJob, CasOutcome
from langgraph_cancel.ledger.dialects import DialectStatements
from langgraph_cancel.ledger.records import Codec, effect_record, transition_record
from langgraph_cancel.ledger.steps import Operation, Retry, read
from langgraph_cancel.types import EffectRecord, EffectStatus, TransitionRecord, TransitionRequest


def transition(backend: DialectStatements, req: TransitionRequest) -> Operation[EffectRecord]:
    """Move an effect if, and only if, it is in an allowed status.

    Raises:
        IllegalTransitionError: The state machine forbids the move.
        TransitionConflictError: Another writer moved the effect first.
        DispatchRefusedError: ``dispatched`` was refused: the run is not running.
        UnknownEffectError: No such effect.
    """
    job: CasJob = (req, decisions.checked(req), uuid.uuid4().hex)
    moved: EffectRecord = yield Retry(lambda: transition_once(backend, job))
    return moved


def transition_once(backend: DialectStatements, job: CasJob) -> Operation[EffectRecord]:
    """One attempt at a compare-and-set, and what its outcome means."""
    outcome = yield from backend.compare_and_set(job)
    return (yield from cas_verdict(backend, job, outcome))


def transition_many(
    backend: DialectStatements, requests: Sequence[TransitionRequest]
) -> Operation[list[EffectRecord | LedgerError]]:
    """Several compare-and-sets at once, each succeeding or failing on its own.

    Raises:
        IllegalTransitionError: A request the state machine forbids outright.
        ValueError: The same effect twice in one call.
    """
    checked = [decisions.checked(r) for r in requests]
    if len({r.effect_id for r in requests}) != len(requests):
        raise ValueError("transition_many: one request per effect")
    if not requests:
        return []
    tokens = [uuid.uuid4().hex for _ in requests]
    out: list[EffectRecord | LedgerError] = yield Retry(
        lambda: transition_jobs(backend, requests, checked, tokens)
    )
    return out


def transition_jobs(
    backend: DialectStatements,
    requests: Sequence[TransitionRequest],
    checked: Sequence[tuple[frozenset[EffectStatus], bool]],
    tokens: Sequence[str],
) -> Operation[list[EffectRecord | LedgerError]]:
    """One attempt at a batch of compare-and-sets with these write tokens."""
    jobs: list[CasJob] = list(zip(requests, checked, tokens, strict=True))
    outcomes = yield from backend.compare_and_set_many(jobs)
    out: list[EffectRecord | LedgerError] = []
    for job, outcome in zip(jobs, outcomes, strict=True):
        try:
            out.append((yield from cas_verdict(backend, job, outcome)))
        except LedgerError as exc:
            out.append(exc)
    return out


def cas_verdict(codec: Codec, job: CasJob, outcome: CasOutcome) -> Operation[EffectRecord]:
    """The record a compare-and-set moved, or what its not applying means."""
    moved, current = outcome
    if moved is not None:
        return effect_record(moved, codec)
    req, (allowed, guard), token = job
    if current is None:
        raise UnknownEffectError(f"no effect {req.effect_id!r} in the ledger")
    return (yield from lost_transition(codec, current, req.to, allowed, guard, token))


def lost_transition(
    codec: Codec,
    before: dict[str, Any],
    target: EffectStatus,
    allowed: frozenset[EffectStatus],
    guard: bool,
    token: str,
) -> Operation[EffectRecord]:
    """The compare-and-set did not apply: our own retry, a refusal, or a conflict."""
    current = effect_record(before, codec)
    verdict = decisions.lost_transition(
        current, before["last_token"], target, allowed, guard, token
    )
    if verdict is decisions.LostCas.OWN_WRITE:
        return current
    run = yield from run_ops.get_run(codec, current.run_id)
    raise DispatchRefusedError(current.effect_id, f"run {run.run_id} is {run.status.value}")


def history(codec: Codec, effect_id: str) -> Operation[list[TransitionRecord]]:
    """The audit trail of an effect, oldest first."""
    rows = yield read(ledger_sql.SELECT_TRANSITIONS, {"effect_id": effect_id}, "all")
    return [transition_record(r, codec) for r in rows]


__all__ = [
    "cas_verdict",
    "history",
    "lost_transition",
    "transition",
    "transition_jobs",
    "transition_many",
    "transition_once",
]

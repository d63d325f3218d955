"""The sync ledger's transitions: moving an effect by compare-and-set, and its audit trail.

Every transition is a compare-and-set whose ``WHERE`` clause the database
evaluates; Python only decides which "from" statuses are legal
(``decisions.py``), and what a compare-and-set that did not apply means: our own
retry's earlier write (recognised by its write token), a refusal, or a conflict.
How the statement is written (one statement with a writable CTE, or a
transaction) is the backend's business.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from langgraph_cancel.errors import DispatchRefusedError, LedgerError, UnknownEffectError
from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.decisions import CasJob, CasOutcome
from langgraph_cancel.ledger.records import transition_record
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.runs import RunLedger
from langgraph_cancel.ledger.store import to_thread
from langgraph_cancel.types import (
    EffectRecord,
    EffectStatus,
    TransitionRecord,
    TransitionRequest,
    effect_status,
)


class TransitionLedger(RunLedger):
    """Compare-and-set transitions of effects, one or many at once, and their audit trail."""

    def transition(
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
        """Move an effect to ``to`` if, and only if, it is in an allowed status.

        Args:
            effect_id: The effect.
            to: The target status.
            expected: The statuses the caller believes the effect is in
                (default: every legal predecessor of ``to``, except ``dispatched``
                itself for ``to=dispatched``: a repeat dispatch must be explicit).
            actor: Who is acting (kept in the audit trail).
            detail: Free-form audit detail.
            result: The outcome to record (leave out to keep the current one).
            error: The error text to record (leave out to keep it).
            owner: Who owns the effect now (kept when ``None``).
            next_action: What must happen next (for ``unknown``).
            approval: The approval decision to record.
            args: Replacement arguments (an approved edit).
            require_active_run: Refuse unless the run is ``running``; defaults
                to true for ``dispatched`` (no dispatch after the cancel signal).

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
        return self._transition((req, (allowed, guard), uuid.uuid4().hex))

    def transition_many(
        self, requests: Sequence[TransitionRequest]
    ) -> list[EffectRecord | LedgerError]:
        """Several compare-and-sets at once: one statement on PostgreSQL, one transaction
        on SQLite. Each succeeds or fails on its own, as ``transition`` would.

        Returns:
            One entry per request, in order: the moved record, or the error
            ``transition`` would have raised for it (conflict, refusal, unknown effect).

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
        return self._transition_many(requests, checked, tokens)

    @transient_retry()
    def _transition_many(
        self,
        requests: Sequence[TransitionRequest],
        checked: Sequence[tuple[frozenset[EffectStatus], bool]],
        tokens: Sequence[str],
    ) -> list[EffectRecord | LedgerError]:
        jobs: list[CasJob] = list(zip(requests, checked, tokens, strict=True))
        out: list[EffectRecord | LedgerError] = []
        for job, outcome in zip(jobs, self.backend.compare_and_set_many(jobs), strict=True):
            try:
                out.append(self._cas_verdict(job, outcome))
            except LedgerError as exc:
                out.append(exc)
        return out

    def _transition_once(self, job: CasJob) -> EffectRecord:
        return self._cas_verdict(job, self.backend.compare_and_set(job))

    _transition = transient_retry()(_transition_once)

    def _cas_verdict(self, job: CasJob, outcome: CasOutcome) -> EffectRecord:
        """The record a compare-and-set moved, or what its not applying means."""
        moved, current = outcome
        if moved is not None:
            return self._effect(moved)
        req, (allowed, guard), token = job
        if current is None:
            raise UnknownEffectError(f"no effect {req.effect_id!r} in the ledger")
        return self._lost_transition(current, req.to, allowed, guard, token)

    def _lost_transition(
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
        run = self.get_run(current.run_id)
        raise DispatchRefusedError(current.effect_id, f"run {run.run_id} is {run.status.value}")

    @transient_retry()
    def history(self, effect_id: str) -> list[TransitionRecord]:
        """The audit trail of an effect, oldest first."""
        rows = self._all(q.SELECT_TRANSITIONS, {"effect_id": effect_id})
        return [transition_record(r, self.backend) for r in rows]

    atransition = to_thread(transition)
    atransition_many = to_thread(transition_many)
    ahistory = to_thread(history)


__all__ = ["TransitionLedger"]

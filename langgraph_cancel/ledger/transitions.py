"""The sync ledger's transitions: moving an effect by compare-and-set, and its audit trail.

Each method drives an operation of ``transition_ops.py`` (written once, shared
with ``aio_transitions.py``) on the sync backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from langgraph_cancel.errors import LedgerError
from langgraph_cancel.ledger import transition_ops as ops
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.runs import RunLedger
from langgraph_cancel.ledger.steps import run as drive
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
        return drive(self.backend, ops.transition(self.backend, req))

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
        return drive(self.backend, ops.transition_many(self.backend, requests))

    @transient_retry()
    def history(self, effect_id: str) -> list[TransitionRecord]:
        """The audit trail of an effect, oldest first."""
        return drive(self.backend, ops.history(self.backend, effect_id))

    @transient_retry()
    def _transition_many(
        self,
        requests: Sequence[TransitionRequest],
        checked: Sequence[tuple[frozenset[EffectStatus], bool]],
        tokens: Sequence[str],
    ) -> list[EffectRecord | LedgerError]:
        """One batch of compare-and-sets with these write tokens (a retry passes the
        same ones, and recognises its own earlier writes by them)."""
        return drive(self.backend, ops.transition_jobs(self.backend, requests, checked, tokens))

    atransition = to_thread(transition)
    atransition_many = to_thread(transition_many)
    ahistory = to_thread(history)


__all__ = ["TransitionLedger"]

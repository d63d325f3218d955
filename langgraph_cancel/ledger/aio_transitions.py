"""The async ledger's transitions: ``transitions.py``'s twin, the same operations
(``transition_ops.py``) awaited on the caller's loop."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from langgraph_cancel.errors import LedgerError
from langgraph_cancel.ledger import transition_ops as ops
from langgraph_cancel.ledger.aio_backends import atransient_retry
from langgraph_cancel.ledger.aio_runs import AsyncRunLedger
from langgraph_cancel.ledger.steps import arun
from langgraph_cancel.types import (
    EffectRecord,
    EffectStatus,
    TransitionRecord,
    TransitionRequest,
    effect_status,
)


class AsyncTransitionLedger(AsyncRunLedger):
    """Compare-and-set transitions of effects and their audit trail, on an async backend."""

    async def atransition(
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
        """``Ledger.transition``: move an effect to ``to`` if, and only if, it is in an
        allowed status.

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
        return await arun(self.backend, ops.transition(self.backend, req))

    async def atransition_many(
        self, requests: Sequence[TransitionRequest]
    ) -> list[EffectRecord | LedgerError]:
        """``Ledger.transition_many``: several compare-and-sets at once, each on its own.

        Returns:
            One entry per request, in order: the moved record, or the error.

        Raises:
            IllegalTransitionError: A request the state machine forbids outright.
            ValueError: The same effect twice in one call.
        """
        return await arun(self.backend, ops.transition_many(self.backend, requests))

    @atransient_retry()
    async def ahistory(self, effect_id: str) -> list[TransitionRecord]:
        """The audit trail of an effect, oldest first."""
        return await arun(self.backend, ops.history(self.backend, effect_id))


__all__ = ["AsyncTransitionLedger"]

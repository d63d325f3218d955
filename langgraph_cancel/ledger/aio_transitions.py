"""The async ledger's transitions: ``transitions.py``'s twin, awaited on the caller's loop."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from langgraph_cancel.errors import DispatchRefusedError, LedgerError, UnknownEffectError
from langgraph_cancel.ledger import decisions as d
from langgraph_cancel.ledger import sql as q
from langgraph_cancel.ledger.aio_backends import atransient_retry
from langgraph_cancel.ledger.aio_runs import AsyncRunLedger
from langgraph_cancel.ledger.decisions import CasJob, CasOutcome
from langgraph_cancel.ledger.records import transition_record
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
        allowed, guard = d.checked(req)
        return await self._transition((req, (allowed, guard), uuid.uuid4().hex))

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
        checked = [d.checked(r) for r in requests]
        if len({r.effect_id for r in requests}) != len(requests):
            raise ValueError("transition_many: one request per effect")
        if not requests:
            return []
        tokens = [uuid.uuid4().hex for _ in requests]
        return await self._transition_many(requests, checked, tokens)

    @atransient_retry()
    async def _transition_many(
        self,
        requests: Sequence[TransitionRequest],
        checked: Sequence[tuple[frozenset[EffectStatus], bool]],
        tokens: Sequence[str],
    ) -> list[EffectRecord | LedgerError]:
        jobs: list[CasJob] = list(zip(requests, checked, tokens, strict=True))
        outcomes = await self.backend.compare_and_set_many(jobs)
        out: list[EffectRecord | LedgerError] = []
        for job, outcome in zip(jobs, outcomes, strict=True):
            try:
                out.append(await self._cas_verdict(job, outcome))
            except LedgerError as exc:
                out.append(exc)
        return out

    async def _transition_once(self, job: CasJob) -> EffectRecord:
        return await self._cas_verdict(job, await self.backend.compare_and_set(job))

    _transition = atransient_retry()(_transition_once)

    async def _cas_verdict(self, job: CasJob, outcome: CasOutcome) -> EffectRecord:
        """The record a compare-and-set moved, or what its not applying means."""
        moved, current = outcome
        if moved is not None:
            return self._effect(moved)
        req, (allowed, guard), token = job
        if current is None:
            raise UnknownEffectError(f"no effect {req.effect_id!r} in the ledger")
        return await self._lost_transition(current, req.to, allowed, guard, token)

    async def _lost_transition(
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
        run = await self.aget_run(current.run_id)
        raise DispatchRefusedError(current.effect_id, f"run {run.run_id} is {run.status.value}")

    @atransient_retry()
    async def ahistory(self, effect_id: str) -> list[TransitionRecord]:
        """The audit trail of an effect, oldest first."""
        rows = await self._all(q.SELECT_TRANSITIONS, {"effect_id": effect_id})
        return [transition_record(r, self.backend) for r in rows]


__all__ = ["AsyncTransitionLedger"]

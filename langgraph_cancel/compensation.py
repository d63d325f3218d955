"""Compensation (saga): undo committed reversible effects, newest first, each recorded.

Each compensation is itself an effect on the ledger: ``committed ->
compensating`` (the intent) before the hook runs, ``compensated`` or
``compensation_failed`` after. Hooks must be idempotent (they get the
effect's idempotency key), so a compensation left ``compensating`` by a crash
is simply run again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from langchain_core.tools import BaseTool
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from langgraph_cancel.effects import EffectSpec, spec_of
from langgraph_cancel.errors import HookError, IllegalTransitionError
from langgraph_cancel.hooks import call_compensate, run_sync
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import EffectKind, EffectRecord, EffectStatus

logger = logging.getLogger("langgraph_cancel.compensation")


def _spec_for(tool: str, tools: Mapping[str, BaseTool]) -> EffectSpec | None:
    found = tools.get(tool)
    return None if found is None else spec_of(found)


def _stored_result(rec: EffectRecord) -> Any:
    result = rec.result
    if isinstance(result, dict) and "content" in result:
        return result["content"]
    return result


def compensate_effect(
    ledger: Ledger, rec: EffectRecord, spec: EffectSpec, *, actor: str, attempts: int = 3
) -> EffectRecord:
    """Undo one committed (or half-compensated) reversible effect, recording each step.

    Blocking (database I/O, the hook, retries): call it from a worker thread in
    async code.
    """
    if rec.status is EffectStatus.COMMITTED or rec.status is EffectStatus.COMPENSATION_FAILED:
        try:
            rec = ledger.transition(rec.effect_id, EffectStatus.COMPENSATING, actor=actor)
        except IllegalTransitionError:
            return ledger.get_effect(rec.effect_id)
    elif rec.status is not EffectStatus.COMPENSATING:
        return rec
    try:
        for attempt in Retrying(
            retry=retry_if_exception_type(HookError),
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            reraise=True,
        ):
            with attempt:
                run_sync(call_compensate(spec, rec.idempotency_key, rec.args, _stored_result(rec)))
    except HookError as exc:
        logger.warning("compensation of %s failed: %s", rec.effect_id, exc)
        return ledger.transition(
            rec.effect_id,
            EffectStatus.COMPENSATION_FAILED,
            actor=actor,
            error=str(exc),
            detail={"attempts": attempts},
        )
    return ledger.transition(rec.effect_id, EffectStatus.COMPENSATED, actor=actor)


def compensate_run(
    ledger: Ledger,
    effects: list[EffectRecord],
    tools: Mapping[str, BaseTool],
    *,
    actor: str = "compensator",
) -> list[EffectRecord]:
    """Compensate every committed reversible effect in ``effects``, newest commit first.

    Effects whose tool is not known in this process are left as they are
    (and reported as committed-reversible), never guessed at.
    """
    todo = [
        e
        for e in effects
        if e.kind is EffectKind.REVERSIBLE
        and e.status
        in (EffectStatus.COMMITTED, EffectStatus.COMPENSATING, EffectStatus.COMPENSATION_FAILED)
    ]
    todo.sort(key=lambda e: (e.settled_at or e.updated_at, e.seq), reverse=True)
    done: list[EffectRecord] = []
    for rec in todo:
        spec = _spec_for(rec.tool, tools)
        if spec is None or spec.compensate is None:
            logger.warning("no compensate hook known for %s (%s)", rec.tool, rec.effect_id)
            continue
        done.append(compensate_effect(ledger, rec, spec, actor=actor))
    return done


__all__ = ["compensate_effect", "compensate_run"]

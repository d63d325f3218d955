"""Delay windows: effects that stay revocable for a while after they are made.

A tool declared ``effect(..., delay=timedelta(minutes=5), revoke=hook)`` hands its
call to a provider that holds it (a send-at email, a pending refund) and is recorded
``scheduled`` with its release time. A tool declared with ``delay`` and no ``revoke``
is held by the package itself: its intent is recorded ``scheduled`` and the outbox
(``langgraph_cancel.outbox``) sends it once the window has passed.

This module decides what a stop does with a scheduled effect (``revoke_window``) and
records a provider-held effect whose window has passed as permanent
(``settle_windows``). Each step is a compare-and-set on the ledger, so a revoke and
the outbox racing for one effect cannot both win.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from langchain_core.tools import BaseTool

from langgraph_cancel.effects import EffectSpec, spec_of
from langgraph_cancel.errors import HookError, LedgerError
from langgraph_cancel.hooks import call_revoke, run_sync
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import EffectRecord, EffectStatus, TransitionRequest, utcnow

logger = logging.getLogger("langgraph_cancel.window")

#: Who the ledger's audit trail names for the steps of this module.
REVOKER = "revoker"
#: The next action recorded on a revoke nobody could get an answer to.
REVOKE_UNANSWERED = "ask the provider whether the scheduled call was withdrawn or delivered"
#: Every step of this module moves an effect that is still ``scheduled``, and only then.
_SCHEDULED = frozenset({EffectStatus.SCHEDULED})


def _stored_handle(rec: EffectRecord) -> object:
    result = rec.result
    if isinstance(result, dict) and "content" in result:
        return result["content"]
    return result


def _move(ledger: Ledger, request: TransitionRequest) -> EffectRecord:
    (done,) = ledger.transition_many([request])
    if isinstance(done, LedgerError):
        # Someone else moved it first (the outbox released it, another stop revoked
        # it): what it is now is the answer.
        return ledger.get_effect(request.effect_id)
    return done


def _unanswered(
    ledger: Ledger,
    rec: EffectRecord,
    next_action: str,
    *,
    error: str | None = None,
) -> EffectRecord:
    """Record a scheduled effect nobody could revoke as ``unknown``, an operator's to settle."""
    return _move(
        ledger,
        TransitionRequest(
            effect_id=rec.effect_id,
            to=EffectStatus.UNKNOWN,
            expected=_SCHEDULED,
            actor=REVOKER,
            owner="operator",
            next_action=next_action,
            error=error,
        ),
    )


def _leave_window(
    ledger: Ledger, rec: EffectRecord, to: EffectStatus, detail: dict[str, Any]
) -> EffectRecord:
    """Move a scheduled effect out of its window (``revoked`` or ``committed``)."""
    return _move(
        ledger,
        TransitionRequest(
            effect_id=rec.effect_id,
            to=to,
            expected=_SCHEDULED,
            actor=REVOKER,
            detail=detail,
        ),
    )


def _revoke_through_hook(
    ledger: Ledger, rec: EffectRecord, spec: EffectSpec | None
) -> EffectRecord:
    """Ask the provider holding the call to withdraw it, and record its answer."""
    if spec is None or spec.revoke is None:
        return _unanswered(ledger, rec, f"no revoke hook known for {rec.tool}: {REVOKE_UNANSWERED}")
    try:
        withdrawn = run_sync(call_revoke(spec, rec.idempotency_key, rec.args, _stored_handle(rec)))
    except HookError as exc:
        logger.warning("revoke of %s got no answer: %s", rec.effect_id, exc)
        return _unanswered(ledger, rec, REVOKE_UNANSWERED, error=str(exc))
    if withdrawn:
        return _leave_window(
            ledger, rec, EffectStatus.REVOKED, {"release_at": _iso(rec.release_at)}
        )
    return _leave_window(
        ledger,
        rec,
        EffectStatus.COMMITTED,
        {"revoke": "refused: the provider says the call is final"},
    )


def revoke_effect(
    ledger: Ledger, rec: EffectRecord, spec: EffectSpec | None, *, now: datetime | None = None
) -> EffectRecord:
    """Undo one scheduled effect inside its window, or record it permanent after it.

    A call the package holds (never dispatched) is revoked whatever the time: it has
    not left the process, so withdrawing it is always safe. A call its provider holds
    is revoked through the tool's ``revoke`` hook while its window is open: ``revoked``
    when the provider withdrew it, ``committed`` when the provider says it is final,
    ``unknown`` (owner and next action) when the hook cannot answer. After the window
    it is ``committed``: permanent.

    Blocking (database I/O, the hook): call it from a worker thread in async code.
    """
    if rec.status is not EffectStatus.SCHEDULED:
        return rec
    if rec.held:
        detail: dict[str, Any] = {"held": True, "release_at": _iso(rec.release_at)}
        return _leave_window(ledger, rec, EffectStatus.REVOKED, detail)
    if not rec.revocable(now or utcnow()):
        return _settle_passed(ledger, rec)
    return _revoke_through_hook(ledger, rec, spec)


def revoke_window(
    ledger: Ledger, effects: Iterable[EffectRecord], tools: Mapping[str, BaseTool]
) -> list[EffectRecord]:
    """What a stop does with a run's scheduled effects: each revoked or made permanent.

    Args:
        ledger: The ledger.
        effects: The run's effects (only ``scheduled`` ones are acted on).
        tools: The tools known in this process, by name (for their revoke hooks).

    Returns:
        The scheduled effects as they now are.
    """
    out: list[EffectRecord] = []
    for rec in effects:
        if rec.status is not EffectStatus.SCHEDULED:
            continue
        tool = tools.get(rec.tool)
        out.append(revoke_effect(ledger, rec, None if tool is None else spec_of(tool)))
    return out


def _settle_passed(ledger: Ledger, rec: EffectRecord) -> EffectRecord:
    return _leave_window(
        ledger, rec, EffectStatus.COMMITTED, {"window_passed": _iso(rec.release_at)}
    )


def settle_windows(
    ledger: Ledger, effects: Iterable[EffectRecord], *, now: datetime | None = None
) -> list[EffectRecord]:
    """Record as ``committed`` each provider-held effect whose window has passed.

    Held calls are left alone: the outbox sends them. Returns the effects moved.
    """
    moment = now or utcnow()
    return [
        _settle_passed(ledger, rec)
        for rec in effects
        if rec.status is EffectStatus.SCHEDULED
        and not rec.held
        and rec.release_at is not None
        and rec.release_at <= moment
    ]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


__all__ = ["REVOKER", "REVOKE_UNANSWERED", "revoke_effect", "revoke_window", "settle_windows"]

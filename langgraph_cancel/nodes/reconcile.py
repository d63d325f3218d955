"""Asking a person about outcomes reconciliation could not settle.

The question is one ``interrupt()`` listing each unknown effect; the answer
(``Command(resume=...)``) carries one decision per effect:
``{"effect_id": ..., "decision": "committed" | "not_applied" | "unknown",
"result": ..., "owner": ..., "next_action": ..., "reviewer": ...}``, either as a
list or as ``{"decisions": [...]}``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from langgraph.types import interrupt

from langgraph_cancel.errors import IllegalTransitionError, InvalidDecisionError
from langgraph_cancel.runtime import RunScope
from langgraph_cancel.types import EffectRecord, EffectStatus

RECONCILE_DECISIONS = ("committed", "not_applied", "unknown")


def question(effects: list[EffectRecord], error: str | None = None) -> dict[str, Any]:
    """The interrupt payload describing unknown outcomes (and why the last answer failed)."""
    return {
        "type": "langgraph_cancel.reconcile",
        "message": (
            f"{len(effects)} effect(s) may or may not have happened. Check the external "
            "system by idempotency key and decide each."
        ),
        "error": error,
        "effects": [
            {
                "effect_id": e.effect_id,
                "tool": e.tool,
                "kind": e.kind.value,
                "args": e.args,
                "idempotency_key": e.idempotency_key,
                "owner": e.owner,
                "next_action": e.next_action,
                "error": e.error,
                "allowed_decisions": list(RECONCILE_DECISIONS),
            }
            for e in effects
        ],
    }


def parse_decisions(value: Any, effects: list[EffectRecord]) -> list[dict[str, Any]]:
    """Validate a resume value against the effects asked about.

    Raises:
        InvalidDecisionError: For anything malformed; nothing is applied then.
    """
    raw = value.get("decisions") if isinstance(value, dict) else value
    if not isinstance(raw, list):
        raise InvalidDecisionError(
            "reconcile resume value must be a list of decisions or {'decisions': [...]}"
        )
    known = {e.effect_id for e in effects}
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for item in raw:
        if not isinstance(item, dict):
            raise InvalidDecisionError(f"a decision must be an object, got {item!r}")
        effect_id = item.get("effect_id")
        decision = item.get("decision")
        if not isinstance(effect_id, str) or effect_id not in known:  # a list is not hashable
            raise InvalidDecisionError(f"decision for an effect not asked about: {effect_id!r}")
        if effect_id in seen:
            raise InvalidDecisionError(f"two decisions for {effect_id!r}")
        if decision not in RECONCILE_DECISIONS:
            raise InvalidDecisionError(
                f"decision must be one of {', '.join(RECONCILE_DECISIONS)}, got {decision!r}"
            )
        if decision == "unknown" and not (item.get("owner") and item.get("next_action")):
            raise InvalidDecisionError("leaving an effect unknown needs an owner and a next_action")
        seen.add(effect_id)
        out.append(item)
    return out


def ask_human_about(scope: RunScope, effects: list[EffectRecord]) -> None:
    """Interrupt with the unknown effects; apply the decisions when resumed.

    A malformed answer is not applied: the question is asked again, carrying
    the error (LangGraph keeps every resume value of a node, so raising would
    replay the bad answer on the next resume).
    """
    error: str | None = None
    while True:
        answer = interrupt(question(effects, error))
        try:
            decisions = parse_decisions(answer, effects)
        except InvalidDecisionError as exc:
            error = str(exc)
            continue
        break
    ledger = scope.ledger
    for item in decisions:
        reviewer = str(item.get("reviewer") or "human")
        target = {
            "committed": EffectStatus.COMMITTED,
            "not_applied": EffectStatus.NOT_APPLIED,
            "unknown": EffectStatus.UNKNOWN,
        }[item["decision"]]
        kwargs: dict[str, Any] = {"actor": reviewer, "detail": {"decision": item}}
        if target is EffectStatus.COMMITTED:
            kwargs["result"] = {
                "content": str(item.get("result", "confirmed by reviewer")),
                "status": "success",
            }
        if target is EffectStatus.UNKNOWN:
            kwargs["owner"] = str(item["owner"])
            kwargs["next_action"] = str(item["next_action"])
        # Settled meanwhile by someone else: their record stands.
        with contextlib.suppress(IllegalTransitionError):
            ledger.transition(item["effect_id"], target, **kwargs)


__all__ = ["RECONCILE_DECISIONS", "ask_human_about", "parse_decisions", "question"]

"""Approval where the call stands: ask a person with ``interrupt()``, or trust a decision.

A call that needs approval and has none is recorded ``pending_approval`` and
asked about inside the tool node itself (the drop-in path, where no
``ApprovalGate`` runs before it): one interrupt per call, in the shape of
LangChain's HITL request (``review.py`` builds and parses it). An invalid
answer is asked about again. A call reviewed elsewhere (``ReviewMode`` is
``"trust"``) is approved in the name of whoever runs it, and said so.
"""

from __future__ import annotations

from langgraph.config import get_config
from langgraph.types import interrupt

from langgraph_cancel.errors import ApprovalRequiredError, IllegalTransitionError
from langgraph_cancel.execution.context import CallContext
from langgraph_cancel.execution.plan import CallPlan
from langgraph_cancel.execution.review import (
    decision_request,
    edited_key,
    parse_review,
    replacement_steps,
    review_request,
    review_schema,
    reviewer_of,
)
from langgraph_cancel.execution.steps import Protocol, ledger_call, transition_steps
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ordering import OrderingNote, ordering_note
from langgraph_cancel.types import EffectKind, EffectRecord, EffectStatus


def ask_review(ctx: CallContext, plan: CallPlan, rec: EffectRecord) -> Protocol[EffectRecord]:
    """Ask a person about the call where it stands; the record with their decision.

    Raises:
        ApprovalRequiredError: The call runs outside a graph step, where nobody can
            be asked (the node invoked on its own).
    """
    _ensure_someone_can_be_asked(plan)
    rec = yield from _pending(rec)
    if rec.status is not EffectStatus.PENDING_APPROVAL:
        return rec
    error: str | None = None
    ordering: OrderingNote | None = None
    if rec.kind is not EffectKind.IRREVERSIBLE:
        ran = yield from ledger_call(Ledger.run_effects, ctx.scope.run_id)
        ordering = ordering_note(ran, [rec.kind])
    while True:
        # On resume LangGraph re-runs the node and hands the saved answers back in
        # order, so this loop replays the invalid ones up to the new answer.
        question = review_request(plan.tool, plan.spec, rec, plan.call_id)
        if ordering is not None:
            question["ordering"] = ordering
        if error is not None:
            question["error"] = error
            question["description"] = (
                f"The answer was invalid: {error}. Decide again.\n\n{question['description']}"
            )
        answer = interrupt(question, response_schema=review_schema(plan.tool))
        try:
            review = parse_review(answer, plan.tool, plan.spec, rec)
        except ValueError as exc:
            error = str(exc)
            continue
        reviewer = review.reviewer or reviewer_of(ctx.config, ctx.runtime)
        new_key = edited_key(plan.spec, rec, review.args) if review.args is not None else None
        if new_key is None:
            try:
                return (yield from transition_steps(decision_request(rec, review, reviewer)))
            except IllegalTransitionError:
                # Moved meanwhile (a cancel dropped it): what it is now is the answer.
                return (yield from ledger_call(Ledger.get_effect, rec.effect_id))
        replaced = yield from replacement_steps(
            rec, plan.call, review, reviewer, new_key, ledger_id=plan.ledger_id, seq=plan.index
        )
        if isinstance(replaced, EffectRecord):
            return replaced
        error = replaced


def _ensure_someone_can_be_asked(plan: CallPlan) -> None:
    """Refuse to ask outside a graph step (no interrupt can reach anyone there).

    Raises:
        ApprovalRequiredError: No graph step runs the call.
    """
    try:
        get_config()
    except RuntimeError:
        raise ApprovalRequiredError(
            f"{plan.tool.name!r} needs approval ({plan.spec.why_permanent()}) and has none, "
            "and outside a graph step nobody can be asked: run the node in a graph, or "
            "classify the tool with effect(..., requires_approval=False) if it may run "
            "unasked"
        ) from None


def _pending(rec: EffectRecord) -> Protocol[EffectRecord]:
    """The record moved to ``pending_approval`` (from ``planned``), or as another writer
    left it."""
    if rec.status is not EffectStatus.PLANNED:
        return rec
    try:
        return (
            yield from ledger_call(
                Ledger.transition,
                rec.effect_id,
                EffectStatus.PENDING_APPROVAL,
                expected=[EffectStatus.PLANNED],
                actor="review",
                detail={"reason": "approval required"},
            )
        )
    except IllegalTransitionError:
        return (yield from ledger_call(Ledger.get_effect, rec.effect_id))


def trust_review(ctx: CallContext, rec: EffectRecord) -> Protocol[EffectRecord]:
    """A call someone else reviews (or nobody is to): approved, and said so."""
    try:
        return (
            yield from ledger_call(
                Ledger.transition,
                rec.effect_id,
                EffectStatus.APPROVED,
                expected=[EffectStatus.PENDING_APPROVAL],
                actor=ctx.owner,
                approval={"decision": "approve", "source": "delegated", "reviewer": ctx.owner},
                detail={"decision": "approve", "delegated": True},
            )
        )
    except IllegalTransitionError:
        return (yield from ledger_call(Ledger.get_effect, rec.effect_id))


__all__ = ["ask_review", "trust_review"]

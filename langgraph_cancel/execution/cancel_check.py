"""The cancel check before a call goes out: a call of a stopped run is recorded ``dropped``.

The run's signal is checked before every dispatch (and before a call is held
for its delay window); a call that finds it up never leaves the process. Its
record says so (``dropped``, with the reason), the run's observation of the
signal is recorded once, and the model is answered from the record.
"""

from __future__ import annotations

from langchain_core.messages import ToolMessage

from langgraph_cancel.errors import IllegalTransitionError
from langgraph_cancel.execution.answers import NOT_RUN_CANCELLED, replay_message
from langgraph_cancel.execution.context import CallContext
from langgraph_cancel.execution.plan import CallPlan
from langgraph_cancel.execution.steps import Observe, Protocol, ledger_call
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.progress import ProgressKind, announce_effect
from langgraph_cancel.types import EffectRecord, EffectStatus

#: The statuses a call may be dropped from: nothing of it has gone out yet.
DROPPABLE = (
    EffectStatus.PLANNED,
    EffectStatus.PENDING_APPROVAL,
    EffectStatus.APPROVED,
    EffectStatus.NOT_APPLIED,
)


def drop_call(ctx: CallContext, plan: CallPlan, existing: EffectRecord | None) -> Protocol[None]:
    """Record that the call never runs: the run was cancelled before its dispatch."""
    if existing is None:
        dropped, _created = yield from ctx.record(
            plan, status=EffectStatus.DROPPED, error=NOT_RUN_CANCELLED
        )
        announce_effect(ProgressKind.DROPPED, dropped)
    elif existing.status in DROPPABLE:
        # Moved on meanwhile (dispatched by a sibling): whoever moved it settles it.
        try:
            moved = yield from ledger_call(
                Ledger.transition,
                existing.effect_id,
                EffectStatus.DROPPED,
                actor=ctx.owner,
                error=NOT_RUN_CANCELLED,
            )
        except IllegalTransitionError:
            return
        announce_effect(ProgressKind.DROPPED, moved)


def stopped_before_dispatch(
    ctx: CallContext, plan: CallPlan, rec: EffectRecord
) -> Protocol[ToolMessage]:
    """The run was asked to stop before ``rec``'s call went out: observed, dropped, answered.

    Returns:
        The call's answer from its record as it now stands (dropped, or whatever a
        sibling that moved it first made of it).
    """
    yield Observe()
    yield from drop_call(ctx, plan, rec)
    now = yield from ledger_call(Ledger.get_effect, rec.effect_id)
    return replay_message(now, plan.call)


__all__ = ["DROPPABLE", "drop_call", "stopped_before_dispatch"]

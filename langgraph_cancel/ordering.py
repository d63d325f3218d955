"""Irreversible last: did a run make a permanent change before it had finished the rest?

A stop at minute three can only leave nothing permanent behind if the run's
irreversible calls come after its reads, drafts and previews. Within one batch
``EffectToolNode`` already runs reads, then reversible calls, then irreversible
ones; across the model's turns only the plan can keep that order. These helpers
say when it was broken, for the report (``irreversible_first``) and for the
approval gate (``ordering_note``): the irreversible effects that went out while
reversible or read-only work of the same run was still to come.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from typing_extensions import TypedDict

from langgraph_cancel.types import (
    MAYBE_APPLIED_STATUSES,
    EffectKind,
    EffectRecord,
    EffectStatus,
)

#: What the approval gate tells a reviewer when the run's order is not irreversible-last.
ORDERING_WARNING = (
    "irreversible effects of this run already went out before this {kinds} work: "
    "a stop now cannot undo them (order the plan so irreversible calls come last)"
)


class RanEffect(TypedDict):
    """An irreversible effect that went out, as the approval payload lists it."""

    tool: str
    tool_call_id: str
    effect_id: str
    status: str


class OrderingNote(TypedDict):
    """The approval payload's note that irreversible work came first."""

    irreversible_already_ran: list[RanEffect]
    warning: str


def ran_at(effect: EffectRecord) -> datetime | None:
    """When a call went out: its dispatch, or for a read (recorded once it ran) its record."""
    if effect.dispatched_at is not None:
        return effect.dispatched_at
    if effect.kind is EffectKind.READ_ONLY and effect.status in (
        EffectStatus.COMMITTED,
        EffectStatus.FAILED,
    ):
        return effect.created_at
    return None


def _may_be_permanent(effect: EffectRecord) -> bool:
    return (
        effect.kind is EffectKind.IRREVERSIBLE
        and effect.status in MAYBE_APPLIED_STATUSES
        and effect.dispatched_at is not None
    )


def irreversible_first(effects: Iterable[EffectRecord]) -> list[EffectRecord]:
    """The irreversible effects of a run that went out before some of its read-only or
    reversible work did (in the order they went out)."""
    ran = [(when, e) for e in effects if (when := ran_at(e)) is not None]
    later_work = [when for when, e in ran if e.kind is not EffectKind.IRREVERSIBLE]
    if not later_work:
        return []
    last_other = max(later_work)
    early = [(when, e) for when, e in ran if _may_be_permanent(e) and when < last_other]
    return [e for _when, e in sorted(early, key=lambda pair: pair[0])]


def irreversible_count(effects: Iterable[EffectRecord]) -> int:
    """How many irreversible effects of a run went out (committed, or maybe applied)."""
    return sum(1 for e in effects if _may_be_permanent(e))


def ordering_note(
    run_effects: Sequence[EffectRecord], upcoming: Iterable[EffectKind]
) -> OrderingNote | None:
    """The approval payload's note, when irreversible effects of the run already went
    out and the calls about to run include read-only or reversible work; else None."""
    kinds = sorted({k.value for k in upcoming if k is not EffectKind.IRREVERSIBLE})
    if not kinds:
        return None
    ran = [e for e in run_effects if _may_be_permanent(e)]
    if not ran:
        return None
    return {
        "irreversible_already_ran": [
            {
                "tool": e.tool,
                "tool_call_id": e.tool_call_id,
                "effect_id": e.effect_id,
                "status": e.status.value,
            }
            for e in ran
        ],
        "warning": ORDERING_WARNING.format(kinds=" / ".join(k.replace("_", "-") for k in kinds)),
    }


__all__ = [
    "ORDERING_WARNING",
    "OrderingNote",
    "RanEffect",
    "irreversible_count",
    "irreversible_first",
    "ordering_note",
    "ran_at",
]

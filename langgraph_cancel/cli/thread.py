"""What the database holds about a thread, as ``status``, ``effects`` and ``report``
read it (``inspection.py``) and show it (``render/thread.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langgraph_cancel.types import EffectKind, EffectRecord, EffectStatus, LeaseRecord, RunRecord

_DONE = (
    EffectStatus.COMMITTED,
    EffectStatus.COMPENSATED,
    EffectStatus.FAILED,
    EffectStatus.NOT_APPLIED,
    # Withdrawn inside its delay window: settled, nothing permanent.
    EffectStatus.REVOKED,
)
_NOT_DONE = (
    EffectStatus.DROPPED,
    EffectStatus.REJECTED,
    EffectStatus.PLANNED,
    EffectStatus.PENDING_APPROVAL,
    EffectStatus.APPROVED,
)
_MAYBE_COMMITTED = (
    EffectStatus.DISPATCHED,
    EffectStatus.UNKNOWN,
    EffectStatus.COMPENSATING,
    EffectStatus.COMPENSATION_FAILED,
    # Inside its delay window: permanent unless revoked before ``release_at``.
    EffectStatus.SCHEDULED,
)
_SIDE_EFFECT_SHOWN = (
    EffectStatus.COMMITTED,
    *_MAYBE_COMMITTED,
    EffectStatus.COMPENSATED,
)


@dataclass(frozen=True, slots=True)
class StoredThread:
    """What the database holds about a thread.

    Attributes:
        thread_id: The thread.
        runs: Its runs, oldest first (never empty).
        effects: Every effect recorded for it.
        lease: The lease a worker holds on it, if any (possibly expired).
        interrupts: Values of interrupts waiting for an answer (read from the
            checkpoint of an unfinished run only).
        checkpoint: Step and time of the latest checkpoint of an unfinished
            run; ``None`` for a finished one (not read) or when none was saved.
    """

    thread_id: str
    runs: list[RunRecord]
    effects: list[EffectRecord]
    lease: LeaseRecord | None
    interrupts: list[Any] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = None

    @property
    def latest(self) -> RunRecord:
        """The thread's latest run."""
        return self.runs[-1]

    @property
    def done(self) -> list[EffectRecord]:
        """Effects that reached an outcome (committed, undone, failed, not applied)."""
        return [e for e in self.effects if e.status in _DONE]

    @property
    def not_done(self) -> list[EffectRecord]:
        """Effects that never left the process (dropped, rejected, planned, awaiting approval)."""
        return [e for e in self.effects if e.status in _NOT_DONE]

    @property
    def committed(self) -> list[EffectRecord]:
        """Side effects that committed."""
        return [
            e
            for e in self.effects
            if e.status is EffectStatus.COMMITTED and e.kind is not EffectKind.READ_ONLY
        ]

    @property
    def maybe_committed(self) -> list[EffectRecord]:
        """Effects that may have taken effect: in flight, unknown, or half undone."""
        return [e for e in self.effects if e.status in _MAYBE_COMMITTED]

    @property
    def side_effects(self) -> list[EffectRecord]:
        """Side effects that committed, may have, or were undone (status's question 2)."""
        return [
            e
            for e in self.effects
            if e.kind is not EffectKind.READ_ONLY and e.status in _SIDE_EFFECT_SHOWN
        ]


__all__ = ["StoredThread"]

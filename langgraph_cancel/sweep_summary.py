"""What a sweep pass did: its actions, each with the kind, thread and next step,
and the pass's summary with its metrics (``langgraph_cancel.sweeper`` makes them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Literal

from langgraph_cancel.types import EffectRecord


class SweepActionKind(str, Enum):
    """What a sweeper did (or declined to do) for one thread or effect."""

    #: Released a lease whose holder stopped heartbeating.
    REAPED_LEASE = "reaped_lease"
    #: Took over (audited) and released the lease of a process of this host that is gone.
    TOOK_OVER_LEASE = "took_over_lease"
    #: Finished a stop whose worker died: the run is now ``cancelled``.
    FINISHED_CANCEL = "finished_cancel"
    #: Closed the thread of a run its worker had cancelled before dying, ahead of the
    #: cancel node's last checkpoint (needs the graph).
    CLOSED_THREAD = "closed_thread"
    #: Settled an effect left in flight, unknown or half-compensated.
    RECONCILED = "reconciled"
    #: Ran a failed compensation again (it is now compensated, or failed again).
    COMPENSATED = "compensated"
    #: Another worker holds the thread: nothing done, the holder owns it.
    BUSY = "busy"
    #: Not the sweeper's to do: the owner's next action is given.
    LEFT_TO_OWNER = "left_to_owner"


SweepActionKindName = Literal[
    "reaped_lease",
    "took_over_lease",
    "finished_cancel",
    "closed_thread",
    "reconciled",
    "compensated",
    "busy",
    "left_to_owner",
]


@dataclass(frozen=True, slots=True)
class SweepAction:
    """One thing a sweep pass did or left.

    Attributes:
        kind: What was done.
        thread_id: The thread.
        detail: In words, for people.
        run_id: The run concerned, if any.
        effect_id: The effect concerned, if any.
        status: The effect's or run's status afterwards, if any.
        next_action: What its owner should do next (``LEFT_TO_OWNER``, ``BUSY``, and
            ``FINISHED_CANCEL`` when the thread's calls are still to be answered).
    """

    kind: SweepActionKind
    thread_id: str
    detail: str
    run_id: str | None = None
    effect_id: str | None = None
    status: str | None = None
    next_action: str | None = None

    @classmethod
    def of_effect(
        cls,
        kind: SweepActionKind,
        effect: EffectRecord,
        detail: str,
        next_action: str | None = None,
    ) -> SweepAction:
        """An action on one effect, with the effect's status as it now stands."""
        return cls(
            kind,
            effect.thread_id,
            detail,
            run_id=effect.run_id,
            effect_id=effect.effect_id,
            status=effect.status.value,
            next_action=next_action,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "kind": self.kind.value,
            "thread_id": self.thread_id,
            "detail": self.detail,
            "run_id": self.run_id,
            "effect_id": self.effect_id,
            "status": self.status,
            "next_action": self.next_action,
        }


@dataclass(frozen=True, slots=True)
class SweepSummary:
    """The record of one sweep pass: its metrics and every action.

    Attributes:
        sweeper: The worker identity the pass acted as.
        started_at: When the pass started.
        finished_at: When it ended.
        threads_examined: Threads the pass worked on (at most ``max_threads``).
        truncated: True when more threads needed work than one pass may do.
        actions: What was done or left, in order.
    """

    sweeper: str
    started_at: datetime
    finished_at: datetime
    threads_examined: int
    truncated: bool
    actions: tuple[SweepAction, ...]

    @property
    def duration_s(self) -> float:
        """How long the pass took, in seconds."""
        return (self.finished_at - self.started_at).total_seconds()

    def count(self, kind: SweepActionKind) -> int:
        """How many actions of ``kind`` the pass has."""
        return sum(1 for action in self.actions if action.kind is kind)

    @property
    def counts(self) -> dict[str, int]:
        """Actions per kind (every kind, zeros included)."""
        return {kind.value: self.count(kind) for kind in SweepActionKind}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the pass's metrics first, then its actions)."""
        return {
            "sweeper": self.sweeper,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "duration_s": round(self.duration_s, 3),
            "threads_examined": self.threads_examined,
            "truncated": self.truncated,
            "counts": self.counts,
            "actions": [action.to_json() for action in self.actions],
        }


__all__ = ["SweepAction", "SweepActionKind", "SweepActionKindName", "SweepSummary"]

"""Vocabulary: effect kinds, effect and run lifecycles, and the ledger's records.

Statuses are ``Enum`` members with a matching ``Literal`` so that both runtime
checks and type checkers see the same closed set.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from langgraph_cancel.errors import UnknownStatusError


class EffectKind(str, Enum):
    """What a tool does to the world, declared by the tool's author."""

    READ_ONLY = "read_only"
    REVERSIBLE = "reversible"
    IRREVERSIBLE = "irreversible"


EffectKindLiteral = Literal["read_only", "reversible", "irreversible"]


class EffectStatus(str, Enum):
    """The lifecycle of one tool call in the ledger (see docs/design.md)."""

    PLANNED = "planned"
    PENDING_APPROVAL = "pending_approval"
    APPROVED = "approved"
    DISPATCHED = "dispatched"
    COMMITTED = "committed"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    FAILED = "failed"
    NOT_APPLIED = "not_applied"
    UNKNOWN = "unknown"
    REJECTED = "rejected"
    DROPPED = "dropped"
    SCHEDULED = "scheduled"
    REVOKED = "revoked"


EffectStatusLiteral = Literal[
    "planned",
    "pending_approval",
    "approved",
    "dispatched",
    "committed",
    "compensating",
    "compensated",
    "compensation_failed",
    "failed",
    "not_applied",
    "unknown",
    "rejected",
    "dropped",
    "scheduled",
    "revoked",
]

_E = EffectStatus

EFFECT_TRANSITIONS: dict[EffectStatus, frozenset[EffectStatus]] = {
    # planned/approved -> scheduled: a held call, written to the outbox with its release
    # time instead of being dispatched.
    _E.PLANNED: frozenset(
        {
            _E.PENDING_APPROVAL,
            _E.APPROVED,
            _E.DISPATCHED,
            _E.DROPPED,
            _E.FAILED,
            _E.REJECTED,
            _E.SCHEDULED,
        }
    ),
    _E.PENDING_APPROVAL: frozenset({_E.APPROVED, _E.REJECTED, _E.DROPPED, _E.PENDING_APPROVAL}),
    _E.APPROVED: frozenset({_E.DISPATCHED, _E.DROPPED, _E.SCHEDULED}),
    # dispatched -> dispatched: a retry with the same key, only for retry-safe tools.
    # dispatched -> scheduled: the provider accepted a call it holds until its window ends.
    _E.DISPATCHED: frozenset(
        {_E.DISPATCHED, _E.COMMITTED, _E.FAILED, _E.NOT_APPLIED, _E.UNKNOWN, _E.SCHEDULED}
    ),
    # Revocable until its release time: revoked inside the window, committed once the
    # provider made it final, or (a held call) dispatched by the outbox after the window.
    # A revoke whose answer is lost leaves the outcome unknown.
    _E.SCHEDULED: frozenset({_E.REVOKED, _E.COMMITTED, _E.DISPATCHED, _E.UNKNOWN}),
    # An unknown effect may be re-labelled (new owner / next action) or settled.
    _E.UNKNOWN: frozenset({_E.COMMITTED, _E.NOT_APPLIED, _E.UNKNOWN}),
    # Reconciled "no effect": a fresh attempt with the same key, or nothing more.
    _E.NOT_APPLIED: frozenset({_E.DISPATCHED, _E.DROPPED}),
    # The compensation is itself an effect: intent (compensating) before the call.
    _E.COMMITTED: frozenset({_E.COMPENSATING}),
    _E.COMPENSATING: frozenset({_E.COMPENSATED, _E.COMPENSATION_FAILED}),
    _E.COMPENSATION_FAILED: frozenset({_E.COMPENSATING}),
    _E.COMPENSATED: frozenset(),
    _E.FAILED: frozenset(),
    _E.REJECTED: frozenset(),
    _E.DROPPED: frozenset(),
    _E.REVOKED: frozenset(),
}

#: Statuses in which an effect still needs something to happen to it.
UNSETTLED_STATUSES: frozenset[EffectStatus] = frozenset(
    {_E.PLANNED, _E.PENDING_APPROVAL, _E.APPROVED, _E.DISPATCHED, _E.UNKNOWN, _E.COMPENSATING}
)
#: Statuses in which the call has not left the process and never will unless acted on.
UNDISPATCHED_STATUSES: frozenset[EffectStatus] = frozenset(
    {_E.PLANNED, _E.PENDING_APPROVAL, _E.APPROVED}
)
#: Statuses that mean the external system may have done something.
MAYBE_APPLIED_STATUSES: frozenset[EffectStatus] = frozenset(
    {_E.DISPATCHED, _E.COMMITTED, _E.UNKNOWN, _E.COMPENSATING, _E.COMPENSATION_FAILED}
)
#: Statuses of an effect inside its delay window: still revocable until ``release_at``.
#: Not unsettled: nothing has to happen for the run to end, and a later run is not held
#: up by it; the outbox worker or a cancel moves it on.
WINDOW_STATUSES: frozenset[EffectStatus] = frozenset({_E.SCHEDULED})


class RunStatus(str, Enum):
    """The lifecycle of one run of a thread."""

    RUNNING = "running"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    FAILED = "failed"


RunStatusLiteral = Literal[
    "running", "cancel_requested", "cancelling", "cancelled", "completed", "failed"
]

_R = RunStatus

RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    _R.RUNNING: frozenset({_R.CANCEL_REQUESTED, _R.COMPLETED, _R.FAILED}),
    _R.CANCEL_REQUESTED: frozenset({_R.CANCELLING, _R.CANCELLED}),
    _R.CANCELLING: frozenset({_R.CANCELLED}),
    _R.CANCELLED: frozenset(),
    _R.COMPLETED: frozenset(),
    _R.FAILED: frozenset(),
}
TERMINAL_RUN_STATUSES: frozenset[RunStatus] = frozenset({_R.CANCELLED, _R.COMPLETED, _R.FAILED})
CANCEL_STATUSES: frozenset[RunStatus] = frozenset(
    {_R.CANCEL_REQUESTED, _R.CANCELLING, _R.CANCELLED}
)


class CancelPolicy(str, Enum):
    """What the cancel protocol does with an in-flight call of a tool.

    Mirrors Temporal's cancellation types: ``WAIT`` is
    WAIT_CANCELLATION_COMPLETED, ``RECONCILE`` records the call for the
    reconciler (TRY_CANCEL plus a durable intent), ``ABANDON`` stops waiting
    and is only allowed for read-only tools.
    """

    WAIT = "wait"
    RECONCILE = "reconcile"
    ABANDON = "abandon"


CancelPolicyLiteral = Literal["wait", "reconcile", "abandon"]


def effect_status(value: str | EffectStatus) -> EffectStatus:
    """Parse an effect status, raising ``UnknownStatusError`` for anything else."""
    try:
        return EffectStatus(value)
    except ValueError:
        raise UnknownStatusError(
            f"unknown effect status {value!r}; expected one of "
            + ", ".join(s.value for s in EffectStatus)
        ) from None


def run_status(value: str | RunStatus) -> RunStatus:
    """Parse a run status, raising ``UnknownStatusError`` for anything else."""
    try:
        return RunStatus(value)
    except ValueError:
        raise UnknownStatusError(
            f"unknown run status {value!r}; expected one of "
            + ", ".join(s.value for s in RunStatus)
        ) from None


def effect_kind(value: str | EffectKind) -> EffectKind:
    """Parse an effect kind, raising ``UnknownStatusError`` for anything else."""
    try:
        return EffectKind(value)
    except ValueError:
        raise UnknownStatusError(
            f"unknown effect kind {value!r}; expected one of "
            + ", ".join(k.value for k in EffectKind)
        ) from None


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EffectRecord(_Record):
    """One tool call as the ledger knows it."""

    effect_id: str
    thread_id: str
    run_id: str
    tool_call_id: str
    tool: str
    kind: EffectKind
    status: EffectStatus
    idempotency_key: str
    args: dict[str, Any] = Field(default_factory=dict)
    seq: int = 0
    result: Any = None
    error: str | None = None
    owner: str | None = None
    next_action: str | None = None
    approval: dict[str, Any] | None = None
    version: int = 1
    created_at: datetime
    updated_at: datetime
    dispatched_at: datetime | None = None
    settled_at: datetime | None = None
    #: End of the delay window: until then a ``scheduled`` effect can be revoked.
    release_at: datetime | None = None

    @property
    def settled(self) -> bool:
        """True when nothing more needs to happen to this effect."""
        return self.status not in UNSETTLED_STATUSES

    @property
    def held(self) -> bool:
        """True for a call the package holds in its outbox (scheduled, never dispatched)."""
        return self.status is EffectStatus.SCHEDULED and self.dispatched_at is None

    def revocable(self, now: datetime) -> bool:
        """True while this effect is scheduled and its window has not passed at ``now``."""
        return (
            self.status is EffectStatus.SCHEDULED
            and self.release_at is not None
            and now < self.release_at
        )


@dataclass(frozen=True, slots=True)
class NewEffect:
    """A tool call to record in one ``Ledger.plan_many`` statement with its batch.

    Attributes:
        tool_call_id: The tool-call id (with the thread, it makes the effect id).
        tool: The tool's name.
        kind: The tool's effect kind.
        args: The call's arguments (JSON-safe).
        idempotency_key: The key; ``None`` derives it from thread and call id.
        seq: The call's position in its batch.
        status: The initial status (``planned``, or a settled one for a call
            recorded after the fact: a read's outcome, a malformed call).
        result: The recorded outcome, for ``committed``.
        error: The recorded error, for ``failed`` / ``dropped``.
        detail: Audit detail for the first transition.
    """

    tool_call_id: str
    tool: str
    kind: EffectKind
    args: dict[str, Any]
    idempotency_key: str | None = None
    seq: int = 0
    status: EffectStatus = EffectStatus.PLANNED
    result: Any = None
    error: str | None = None
    detail: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TransitionRequest:
    """One compare-and-set for ``Ledger.transition_many``; fields as ``Ledger.transition``.

    ``result``, ``error`` and ``next_action`` left as ``...`` keep the stored value.
    """

    effect_id: str
    to: EffectStatus
    expected: frozenset[EffectStatus] | None = None
    actor: str = "system"
    detail: dict[str, Any] | None = None
    result: Any = ...
    error: Any = ...
    owner: str | None = None
    next_action: Any = ...
    approval: dict[str, Any] | None = None
    args: dict[str, Any] | None = None
    require_active_run: bool | None = None
    release_at: datetime | None = None


class TransitionRecord(_Record):
    """One row of an effect's audit trail."""

    effect_id: str
    from_status: EffectStatus | None
    to_status: EffectStatus
    at: datetime
    actor: str
    detail: dict[str, Any] = Field(default_factory=dict)


class RunRecord(_Record):
    """One run of a thread: its lifecycle and the cancel request, if any."""

    run_id: str
    thread_id: str
    status: RunStatus
    created_at: datetime
    updated_at: datetime
    owner: str | None = None
    parent_run_id: str | None = None
    requested_at: datetime | None = None
    requested_by: str | None = None
    reason: str | None = None
    observed_at: datetime | None = None
    quiesced_at: datetime | None = None
    tokens_after_cancel: int | None = None
    report: dict[str, Any] | None = None
    #: Model tokens the run used (counted for its token budget; kept across resumes).
    tokens_used: int = 0

    @property
    def terminal(self) -> bool:
        """True once the run reached cancelled, completed or failed."""
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def cancel_requested(self) -> bool:
        """True once anyone asked this run to stop (level-triggered)."""
        return self.status in CANCEL_STATUSES or self.requested_at is not None


class LeaseRecord(_Record):
    """A worker's claim on a thread."""

    thread_id: str
    owner: str
    acquired_at: datetime
    heartbeat_at: datetime
    expires_at: datetime


class LeaseTakeoverCause(str, Enum):
    """Why a lease was taken from a holder that had not let it go."""

    #: The holder is a process of this host that no longer runs (known at once).
    HOLDER_GONE = "holder_gone"
    #: The holder stopped heartbeating and its time to live ran out.
    EXPIRED = "expired"
    #: An operator broke a live lease (``resume --force``).
    FORCED = "forced"


LeaseTakeoverCauseLiteral = Literal["holder_gone", "expired", "forced"]


class LeaseTakeover(_Record):
    """One entry of the leases' audit trail: a thread taken from a previous holder."""

    thread_id: str
    previous_owner: str
    owner: str
    cause: LeaseTakeoverCause
    at: datetime


class CancelRequestResult(_Record):
    """What ``request_cancel`` did."""

    thread_id: str
    run_id: str | None
    accepted: bool
    first: bool
    status: RunStatus | None
    reason: str | None
    message: str


__all__ = [
    "CANCEL_STATUSES",
    "EFFECT_TRANSITIONS",
    "MAYBE_APPLIED_STATUSES",
    "RUN_TRANSITIONS",
    "TERMINAL_RUN_STATUSES",
    "UNDISPATCHED_STATUSES",
    "UNSETTLED_STATUSES",
    "WINDOW_STATUSES",
    "CancelPolicy",
    "CancelPolicyLiteral",
    "CancelRequestResult",
    "EffectKind",
    "EffectKindLiteral",
    "EffectRecord",
    "EffectStatus",
    "EffectStatusLiteral",
    "LeaseRecord",
    "LeaseTakeover",
    "LeaseTakeoverCause",
    "LeaseTakeoverCauseLiteral",
    "NewEffect",
    "RunRecord",
    "RunStatus",
    "RunStatusLiteral",
    "TransitionRecord",
    "TransitionRequest",
    "effect_kind",
    "effect_status",
    "run_status",
    "utcnow",
]

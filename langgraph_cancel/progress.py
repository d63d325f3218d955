"""Live progress of a stop, as LangGraph custom stream events.

While a run handles a stop, each step of the cancel protocol is written to the
graph's stream (``stream_mode="custom"``, or ``"custom"`` among several modes) as
one chunk ``{"langgraph_cancel": {...}}``. A client, Studio or the CLI renders
them as they arrive; the last one carries the report, so a client can show the
whole outcome from the events alone. Outside a graph's stream the events go
nowhere and cost nothing but the check.

Every event has:

- ``event``: what happened (``ProgressKind``): ``requested``, ``observed``,
  ``dropped``, ``waiting``, ``settled``, ``compensated``, ``compensation_failed``,
  ``cancelled``;
- ``run_id``, ``thread_id``: the run handling the stop;
- ``at``: when the event was written (ISO 8601, UTC).

And, by kind:

- ``requested``: ``reason``, ``requested_by``, ``requested_at`` (the request as the
  ledger holds it; written when the run first sees it, once per run);
- ``observed``: ``observed_at`` (the run acknowledged the stop: ``cancelling``);
- ``dropped``: ``effect`` (a queued call that will never run);
- ``waiting``: ``effect`` (with ``dispatched_at``: since when it is in flight) and
  ``grace_s`` (how long the run still waits for it; ``null``: until it returns);
- ``settled``: ``effect`` (its ``status`` now: ``committed``, ``failed``,
  ``not_applied`` or ``unknown``) for a call the stop waited for;
- ``compensated`` / ``compensation_failed``: ``effect`` (undone, or not);
- ``cancelled``: ``report``, the cancellation report (``CancellationReport``'s JSON).

``effect`` is ``{"effect_id", "tool_call_id", "tool", "kind", "status", "args",
"dispatched_at", "error"}`` (absent keys: null).
``ProgressEvent.model_validate(chunk["langgraph_cancel"])`` reads any of them.
"""

from __future__ import annotations

import logging
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from langgraph_cancel.types import EffectKind, EffectStatus, utcnow

if TYPE_CHECKING:
    from langgraph_cancel.types import EffectRecord, RunRecord

logger = logging.getLogger("langgraph_cancel.progress")

#: The key of every progress chunk in the custom stream.
EVENT_KEY = "langgraph_cancel"


class ProgressKind(str, Enum):
    """The steps of a stop that are streamed."""

    REQUESTED = "requested"
    OBSERVED = "observed"
    DROPPED = "dropped"
    WAITING = "waiting"
    SETTLED = "settled"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    CANCELLED = "cancelled"


ProgressKindLiteral = Literal[
    "requested",
    "observed",
    "dropped",
    "waiting",
    "settled",
    "compensated",
    "compensation_failed",
    "cancelled",
]


class ProgressEffect(BaseModel):
    """The call an event is about."""

    model_config = ConfigDict(frozen=True)

    effect_id: str | None = None
    tool_call_id: str
    tool: str
    kind: EffectKind
    status: EffectStatus
    args: dict[str, Any] = Field(default_factory=dict)
    dispatched_at: datetime | None = None
    error: str | None = None

    @classmethod
    def of(cls, record: EffectRecord) -> ProgressEffect:
        """The event's view of a ledger record."""
        return cls(
            effect_id=record.effect_id,
            tool_call_id=record.tool_call_id,
            tool=record.tool,
            kind=record.kind,
            status=record.status,
            args=record.args,
            dispatched_at=record.dispatched_at,
            error=record.error,
        )


class ProgressEvent(BaseModel):
    """One step of a stop, as streamed (see the module docstring for each kind)."""

    model_config = ConfigDict(frozen=True)

    event: ProgressKind
    run_id: str
    thread_id: str
    at: datetime
    reason: str | None = None
    requested_by: str | None = None
    requested_at: datetime | None = None
    observed_at: datetime | None = None
    effect: ProgressEffect | None = None
    grace_s: float | None = None
    report: dict[str, Any] | None = None

    def chunk(self) -> dict[str, Any]:
        """The event as a custom stream chunk (JSON-ready)."""
        return {EVENT_KEY: self.model_dump(mode="json", exclude_none=True)}


def _stream_writer() -> Any:
    """The running node's stream writer, or None outside a graph's step."""
    # Imported here: a client reading events (``langgraph_cancel.follow``, the command
    # line's ``cancel --follow``) needs the schema, not LangGraph.
    from langgraph.config import get_stream_writer

    try:
        return get_stream_writer()
    except (RuntimeError, KeyError):  # no runnable context, or a config without a runtime
        return None


def emit(event: ProgressEvent) -> None:
    """Write ``event`` to the running graph's stream; nothing outside one.

    A consumer that fails must not fail the stop: errors are logged.
    """
    writer = _stream_writer()
    if writer is None:
        return
    try:
        writer(event.chunk())
    except Exception:
        logger.debug("could not stream a progress event", exc_info=True)


def _event(kind: ProgressKind, run_id: str, thread_id: str, **fields: Any) -> ProgressEvent:
    return ProgressEvent(event=kind, run_id=run_id, thread_id=thread_id, at=utcnow(), **fields)


def announce_observed(run: RunRecord) -> None:
    """The run saw its stop: ``requested`` (the request) then ``observed``."""
    emit(
        _event(
            ProgressKind.REQUESTED,
            run.run_id,
            run.thread_id,
            reason=run.reason,
            requested_by=run.requested_by,
            requested_at=run.requested_at,
        )
    )
    emit(_event(ProgressKind.OBSERVED, run.run_id, run.thread_id, observed_at=run.observed_at))


def announce_effect(
    kind: ProgressKind, record: EffectRecord, *, grace_s: float | None = None
) -> None:
    """An event about one call (``dropped``, ``waiting``, ``settled``, compensations)."""
    emit(
        _event(
            kind,
            record.run_id,
            record.thread_id,
            effect=ProgressEffect.of(record),
            grace_s=grace_s,
        )
    )


def announce_cancelled(run_id: str, thread_id: str, report: dict[str, Any]) -> None:
    """The stop is over: the run is ``cancelled``; ``report`` is its report's JSON."""
    emit(_event(ProgressKind.CANCELLED, run_id, thread_id, report=report))


__all__ = [
    "EVENT_KEY",
    "ProgressEffect",
    "ProgressEvent",
    "ProgressKind",
    "ProgressKindLiteral",
    "announce_cancelled",
    "announce_effect",
    "announce_observed",
    "emit",
]

"""Rows to records: how the ledger reads back what it wrote, in either dialect.

Rows the ledger wrote itself: records are built without re-validating them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from langgraph_cancel.types import (
    EffectRecord,
    LeaseRecord,
    LeaseTakeover,
    LeaseTakeoverCause,
    RunRecord,
    TransitionRecord,
    effect_kind,
    effect_status,
    run_status,
)


class Codec(Protocol):
    """How a dialect stores timestamps and JSON (every ledger backend is one)."""

    def ts_in(self, value: datetime | None) -> Any:
        """Adapt a datetime for a timestamp column."""
        ...

    def ts_out(self, value: Any) -> datetime | None:
        """Read a timestamp column."""
        ...

    def json_in(self, value: Any) -> Any:
        """Adapt a JSON-able value for a JSON column."""
        ...

    def json_out(self, value: Any) -> Any:
        """Read a JSON column."""
        ...


def run_record(row: dict[str, Any], codec: Codec) -> RunRecord:
    """The ``RunRecord`` of a ``runs`` row."""
    return RunRecord.model_construct(
        run_id=row["run_id"],
        thread_id=row["thread_id"],
        status=run_status(row["status"]),
        created_at=required(codec.ts_out(row["created_at"])),
        updated_at=required(codec.ts_out(row["updated_at"])),
        owner=row["owner"],
        parent_run_id=row["parent_run_id"],
        requested_at=codec.ts_out(row["requested_at"]),
        requested_by=row["requested_by"],
        reason=row["reason"],
        observed_at=codec.ts_out(row["observed_at"]),
        quiesced_at=codec.ts_out(row["quiesced_at"]),
        tokens_after_cancel=row["tokens_after_cancel"],
        report=codec.json_out(row["report"]),
        tokens_used=row.get("tokens_used") or 0,
    )


def effect_record(row: dict[str, Any], codec: Codec) -> EffectRecord:
    """The ``EffectRecord`` of an ``effects`` row."""
    return EffectRecord.model_construct(
        effect_id=row["effect_id"],
        thread_id=row["thread_id"],
        run_id=row["run_id"],
        tool_call_id=row["tool_call_id"],
        tool=row["tool"],
        kind=effect_kind(row["kind"]),
        status=effect_status(row["status"]),
        idempotency_key=row["idempotency_key"],
        args=codec.json_out(row["args"]) or {},
        seq=row["seq"],
        result=codec.json_out(row["result"]),
        error=row["error"],
        owner=row["owner"],
        next_action=row["next_action"],
        approval=codec.json_out(row["approval"]),
        version=row["version"],
        created_at=required(codec.ts_out(row["created_at"])),
        updated_at=required(codec.ts_out(row["updated_at"])),
        dispatched_at=codec.ts_out(row["dispatched_at"]),
        settled_at=codec.ts_out(row["settled_at"]),
        release_at=codec.ts_out(row.get("release_at")),
    )


def lease_record(row: dict[str, Any], codec: Codec) -> LeaseRecord:
    """The ``LeaseRecord`` of a ``leases`` row."""
    return LeaseRecord.model_construct(
        thread_id=row["thread_id"],
        owner=row["owner"],
        acquired_at=required(codec.ts_out(row["acquired_at"])),
        heartbeat_at=required(codec.ts_out(row["heartbeat_at"])),
        expires_at=required(codec.ts_out(row["expires_at"])),
    )


def lease_takeover_record(row: dict[str, Any], codec: Codec) -> LeaseTakeover:
    """The ``LeaseTakeover`` of a ``lease_takeovers`` row."""
    return LeaseTakeover(
        thread_id=row["thread_id"],
        previous_owner=row["previous_owner"],
        owner=row["owner"],
        cause=LeaseTakeoverCause(row["cause"]),
        at=required(codec.ts_out(row["at"])),
    )


def transition_record(row: dict[str, Any], codec: Codec) -> TransitionRecord:
    """The ``TransitionRecord`` of an audit row."""
    return TransitionRecord(
        effect_id=row["effect_id"],
        from_status=None if row["from_status"] is None else effect_status(row["from_status"]),
        to_status=effect_status(row["to_status"]),
        at=required(codec.ts_out(row["at"])),
        actor=row["actor"],
        detail=codec.json_out(row["detail"]) or {},
    )


def required(value: datetime | None) -> datetime:
    """A NOT NULL timestamp column's value.

    Raises:
        ValueError: The row holds NULL there (a corrupt row).
    """
    if value is None:
        raise ValueError("missing timestamp in a ledger row")
    return value


def inserted_record(row: dict[str, Any], now: Any, codec: Codec) -> EffectRecord:
    """The record of a row as ``INSERT_EFFECT_ROW`` wrote it (version 1, made ``now``)."""
    return effect_record({**row, "version": 1, "created_at": now, "updated_at": now}, codec)


__all__ = [
    "Codec",
    "effect_record",
    "inserted_record",
    "lease_record",
    "lease_takeover_record",
    "required",
    "run_record",
    "transition_record",
]

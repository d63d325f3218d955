"""Helpers shared by the ledger tests: building effects in any status, raw SQL errors."""

from __future__ import annotations

import sqlite3
import uuid
from collections import deque
from typing import Any

from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import EFFECT_TRANSITIONS, EffectKind, EffectRecord, EffectStatus

OWNER = "ops-oncall"
NEXT_ACTION = "check the payment provider dashboard"


def path_to(target: EffectStatus) -> list[EffectStatus]:
    """The shortest chain of legal transitions from ``planned`` to ``target`` (excluded start)."""
    start = EffectStatus.PLANNED
    prev: dict[EffectStatus, EffectStatus | None] = {start: None}
    queue: deque[EffectStatus] = deque([start])
    while queue:
        here = queue.popleft()
        if here is target:
            break
        for nxt in sorted(EFFECT_TRANSITIONS[here], key=lambda s: s.value):
            if nxt not in prev:
                prev[nxt] = here
                queue.append(nxt)
    if target not in prev:
        raise AssertionError(f"{target} is unreachable from planned")
    chain: list[EffectStatus] = []
    node: EffectStatus | None = target
    while node is not None and node is not start:
        chain.append(node)
        node = prev[node]
    return list(reversed(chain))


def unknown_kwargs(status: EffectStatus) -> dict[str, Any]:
    """``owner``/``next_action`` for a move to ``unknown`` (required there), else nothing."""
    if status is EffectStatus.UNKNOWN:
        return {"owner": OWNER, "next_action": NEXT_ACTION}
    return {}


def make_effect(
    ledger: Ledger,
    status: EffectStatus,
    *,
    thread_id: str,
    run_id: str,
    tool_call_id: str | None = None,
    seq: int = 0,
    tool: str = "refund",
    kind: EffectKind = EffectKind.IRREVERSIBLE,
) -> EffectRecord:
    """Plan a tool call and walk it, through legal transitions only, to ``status``."""
    record, created = ledger.plan(
        thread_id=thread_id,
        run_id=run_id,
        tool_call_id=tool_call_id or f"call-{uuid.uuid4().hex[:10]}",
        tool=tool,
        kind=kind,
        args={"order": "o-88", "amount": 12.5},
        seq=seq,
        actor="test-planner",
    )
    assert created
    for step in path_to(status):
        record = ledger.transition(
            record.effect_id, step, actor="test-walker", **unknown_kwargs(step)
        )
    assert record.status is status
    return record


def integrity_errors() -> tuple[type[BaseException], ...]:
    """Exceptions a database raises when a constraint or trigger refuses a raw statement."""
    errors: list[type[BaseException]] = [sqlite3.IntegrityError]
    try:
        import psycopg
    except ImportError:  # pragma: no cover - postgres extra missing
        return tuple(errors)
    errors.append(psycopg.errors.IntegrityError)
    return tuple(errors)


def new_id(prefix: str) -> str:
    """A short unique id for threads, runs and tool calls."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"

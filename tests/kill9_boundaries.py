"""The kill -9 suites' boundaries: where a worker dies, and what the world must look
like afterwards (``test_recovery_kill9.py`` runs them with the refund agent prepared
by ``add_cancellation``, ``test_recovery_kill9_create_agent.py`` with the same agent
made by ``create_agent``)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import recovery_worker as rw
from langgraph_cancel.demo.tools import refund_key


@dataclass(frozen=True)
class Boundary:
    """Where the worker dies, and what the world must look like afterwards."""

    id: str
    kill_at: str
    refund_amount: float = rw.REFUND_AMOUNT  # over 100: ApprovalGate asks a reviewer first
    cancel_after: str | None = None  # pause here, request a cancel, continue
    compensate: bool = False
    hang_refund: bool = False
    in_doubt_at_kill: tuple[str, ...] = ()  # tools whose effect is dispatched at the kill
    resent_ops: tuple[str, ...] = ()  # provider operations legitimately sent twice (deduped)
    slow_checkpoints: float = 0.0  # seconds each checkpoint write takes in the killed worker

    @property
    def approval(self) -> bool:
        return self.refund_amount > 100

    @property
    def refund_key(self) -> str:
        return refund_key({"order_id": rw.ORDER, "amount": self.refund_amount})


BOUNDARIES = [
    Boundary("before_intent", "before:dispatched:issue_refund"),
    Boundary(
        "after_intent_before_call",
        "after:dispatched:issue_refund",
        in_doubt_at_kill=("issue_refund",),
    ),
    Boundary(
        "during_call", "before_call:refund", hang_refund=True, in_doubt_at_kill=("issue_refund",)
    ),
    Boundary(
        "after_call_before_outcome",
        "before:committed:issue_refund",
        in_doubt_at_kill=("issue_refund",),
    ),
    Boundary("after_outcome_before_checkpoint", "after:committed:send_email"),
    # The saved checkpoint lags the ledger by whole steps (async durability, slow disk).
    # The write that records the refund's outcome also records the email's intent.
    Boundary(
        "checkpoint_steps_behind",
        "after:committed:issue_refund",
        slow_checkpoints=1.0,
        in_doubt_at_kill=("send_email",),
    ),
    Boundary("approval_pending", "interrupted", refund_amount=120.0),
    Boundary(
        "inside_cancel_node",
        "before:finish_run:cancelled",
        cancel_after="after_call:refund",
    ),
    Boundary(
        "compensation_intent_written",
        "after:compensating:update_order",
        cancel_after="after_call:refund",
        compensate=True,
    ),
    Boundary(
        "compensation_applied_not_recorded",
        "after_call:restore_order",
        cancel_after="after_call:refund",
        compensate=True,
        resent_ops=("restore_order",),
    ),
]


def expire_in_flight(providers_path: Path, key: str) -> None:
    """The provider gives up on a request whose client died mid-call.

    The fake keeps a killed request "in flight" for the hang plus a grace
    period; a real provider would likewise time it out. We move its deadline
    into the past rather than sleep through it.
    """
    conn = sqlite3.connect(providers_path, timeout=30)
    try:
        with conn:
            conn.execute(
                "UPDATE idempotency SET in_flight_until = 0 WHERE key = ? AND state = 'in_flight'",
                (key,),
            )
    finally:
        conn.close()

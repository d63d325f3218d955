"""The kill -9 suites' boundaries: where a worker dies, and what the world must look
like afterwards (``test_recovery_kill9.py`` runs them with the refund agent prepared
by ``add_cancellation``, ``test_recovery_kill9_create_agent.py`` with the same agent
made by ``create_agent``)."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import recovery_worker as rw
from kill9_harness import (
    MARKER_TIMEOUT,
    POLL,
    Job,
    World,
    assert_no_double_execution,
    assert_report_matches_truth,
    assert_settled,
    effect_of,
)
from langgraph_cancel import EffectStatus, request_cancel
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


def killed_at(world: World, boundary: Boundary, **options: Any) -> tuple[Job, dict[str, Any]]:
    """The first worker run to ``boundary`` (its stop asked for on the way, when the
    boundary says so) and killed there; the job, and the providers' truth at the kill.

    ``options`` go to the job's spec (``agent=`` names the ``create_agent`` agent).
    """
    providers = world.providers()
    if boundary.hang_refund:
        providers.set_fault("refund", "hang:30", times=1)
    first = world.start(
        "first",
        "run",
        kill_at=None if boundary.hang_refund else boundary.kill_at,
        signal_at=[boundary.kill_at] if boundary.hang_refund else [],
        refund_amount=boundary.refund_amount,
        compensate_on_cancel=boundary.compensate,
        pause_at=[boundary.cancel_after] if boundary.cancel_after else [],
        slow_checkpoints=boundary.slow_checkpoints,
        **options,
    )
    if boundary.cancel_after:
        first.wait_point(boundary.cancel_after, "paused")
        asked = request_cancel(
            world.db_url, world.thread_id, reason="user pressed stop", requested_by="test"
        )
        assert asked.accepted, asked
        first.go(boundary.cancel_after)
    first.wait_point(boundary.kill_at)
    if boundary.hang_refund:
        deadline = time.monotonic() + MARKER_TIMEOUT
        while not providers.pending(boundary.refund_key):
            assert time.monotonic() < deadline, "the refund never reached the provider"
            time.sleep(POLL)
    first.kill9()
    return first, providers.truth()


def recovered(
    world: World, boundary: Boundary, **options: Any
) -> tuple[Job, dict[str, Any], dict[str, Any]]:
    """A new process after the kill: the three questions first, from the database
    alone; then it resumes, on SQLite with ``langgraph-cancel resume`` (which
    reconciles first), on PostgreSQL with ``graph.invoke(None)`` (the tool node settles
    what it left in flight). The job, its result and its answers."""
    second = world.start(
        "second",
        "recover",
        refund_amount=boundary.refund_amount,
        compensate_on_cancel=boundary.compensate,
        resume_via="cli" if world.backend == "sqlite" else "invoke",
        **options,
    )
    return second, second.ok(), second.answers()


def assert_orphaned_refund_not_applied(
    world: World, boundary: Boundary, truth: dict[str, Any], **options: Any
) -> None:
    """A hanging refund's boundary, after the recovery left it ``unknown``: later the
    provider gives up on the orphaned request, and a reconcile in another new process
    learns that the refund did not happen (``options`` go to that job's spec)."""
    ledger = world.ledger()
    assert not truth["refunds"]
    expire_in_flight(world.providers_path, boundary.refund_key)
    third = world.start("third", "reconcile", **options)
    assert third.ok()["left_unknown"] == []
    refund = effect_of(ledger, world.thread_id, "issue_refund")
    assert refund.status is EffectStatus.NOT_APPLIED, refund
    truth = world.providers().truth()
    assert_no_double_execution(truth)
    assert not truth["refunds"]
    assert_settled(ledger, world.thread_id)
    assert_report_matches_truth(world, truth)

"""Runs and thread leases in the effect ledger, on every backend through ``db_url``.

Covers the run lifecycle (first reason wins, one terminal transition enforced by
the database, no dispatch after a cancel request) and thread leases, plus the
async methods of both ledgers (the sync one's threaded twins and ``AsyncLedger``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from langgraph_cancel.errors import (
    DispatchRefusedError,
    IllegalTransitionError,
    ThreadBusyError,
    TransitionConflictError,
    UnknownEffectError,
    UnknownRunError,
    UnknownThreadError,
)
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import AsyncLedger
from langgraph_cancel.types import (
    TERMINAL_RUN_STATUSES,
    EffectKind,
    EffectStatus,
    LeaseTakeoverCause,
    RunStatus,
)
from ledger_util import integrity_errors, make_effect, new_id

# ------------------------------------------------------------------ run lifecycle


def test_start_run_returns_the_live_run(ledger: Ledger) -> None:
    thread = new_id("t")
    assert ledger.active_run(thread) is None
    assert ledger.latest_run(thread) is None
    run = ledger.start_run(thread, run_id="run-1", owner="w1")
    assert (run.run_id, run.thread_id, run.status, run.owner) == ("run-1", thread, "running", "w1")
    assert not run.terminal and not run.cancel_requested
    again = ledger.start_run(thread, run_id="run-2", owner="w2")
    assert again == run  # at most one live run per thread
    assert ledger.active_run(thread) == run
    assert ledger.get_run("run-1") == run
    assert ledger.runs(thread) == [run]
    assert ledger.finish_run("run-1", RunStatus.COMPLETED) is True
    assert ledger.active_run(thread) is None
    nxt = ledger.start_run(thread, run_id="run-2")
    assert nxt.run_id == "run-2" and nxt.status is RunStatus.RUNNING
    assert [r.run_id for r in ledger.runs(thread)] == ["run-1", "run-2"]
    assert ledger.latest_run(thread) == nxt
    with pytest.raises(UnknownRunError):
        ledger.get_run("no-such-run")


def test_request_cancel_first_reason_wins(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    first = ledger.request_cancel(thread, reason="user pressed stop", requested_by="alice")
    assert first.accepted and first.first
    assert (first.run_id, first.status, first.reason) == (
        run.run_id,
        RunStatus.CANCEL_REQUESTED,
        "user pressed stop",
    )
    second = ledger.request_cancel(thread, reason="deploy", requested_by="bob")
    assert second.accepted and not second.first
    assert second.reason == "user pressed stop"
    stored = ledger.get_run(run.run_id)
    assert stored.status is RunStatus.CANCEL_REQUESTED and stored.cancel_requested
    assert (stored.reason, stored.requested_by) == ("user pressed stop", "alice")
    assert stored.requested_at is not None
    requested_at = stored.requested_at

    observed = ledger.mark_observed(run.run_id)
    assert observed.status is RunStatus.CANCELLING and observed.observed_at is not None
    assert ledger.mark_observed(run.run_id).observed_at == observed.observed_at  # idempotent
    third = ledger.request_cancel(thread, reason="again", requested_by="carol")
    assert third.accepted and not third.first and third.reason == "user pressed stop"
    assert ledger.get_run(run.run_id).requested_at == requested_at
    assert ledger.runs_by_status(RunStatus.CANCELLING) == [ledger.get_run(run.run_id)]

    assert ledger.finish_run(run.run_id, RunStatus.CANCELLED) is True
    done = ledger.request_cancel(thread, reason="late", requested_by="dave")
    assert not done.accepted and not done.first
    assert done.status is RunStatus.CANCELLED and done.reason == "user pressed stop"
    assert ledger.get_run(run.run_id).requested_by == "alice"


def test_cancelling_a_finished_run_is_a_no_op_answer(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    assert ledger.finish_run(run.run_id, "completed") is True
    answer = ledger.request_cancel(thread, reason="too late", requested_by="alice")
    assert not answer.accepted and not answer.first
    assert answer.run_id == run.run_id and answer.status is RunStatus.COMPLETED
    assert "completed" in answer.message
    stored = ledger.get_run(run.run_id)
    assert stored.status is RunStatus.COMPLETED and stored.reason is None
    assert stored.requested_at is None


def test_unknown_threads_runs_and_effects_raise(ledger: Ledger) -> None:
    with pytest.raises(UnknownThreadError) as info:
        ledger.request_cancel("never-seen", reason="x", requested_by="y")
    assert info.value.thread_id == "never-seen"
    assert isinstance(info.value, KeyError)
    with pytest.raises(UnknownThreadError):
        ledger.require_latest_run("never-seen")
    with pytest.raises(UnknownRunError):
        ledger.mark_observed("no-such-run")
    with pytest.raises(UnknownRunError):
        ledger.get_run("no-such-run")
    with pytest.raises(UnknownEffectError):
        ledger.transition("no-such-effect", EffectStatus.APPROVED)
    with pytest.raises(UnknownEffectError):
        ledger.get_effect("no-such-effect")


def test_cancel_cascades_to_child_runs(ledger: Ledger) -> None:
    parent_t, child_t = new_id("p"), new_id("c")
    parent = ledger.start_run(parent_t)
    child = ledger.start_run(child_t, parent_run_id=parent.run_id)
    assert ledger.child_runs(parent.run_id) == [child]
    ledger.request_cancel(parent_t, reason="stop all", requested_by="alice")
    got = ledger.get_run(child.run_id)
    assert got.status is RunStatus.CANCEL_REQUESTED
    assert got.reason is not None and "stop all" in got.reason


def test_finish_run_makes_exactly_one_terminal_transition(ledger: Ledger) -> None:
    for terminal in sorted(TERMINAL_RUN_STATUSES, key=lambda s: s.value):
        thread = new_id("t")
        run = ledger.start_run(thread)
        if terminal is RunStatus.CANCELLED:
            ledger.request_cancel(thread, reason="r", requested_by="u")
        report = {"summary": "nothing permanent"}
        assert ledger.finish_run(run.run_id, terminal, report=report, tokens_after_cancel=0)
        stored = ledger.get_run(run.run_id)
        assert stored.status is terminal and stored.terminal
        assert stored.report == report
        for other in TERMINAL_RUN_STATUSES:
            assert ledger.finish_run(run.run_id, other) is False
        assert ledger.get_run(run.run_id).status is terminal

        # The database itself refuses to move a terminal run (trigger), whatever the SQL.
        for target in ("running", "cancel_requested", *(s.value for s in TERMINAL_RUN_STATUSES)):
            if target == terminal.value:
                continue
            with pytest.raises(integrity_errors(), match="already terminal"):  # noqa: SIM117
                with ledger.backend.transaction() as cur:
                    cur.execute(
                        "UPDATE lgc_runs SET status = %(s)s WHERE run_id = %(id)s",
                        {"s": target, "id": run.run_id},
                    )
        assert ledger.get_run(run.run_id).status is terminal
        assert ledger.active_run(thread) is None


def test_finish_run_refuses_non_terminal_and_unreachable_targets(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    with pytest.raises(IllegalTransitionError):
        ledger.finish_run(run.run_id, RunStatus.CANCELLING)
    with pytest.raises(IllegalTransitionError):
        ledger.finish_run(run.run_id, RunStatus.RUNNING)
    with pytest.raises(IllegalTransitionError):  # running -> cancelled skips the request
        ledger.finish_run(run.run_id, RunStatus.CANCELLED)
    ledger.request_cancel(thread, reason="r", requested_by="u")
    with pytest.raises(IllegalTransitionError):  # a cancel request forbids "completed"
        ledger.finish_run(run.run_id, RunStatus.COMPLETED)
    assert ledger.get_run(run.run_id).status is RunStatus.CANCEL_REQUESTED
    with pytest.raises(UnknownRunError):
        ledger.finish_run("no-such-run", RunStatus.COMPLETED)


def test_dispatch_is_refused_once_cancel_is_requested(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    approved = make_effect(ledger, EffectStatus.APPROVED, thread_id=thread, run_id=run.run_id)
    planned = make_effect(ledger, EffectStatus.PLANNED, thread_id=thread, run_id=run.run_id)
    retry = make_effect(ledger, EffectStatus.NOT_APPLIED, thread_id=thread, run_id=run.run_id)
    ledger.request_cancel(thread, reason="stop", requested_by="alice")
    for rec in (approved, planned, retry):
        with pytest.raises(DispatchRefusedError) as info:
            ledger.transition(rec.effect_id, EffectStatus.DISPATCHED, actor="worker")
        assert info.value.effect_id == rec.effect_id
        assert "cancel_requested" in info.value.reason
        after = ledger.get_effect(rec.effect_id)
        assert after.status is rec.status and after.dispatched_at == rec.dispatched_at
        assert len(ledger.history(rec.effect_id)) == rec.version
    ledger.mark_observed(run.run_id)
    with pytest.raises(DispatchRefusedError, match="cancelling"):
        ledger.transition(approved.effect_id, EffectStatus.DISPATCHED)
    # Cancellation may still settle undispatched work.
    assert ledger.transition(approved.effect_id, "dropped").status is EffectStatus.DROPPED
    assert ledger.transition(planned.effect_id, "dropped").status is EffectStatus.DROPPED
    assert ledger.effects_by_status(EffectStatus.DISPATCHED) == []

    # Nor after the run finished.
    thread2 = new_id("t")
    run2 = ledger.start_run(thread2)
    late = make_effect(ledger, EffectStatus.APPROVED, thread_id=thread2, run_id=run2.run_id)
    ledger.finish_run(run2.run_id, RunStatus.FAILED)
    with pytest.raises(DispatchRefusedError, match="failed"):
        ledger.transition(late.effect_id, EffectStatus.DISPATCHED)


def test_repeat_dispatch_must_be_explicit(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    rec = make_effect(ledger, EffectStatus.DISPATCHED, thread_id=thread, run_id=run.run_id)
    # A plain "dispatch it" on an effect already in flight loses: no silent second dispatch.
    with pytest.raises(TransitionConflictError):
        ledger.transition(rec.effect_id, EffectStatus.DISPATCHED, actor="worker-2")
    assert ledger.get_effect(rec.effect_id).version == rec.version
    # A retry with the same key is an explicit decision, and it is audited.
    again = ledger.transition(
        rec.effect_id,
        EffectStatus.DISPATCHED,
        expected=[EffectStatus.DISPATCHED],
        actor="retrier",
        detail={"retry_same_key": True},
    )
    assert again.status is EffectStatus.DISPATCHED and again.version == rec.version + 1
    last = ledger.history(rec.effect_id)[-1]
    assert (last.from_status, last.to_status, last.actor) == (
        EffectStatus.DISPATCHED,
        EffectStatus.DISPATCHED,
        "retrier",
    )


# ------------------------------------------------------------------------- leases


def test_lease_acquire_reentrant_busy_heartbeat_release(ledger: Ledger) -> None:
    thread = new_id("t")
    assert ledger.lease(thread) is None
    lease = ledger.acquire_lease(thread, "w1", ttl=30)
    assert lease.owner == "w1" and lease.expires_at > lease.acquired_at
    again = ledger.acquire_lease(thread, "w1", ttl=60)  # re-entrant for the same owner
    assert again.owner == "w1" and again.acquired_at == lease.acquired_at
    assert again.expires_at > lease.expires_at
    with pytest.raises(ThreadBusyError) as info:
        ledger.acquire_lease(thread, "w2", ttl=30)
    assert (info.value.thread_id, info.value.owner) == (thread, "w1")
    assert info.value.expires_at == again.expires_at.isoformat()

    assert ledger.heartbeat(thread, "w1", ttl=90) is True
    beat = ledger.lease(thread)
    assert beat is not None and beat.expires_at > again.expires_at
    assert ledger.heartbeat(thread, "w2") is False
    ledger.release_lease(thread, "w2")  # not the holder: no-op
    held = ledger.lease(thread)
    assert held is not None and held.owner == "w1"
    assert ledger.expired_leases() == []

    ledger.release_lease(thread, "w1")
    assert ledger.lease(thread) is None
    assert ledger.heartbeat(thread, "w1") is False
    taken = ledger.acquire_lease(thread, "w2", ttl=30)
    assert taken.owner == "w2"


def test_expired_lease_can_be_taken_by_another_owner(ledger: Ledger) -> None:
    thread, other = new_id("t"), new_id("t")
    ledger.acquire_lease(thread, "w1", ttl=0.05)
    ledger.acquire_lease(other, "w9", ttl=30)
    time.sleep(0.1)
    expired = ledger.expired_leases()
    assert [(le.thread_id, le.owner) for le in expired] == [(thread, "w1")]
    taken = ledger.acquire_lease(thread, "w2", ttl=30)
    assert taken.owner == "w2"
    assert ledger.heartbeat(thread, "w1") is False  # the old holder lost it
    assert ledger.expired_leases() == []
    with pytest.raises(ThreadBusyError):
        ledger.acquire_lease(thread, "w1", ttl=30)
    with pytest.raises(ThreadBusyError):
        ledger.acquire_lease(other, "w2", ttl=30)


def test_a_broken_lease_is_audited_and_every_lease_listed(ledger: Ledger) -> None:
    thread, idle = new_id("t"), new_id("t")
    ledger.acquire_lease(thread, "w1", ttl=300)
    ledger.acquire_lease(idle, "w9", ttl=0.05)
    taken = ledger.break_lease(thread, "operator", ttl=30)
    assert taken is not None and taken.owner == "operator"
    [takeover] = ledger.lease_takeovers(thread)
    assert (takeover.previous_owner, takeover.cause) == ("w1", LeaseTakeoverCause.FORCED)
    assert ledger.break_lease(thread, "operator") is None  # already its own: nothing written
    assert ledger.break_lease(new_id("t"), "operator") is None  # nobody held it
    assert len(ledger.lease_takeovers(thread)) == 1
    time.sleep(0.1)
    listed = {(lease.thread_id, lease.owner) for lease in ledger.leases()}
    assert {(thread, "operator"), (idle, "w9")} <= listed  # live and expired alike


# ---------------------------------------------------------------------- async twins


@pytest.fixture(params=["threaded", "native"])
async def either_ledger(
    request: pytest.FixtureRequest, ledger: Ledger
) -> AsyncIterator[Ledger | AsyncLedger]:
    """The sync ledger's ``a*`` twins (in threads), then the ``AsyncLedger`` on its database."""
    if request.param == "threaded":
        yield ledger
        return
    native = await AsyncLedger.twin_of(ledger)
    try:
        yield native
    finally:
        await native.aclose()


async def test_async_lifecycle(either_ledger: Ledger | AsyncLedger) -> None:
    ledger = either_ledger
    thread = new_id("t")
    run = await ledger.astart_run(thread)
    assert run == await ledger.aactive_run(thread)
    rec, created = await ledger.aplan(
        thread_id=thread,
        run_id=run.run_id,
        tool_call_id="c1",
        tool="refund",
        kind=EffectKind.IRREVERSIBLE,
        args={"amount": 3},
    )
    assert created
    again, created_again = await ledger.aplan(
        thread_id=thread,
        run_id=run.run_id,
        tool_call_id="c1",
        tool="refund",
        kind=EffectKind.IRREVERSIBLE,
        args={"amount": 3},
    )
    assert not created_again and again.effect_id == rec.effect_id
    await ledger.atransition(rec.effect_id, EffectStatus.APPROVED, actor="human")
    sent = await ledger.atransition(rec.effect_id, EffectStatus.DISPATCHED, actor="worker")
    assert sent.status is EffectStatus.DISPATCHED
    with pytest.raises(IllegalTransitionError):
        await ledger.atransition(rec.effect_id, EffectStatus.APPROVED)
    done = await ledger.atransition(rec.effect_id, "committed", result={"ok": True})
    assert done.result == {"ok": True}
    history = await ledger.ahistory(rec.effect_id)
    assert [h.to_status.value for h in history] == [
        "planned",
        "approved",
        "dispatched",
        "committed",
    ]
    assert await ledger.aeffects(thread) == [done]
    assert await ledger.aunsettled(thread) == []
    assert await ledger.aget_effect(rec.effect_id) == done
    assert await ledger.aeffect_by_key(rec.idempotency_key) == done

    answer = await ledger.arequest_cancel(thread, reason="stop", requested_by="alice")
    assert answer.first
    assert (await ledger.amark_observed(run.run_id)).status is RunStatus.CANCELLING
    assert await ledger.afinish_run(run.run_id, RunStatus.CANCELLED) is True
    assert await ledger.afinish_run(run.run_id, RunStatus.CANCELLED) is False
    latest = await ledger.alatest_run(thread)
    assert latest is not None and latest.status is RunStatus.CANCELLED
    with pytest.raises(UnknownThreadError):
        await ledger.arequest_cancel("nobody", reason="x", requested_by="y")


async def test_async_concurrent_cancels_and_leases(either_ledger: Ledger | AsyncLedger) -> None:
    ledger = either_ledger
    thread = new_id("t")
    run = await ledger.astart_run(thread)
    answers = await asyncio.gather(
        *(ledger.arequest_cancel(thread, reason=f"r{i}", requested_by=f"u{i}") for i in range(10))
    )
    winners = [a for a in answers if a.first]
    assert len(winners) == 1
    assert (await ledger.aget_run(run.run_id)).reason == winners[0].reason

    lease = await ledger.aacquire_lease(thread, "w1", ttl=30)
    assert lease.owner == "w1"
    with pytest.raises(ThreadBusyError):
        await ledger.aacquire_lease(thread, "w2", ttl=30)
    assert await ledger.aheartbeat(thread, "w1") is True
    await ledger.arelease_lease(thread, "w1")
    assert (await ledger.aacquire_lease(thread, "w2")).owner == "w2"

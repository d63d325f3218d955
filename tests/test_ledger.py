"""The effect ledger on every backend (memory, SQLite, PostgreSQL) through ``db_url``.

Covers the lifecycle state machine (every legal and every illegal transition),
the audit trail, status parsing, idempotency keys and queries. The run lifecycle,
thread leases and the async methods are in ``test_ledger_runs.py``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from langgraph_cancel.errors import (
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    TransitionConflictError,
    UnknownStatusError,
)
from langgraph_cancel.ledger import Ledger, derive_effect_id, derive_idempotency_key
from langgraph_cancel.types import (
    EFFECT_TRANSITIONS,
    UNSETTLED_STATUSES,
    EffectKind,
    EffectRecord,
    EffectStatus,
    NewEffect,
    RunStatus,
    TransitionRequest,
    utcnow,
)
from ledger_util import (
    NEXT_ACTION,
    OWNER,
    integrity_errors,
    make_effect,
    new_id,
    path_to,
    unknown_kwargs,
)

ALL_STATUSES: list[EffectStatus] = list(EffectStatus)
LEGAL_PAIRS: list[tuple[EffectStatus, EffectStatus]] = [
    (src, dst) for src in ALL_STATUSES for dst in ALL_STATUSES if dst in EFFECT_TRANSITIONS[src]
]
ILLEGAL_PAIRS: list[tuple[EffectStatus, EffectStatus]] = [
    (src, dst) for src in ALL_STATUSES for dst in ALL_STATUSES if dst not in EFFECT_TRANSITIONS[src]
]


def test_transition_table_is_total_and_reachable() -> None:
    # Sanity of the table the other tests iterate over.
    assert set(EFFECT_TRANSITIONS) == set(EffectStatus)
    assert len(LEGAL_PAIRS) + len(ILLEGAL_PAIRS) == len(ALL_STATUSES) ** 2
    assert len(ILLEGAL_PAIRS) > 100
    for status in ALL_STATUSES:
        if status is not EffectStatus.PLANNED:
            assert path_to(status)[-1] is status


# --------------------------------------------------------------------- transitions


def test_every_legal_transition_works_and_is_audited(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    for src, dst in LEGAL_PAIRS:
        rec = make_effect(ledger, src, thread_id=thread, run_id=run.run_id)
        before_history = ledger.history(rec.effect_id)
        detail = {"pair": f"{src.value}->{dst.value}", "n": 1}
        t0 = utcnow()
        # A repeat dispatch must be asked for explicitly; everything else uses the default
        # "any legal predecessor" compare-and-set.
        expected = [src] if (src, dst) == (EffectStatus.DISPATCHED,) * 2 else None
        moved = ledger.transition(
            rec.effect_id,
            dst,
            expected=expected,
            actor="alice",
            detail=detail,
            **unknown_kwargs(dst),
        )
        t1 = utcnow()
        assert moved.status is dst, (src, dst)
        assert moved.version == rec.version + 1
        stored = ledger.get_effect(rec.effect_id)
        assert stored == moved
        if dst is EffectStatus.DISPATCHED:
            assert moved.dispatched_at is not None and t0 <= moved.dispatched_at <= t1
        if dst not in UNSETTLED_STATUSES:
            assert moved.settled_at is not None and t0 <= moved.settled_at <= t1
            assert moved.settled
        else:
            assert not moved.settled
        if dst is EffectStatus.UNKNOWN:
            assert (moved.owner, moved.next_action) == (OWNER, NEXT_ACTION)

        history = ledger.history(rec.effect_id)
        assert len(history) == len(before_history) + 1, (src, dst)
        last = history[-1]
        assert last.effect_id == rec.effect_id
        assert (last.from_status, last.to_status) == (src, dst)
        assert last.actor == "alice"
        assert last.detail == detail
        assert isinstance(last.at, datetime) and last.at.tzinfo is not None
        assert t0 <= last.at <= t1


def test_audit_trail_records_the_whole_path(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    rec = make_effect(ledger, EffectStatus.COMPENSATED, thread_id=thread, run_id=run.run_id)
    history = ledger.history(rec.effect_id)
    chain = path_to(EffectStatus.COMPENSATED)
    assert [h.to_status for h in history] == [EffectStatus.PLANNED, *chain]
    assert [h.from_status for h in history] == [None, EffectStatus.PLANNED, *chain[:-1]]
    assert history[0].actor == "test-planner"
    assert all(h.actor == "test-walker" for h in history[1:])
    times = [h.at for h in history]
    assert times == sorted(times)
    assert rec.version == len(history)


def test_every_illegal_transition_raises(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    checked = 0
    for src in ALL_STATUSES:
        rec = make_effect(ledger, src, thread_id=thread, run_id=run.run_id)
        history_len = len(ledger.history(rec.effect_id))
        for dst in ALL_STATUSES:
            if dst in EFFECT_TRANSITIONS[src]:
                continue
            extra: dict[str, Any] = {"owner": OWNER, "next_action": NEXT_ACTION}
            # The database's compare-and-set refuses it (default: any legal predecessor).
            with pytest.raises(IllegalTransitionError) as info:
                ledger.transition(rec.effect_id, dst, actor="mallory", **extra)
            assert not isinstance(info.value, TransitionConflictError), (src, dst)
            assert info.value.record_id == rec.effect_id
            assert (info.value.current, info.value.requested) == (src.value, dst.value)
            # Claiming the source status explicitly is refused before touching the database.
            with pytest.raises(IllegalTransitionError):
                ledger.transition(rec.effect_id, dst, expected=[src], actor="mallory", **extra)
            checked += 1
        after = ledger.get_effect(rec.effect_id)
        assert after.status is src and after.version == rec.version
        assert len(ledger.history(rec.effect_id)) == history_len
    assert checked == len(ILLEGAL_PAIRS)


def test_unknown_status_strings_raise(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    rec = make_effect(ledger, EffectStatus.PLANNED, thread_id=thread, run_id=run.run_id)
    with pytest.raises(UnknownStatusError, match="bogus"):
        ledger.transition(rec.effect_id, "bogus")
    with pytest.raises(UnknownStatusError):
        ledger.transition(rec.effect_id, "APPROVED")  # statuses are lower-case values
    with pytest.raises(UnknownStatusError):
        ledger.transition(rec.effect_id, "approved", expected=["planned", "nope"])
    with pytest.raises(UnknownStatusError):
        ledger.plan(
            thread_id=thread,
            run_id=run.run_id,
            tool_call_id="c-x",
            tool="t",
            kind="irreversible",
            args={},
            status="half-done",
        )
    with pytest.raises(UnknownStatusError):
        ledger.plan(
            thread_id=thread,
            run_id=run.run_id,
            tool_call_id="c-y",
            tool="t",
            kind="dangerous",
            args={},
        )
    with pytest.raises(UnknownStatusError):
        ledger.effects_by_status("bogus")
    with pytest.raises(UnknownStatusError):
        ledger.runs_by_status("stopped")
    with pytest.raises(UnknownStatusError):
        ledger.finish_run(run.run_id, "stopped")
    # UnknownStatusError is a ValueError too, for callers that catch that.
    with pytest.raises(ValueError):
        ledger.transition(rec.effect_id, "")
    # Nothing was written by any of these.
    assert ledger.get_effect(rec.effect_id).status is EffectStatus.PLANNED
    assert ledger.find_effect(thread, "c-x") is None
    assert ledger.find_effect(thread, "c-y") is None
    assert ledger.get_run(run.run_id).status is RunStatus.RUNNING
    # Good strings are accepted, as are enum members.
    assert ledger.transition(rec.effect_id, "approved").status is EffectStatus.APPROVED


def test_plan_only_accepts_initial_statuses(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    for status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN, EffectStatus.APPROVED):
        with pytest.raises(IllegalTransitionError):
            ledger.plan(
                thread_id=thread,
                run_id=run.run_id,
                tool_call_id=f"c-{status.value}",
                tool="t",
                kind=EffectKind.IRREVERSIBLE,
                args={},
                status=status,
            )
    rec, created = ledger.plan(
        thread_id=thread,
        run_id=run.run_id,
        tool_call_id="c-ro",
        tool="search",
        kind=EffectKind.READ_ONLY,
        args={"q": "x"},
        status=EffectStatus.COMMITTED,
        result={"hits": 3},
        actor="fast-path",
    )
    assert created and rec.status is EffectStatus.COMMITTED and rec.settled
    assert rec.result == {"hits": 3} and rec.settled_at is not None
    [row] = ledger.history(rec.effect_id)
    assert (row.from_status, row.to_status, row.actor) == (
        None,
        EffectStatus.COMMITTED,
        "fast-path",
    )


@pytest.mark.parametrize("value", ["ok", "42", '{"a": 1}', "", 7, [1, "two"], {"x": "y"}])
def test_a_recorded_value_comes_back_as_it_was_given(ledger: Ledger, value: Any) -> None:
    """Results, approvals and audit details keep their JSON type: a string that looks
    like JSON (or is none) stays that string."""
    thread = new_id("t")
    run = ledger.start_run(thread)
    rec = make_effect(ledger, EffectStatus.DISPATCHED, thread_id=thread, run_id=run.run_id)
    done = ledger.transition(
        rec.effect_id, EffectStatus.COMMITTED, actor="test", result=value, detail={"note": value}
    )
    assert done.result == value
    assert ledger.get_effect(rec.effect_id).result == value
    assert ledger.history(rec.effect_id)[-1].detail == {"note": value}
    (batched,) = ledger.plan_many(
        thread_id=thread,
        run_id=run.run_id,
        items=[
            NewEffect(
                tool_call_id="c-read",
                tool="search",
                kind=EffectKind.READ_ONLY,
                args={"q": value},
                status=EffectStatus.COMMITTED,
                result=value,
            )
        ],
        owner="test",
        actor="test",
    )
    assert isinstance(batched, tuple)
    assert batched[0].result == value and batched[0].args == {"q": value}
    assert ledger.get_effect(batched[0].effect_id).result == value


def test_unknown_needs_owner_and_next_action(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    rec = make_effect(ledger, EffectStatus.DISPATCHED, thread_id=thread, run_id=run.run_id)
    refused: list[dict[str, Any]] = [
        {},
        {"owner": OWNER},
        {"next_action": NEXT_ACTION},
        {"next_action": None},
    ]
    for kwargs in refused:
        with pytest.raises(IllegalTransitionError, match="owner"):
            ledger.transition(rec.effect_id, EffectStatus.UNKNOWN, **kwargs)
    assert ledger.get_effect(rec.effect_id).status is EffectStatus.DISPATCHED
    assert len(ledger.history(rec.effect_id)) == 2

    # The database refuses it as well (CHECK constraint), whatever Python does.
    with pytest.raises(integrity_errors()), ledger.backend.transaction() as cur:
        cur.execute(
            "UPDATE lgc_effects SET status = 'unknown', owner = NULL, next_action = NULL "
            "WHERE effect_id = %(id)s",
            {"id": rec.effect_id},
        )
    assert ledger.get_effect(rec.effect_id).status is EffectStatus.DISPATCHED

    moved = ledger.transition(
        rec.effect_id, EffectStatus.UNKNOWN, owner=OWNER, next_action=NEXT_ACTION, actor="w1"
    )
    assert (moved.status, moved.owner, moved.next_action) == (
        EffectStatus.UNKNOWN,
        OWNER,
        NEXT_ACTION,
    )
    # Re-labelled with a new owner: still needs both, and keeps them.
    relabelled = ledger.transition(
        rec.effect_id, EffectStatus.UNKNOWN, owner="finance", next_action="call the bank"
    )
    assert (relabelled.owner, relabelled.next_action) == ("finance", "call the bank")


# ------------------------------------------------------------------- idempotency


def test_duplicate_idempotency_key_across_effects_raises(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    first, created = ledger.plan(
        thread_id=thread,
        run_id=run.run_id,
        tool_call_id="c1",
        tool="refund",
        kind=EffectKind.IRREVERSIBLE,
        args={"r": 1},
        idempotency_key="refund-r-4471",
    )
    assert created and first.idempotency_key == "refund-r-4471"
    with pytest.raises(DuplicateIdempotencyKeyError) as info:
        ledger.plan(
            thread_id=thread,
            run_id=run.run_id,
            tool_call_id="c2",
            tool="refund",
            kind=EffectKind.IRREVERSIBLE,
            args={"r": 1},
            idempotency_key="refund-r-4471",
        )
    assert info.value.key == "refund-r-4471"
    assert info.value.existing_effect_id == first.effect_id
    # Unique across threads too.
    other_thread = new_id("t")
    other_run = ledger.start_run(other_thread)
    with pytest.raises(DuplicateIdempotencyKeyError):
        ledger.plan(
            thread_id=other_thread,
            run_id=other_run.run_id,
            tool_call_id="c1",
            tool="refund",
            kind=EffectKind.IRREVERSIBLE,
            args={},
            idempotency_key="refund-r-4471",
        )
    assert ledger.find_effect(thread, "c2") is None
    assert ledger.find_effect(other_thread, "c1") is None
    assert [e.effect_id for e in ledger.effects(thread)] == [first.effect_id]
    found = ledger.effect_by_key("refund-r-4471")
    assert found is not None and found.effect_id == first.effect_id
    # The ledger is still healthy after the refused insert.
    assert ledger.transition(first.effect_id, "dropped").status is EffectStatus.DROPPED


def test_replanning_the_same_tool_call_returns_the_existing_row(ledger: Ledger) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    kwargs = {
        "thread_id": thread,
        "run_id": run.run_id,
        "tool_call_id": "call-7",
        "tool": "send_email",
        "kind": EffectKind.IRREVERSIBLE,
        "args": {"to": "a@b.c"},
    }
    rec, created = ledger.plan(**kwargs)  # type: ignore[arg-type]
    assert created
    assert rec.effect_id == derive_effect_id(thread, "call-7")
    assert rec.idempotency_key == derive_idempotency_key(thread, "call-7")
    approved = ledger.transition(rec.effect_id, EffectStatus.APPROVED)
    again, created_again = ledger.plan(**kwargs)  # type: ignore[arg-type]
    assert created_again is False
    assert again == approved  # the existing row, untouched (status kept)
    assert len(ledger.effects(thread)) == 1
    assert len(ledger.history(rec.effect_id)) == 2  # plan + approve, no second plan row
    # The derived key is stable and distinct per thread and per tool call.
    assert derive_idempotency_key(thread, "call-7") == rec.idempotency_key
    assert derive_idempotency_key(thread, "call-8") != rec.idempotency_key
    assert derive_idempotency_key(new_id("t"), "call-7") != rec.idempotency_key


# ----------------------------------------------------------------------- queries


def test_queries_by_thread_run_status_and_unsettled(ledger: Ledger) -> None:
    t_a, t_b = new_id("a"), new_id("b")
    run_a, run_b = ledger.start_run(t_a), ledger.start_run(t_b)
    made: dict[str, dict[EffectStatus, str]] = {t_a: {}, t_b: {}}
    for thread, run in ((t_a, run_a), (t_b, run_b)):
        for seq, status in enumerate(ALL_STATUSES):
            rec = make_effect(ledger, status, thread_id=thread, run_id=run.run_id, seq=seq)
            made[thread][status] = rec.effect_id

    for thread, run in ((t_a, run_a), (t_b, run_b)):
        expected = [made[thread][s] for s in ALL_STATUSES]  # plan order
        assert [e.effect_id for e in ledger.effects(thread)] == expected
        assert [e.effect_id for e in ledger.run_effects(run.run_id)] == expected
        unsettled = ledger.unsettled(thread)
        assert [e.effect_id for e in unsettled] == [
            made[thread][s] for s in ALL_STATUSES if s in UNSETTLED_STATUSES
        ]
        assert all(not e.settled for e in unsettled)
        assert all(e.thread_id == thread for e in unsettled)

    for status in ALL_STATUSES:
        rows = ledger.effects_by_status(status)
        assert {e.effect_id for e in rows} == {made[t_a][status], made[t_b][status]}, status
        assert all(e.status is status for e in rows)
        assert {e.effect_id for e in ledger.effects_by_status(status.value)} == {
            e.effect_id for e in rows
        }
    assert len(ledger.effects_by_status(EffectStatus.PLANNED, limit=1)) == 1

    # Settling an effect removes it from the unsettled view, and only that one.
    planned_a = made[t_a][EffectStatus.PLANNED]
    ledger.transition(planned_a, EffectStatus.DROPPED)
    assert planned_a not in {e.effect_id for e in ledger.unsettled(t_a)}
    assert planned_a in {e.effect_id for e in ledger.effects(t_a)}
    assert made[t_b][EffectStatus.PLANNED] in {e.effect_id for e in ledger.unsettled(t_b)}
    # Unknown threads and runs simply have nothing.
    assert ledger.effects("nobody") == []
    assert ledger.unsettled("nobody") == []
    assert ledger.run_effects("no-run") == []

    # Point lookups: by tool call and by idempotency key.
    rec = ledger.get_effect(made[t_b][EffectStatus.COMMITTED])
    assert ledger.find_effect(t_b, rec.tool_call_id) == rec
    assert ledger.effect_by_key(rec.idempotency_key) == rec
    assert ledger.effect_by_key("no-such-key") is None
    assert ledger.find_effect(t_b, "no-such-call") is None
    assert rec.args == {"order": "o-88", "amount": 12.5}
    assert rec.kind is EffectKind.IRREVERSIBLE and rec.tool == "refund"


def test_find_moved_matches_the_id_and_tilde_exactly(ledger: Ledger) -> None:
    # "_" and "%" are LIKE wildcards and SQLite's LIKE ignores case: none may match.
    thread = new_id("t")
    run = ledger.start_run(thread)
    for index, call_id in enumerate(
        ["call_0", "call_0~aaa", "call_0~bbb", "CALL_0~ccc", "callX0~ddd", "call_0x~eee", "c%~f"]
    ):
        ledger.plan(thread_id=thread, run_id=run.run_id, tool_call_id=call_id, tool="t",
                    kind="read_only", args={"n": index}, seq=index)  # fmt: skip
    assert [r.tool_call_id for r in ledger.find_moved(thread, "call_0")] == [
        "call_0~aaa",
        "call_0~bbb",
    ]
    assert [r.tool_call_id for r in ledger.find_moved(thread, "c%")] == ["c%~f"]
    assert ledger.find_moved(thread, "c") == [] and ledger.find_moved(new_id("t"), "call_0") == []


def test_arguments_and_results_keep_integers_beyond_64_bits(ledger: Ledger) -> None:
    # Amounts in cents, ids: JSONB keeps any integer, and so must the way back (orjson,
    # tried for parsing JSONB faster, turns 10**30 into a float).
    thread = new_id("t")
    run = ledger.start_run(thread)
    big = {"amount_cents": 10**30, "nested": [{"x": -(2**70)}], "text": "é ✓"}
    (entry,) = ledger.plan_many(
        thread_id=thread,
        run_id=run.run_id,
        items=[NewEffect(tool_call_id="big", tool="t", kind=EffectKind.READ_ONLY, args=big)],
    )
    assert isinstance(entry, tuple)
    rec, _ = entry
    done = ledger.transition(rec.effect_id, EffectStatus.DISPATCHED)
    assert done.args == big
    (moved,) = ledger.transition_many(
        [TransitionRequest(effect_id=rec.effect_id, to=EffectStatus.COMMITTED, result=big)]
    )
    assert isinstance(moved, EffectRecord) and moved.result == big
    assert ledger.get_effect(rec.effect_id).result == big

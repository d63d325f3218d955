"""The ledger's batch writes on every backend: ``plan_many``, ``find_effects`` and
``transition_many``, each checked against what the one-at-a-time calls would do.

``EffectToolNode`` records a batch's side effects with one ``plan_many``, its
read-only outcomes with another, and each call's outcome together with the next
call's intent through ``transition_many``. These tests hold those writes to the
same contract as ``plan`` and ``transition``: audit rows, compare-and-set, the
run guard, key clashes, a retry that recognises its own write.
"""

from __future__ import annotations

import pytest

from langgraph_cancel.errors import (
    DispatchRefusedError,
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    TransitionConflictError,
    UnknownEffectError,
)
from langgraph_cancel.ledger import Ledger, derive_effect_id, derive_idempotency_key
from langgraph_cancel.types import (
    EffectKind,
    EffectRecord,
    EffectStatus,
    NewEffect,
    TransitionRequest,
)
from ledger_util import batch_item, dispatch_request, running_thread

S = EffectStatus


# ------------------------------------------------------------------------ plan_many
def test_plan_many_records_each_call_with_its_audit_row(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    items = [
        batch_item("a", seq=0),
        batch_item("b", seq=1, idempotency_key="refund:o-1"),
        batch_item("c", seq=2, kind="read_only", status=S.COMMITTED, result={"content": "42"}),
        batch_item("d", seq=3, status=S.FAILED, error="bad args", detail={"malformed": True}),
    ]
    out = ledger.plan_many(thread_id=thread, run_id=run, items=items, owner="w1", actor="w1")
    assert all(isinstance(entry, tuple) and entry[1] for entry in out)
    recs = {r.tool_call_id: r for r in ledger.effects(thread)}
    assert [recs[c].status for c in "abcd"] == [S.PLANNED, S.PLANNED, S.COMMITTED, S.FAILED]
    assert recs["a"].idempotency_key == derive_idempotency_key(thread, "a")
    assert recs["b"].idempotency_key == "refund:o-1"
    assert recs["c"].result == {"content": "42"} and recs["c"].settled_at is not None
    assert recs["a"].settled_at is None and recs["a"].owner == "w1"
    assert recs["d"].error == "bad args"
    for call_id in "abcd":
        (first,) = ledger.history(derive_effect_id(thread, call_id))
        assert first.from_status is None and first.to_status is recs[call_id].status
        assert first.actor == "w1"
    assert ledger.history(derive_effect_id(thread, "d"))[0].detail == {"malformed": True}


def test_plan_many_again_returns_the_records_as_they_are(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    items = [batch_item("a"), batch_item("b")]
    ledger.plan_many(thread_id=thread, run_id=run, items=items)
    moved = ledger.transition(derive_effect_id(thread, "a"), S.DISPATCHED, owner="w")
    again = ledger.plan_many(thread_id=thread, run_id=run, items=items)
    assert [(e[0].status, e[1]) for e in again if isinstance(e, tuple)] == [
        (S.DISPATCHED, False),
        (S.PLANNED, False),
    ]
    assert again[0][0] == moved  # type: ignore[index]
    assert len(ledger.history(moved.effect_id)) == 2  # nothing written twice


def test_plan_many_and_find_effects_beyond_one_in_list(ledger: Ledger) -> None:
    # SQLite reads a batch back in IN-lists of 500 ids: a batch of 1,201 calls, 300 of
    # them already recorded, spans three lists; each call is still answered once.
    thread, run = running_thread(ledger)
    ledger.plan_many(thread_id=thread, run_id=run, items=[batch_item(f"c{i}") for i in range(300)])
    items = [batch_item(f"c{i}", seq=i) for i in range(1201)]
    out = ledger.plan_many(thread_id=thread, run_id=run, items=items)
    created = [e[1] for e in out if isinstance(e, tuple)]
    assert created == [False] * 300 + [True] * 901
    call_ids = [i.tool_call_id for i in items]
    assert [e[0].tool_call_id for e in out if isinstance(e, tuple)] == call_ids
    found = ledger.find_effects(thread, [*call_ids, "never"])
    assert len(found) == 1201 and "never" not in found
    assert len(ledger.history(derive_effect_id(thread, "c1200"))) == 1


def test_plan_many_repeated_call_id_is_created_once(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    out = ledger.plan_many(
        thread_id=thread, run_id=run, items=[batch_item("x"), batch_item("x"), batch_item("y")]
    )
    assert [(e[0].tool_call_id, e[1]) for e in out if isinstance(e, tuple)] == [
        ("x", True),
        ("x", False),
        ("y", True),
    ]
    assert len(ledger.effects(thread)) == 2


def test_plan_many_key_clash_costs_only_its_own_slot(ledger: Ledger) -> None:
    other, other_run = running_thread(ledger)
    ledger.plan(
        thread_id=other,
        run_id=other_run,
        tool_call_id="old",
        tool="refund",
        kind=EffectKind.IRREVERSIBLE,
        args={},
        idempotency_key="refund:o-7",
    )
    thread, run = running_thread(ledger)
    items = [
        batch_item("a"),
        batch_item("b", idempotency_key="refund:o-7"),  # held by another thread's effect
        batch_item("c", idempotency_key="refund:o-8"),
        batch_item("d", idempotency_key="refund:o-8"),  # clashes inside the batch
    ]
    out = ledger.plan_many(thread_id=thread, run_id=run, items=items)
    assert isinstance(out[0], tuple) and isinstance(out[2], tuple)
    assert isinstance(out[1], DuplicateIdempotencyKeyError)
    assert out[1].existing_effect_id == derive_effect_id(other, "old")
    assert isinstance(out[3], DuplicateIdempotencyKeyError)
    assert out[3].existing_effect_id == derive_effect_id(thread, "c")
    assert sorted(r.tool_call_id for r in ledger.effects(thread)) == ["a", "c"]


@pytest.mark.parametrize("unsent", [S.DROPPED, S.REJECTED])
def test_a_key_held_by_a_call_that_never_left_goes_to_the_next_call(
    ledger: Ledger, unsent: EffectStatus
) -> None:
    # Dropped before dispatch or rejected at approval: the external system never saw
    # the key, so a later call asking for the same effect gets it (and runs once).
    thread, run = running_thread(ledger)
    (held,) = ledger.plan_many(
        thread_id=thread, run_id=run, items=[batch_item("first", idempotency_key="refund:o-2")]
    )
    assert isinstance(held, tuple)
    first = held[0]
    if unsent is S.REJECTED:
        ledger.transition(first.effect_id, S.PENDING_APPROVAL)
    ledger.transition(first.effect_id, unsent)
    history = ledger.history(first.effect_id)
    later, _run = running_thread(ledger)
    rec, created = ledger.plan(
        thread_id=later,
        run_id=_run,
        tool_call_id="again",
        tool="refund",
        kind=EffectKind.IRREVERSIBLE,
        args={"n": "again"},
        idempotency_key="refund:o-2",
    )
    assert created and rec.idempotency_key == "refund:o-2"
    before = ledger.get_effect(first.effect_id)
    assert before.status is unsent and before.idempotency_key == (
        f"refund:o-2#released-to:{rec.effect_id}"
    )
    assert ledger.history(first.effect_id) == history
    # The batch write takes it the same way.
    ledger.transition(rec.effect_id, S.DROPPED)
    out = ledger.plan_many(
        thread_id=thread,
        run_id=run,
        items=[batch_item("b1"), batch_item("b2", idempotency_key="refund:o-2")],
    )
    assert all(isinstance(e, tuple) for e in out)
    assert ledger.effect_by_key("refund:o-2").tool_call_id == "b2"  # type: ignore[union-attr]


def test_a_key_whose_call_was_not_applied_goes_to_the_next_call(ledger: Ledger) -> None:
    # The external system has no record of the call (a transient fault reconciled,
    # a cancelled call settled): the model asking again gets the key, and the holder
    # is dropped first, so it can never go out again under a key it gave away.
    thread, run = running_thread(ledger)
    ledger.plan_many(
        thread_id=thread, run_id=run, items=[batch_item("first", idempotency_key="k:na")]
    )
    holder = derive_effect_id(thread, "first")
    ledger.transition(holder, S.DISPATCHED, owner="w")
    ledger.transition(holder, S.NOT_APPLIED)
    rec, created = ledger.plan(
        thread_id=thread,
        run_id=run,
        tool_call_id="again",
        tool="refund",
        kind=EffectKind.IRREVERSIBLE,
        args={"n": "again"},
        idempotency_key="k:na",
        actor="worker-2",
    )
    assert created and rec.idempotency_key == "k:na"
    gave = ledger.get_effect(holder)
    assert gave.status is S.DROPPED
    assert gave.idempotency_key == f"k:na#released-to:{rec.effect_id}"
    last = ledger.history(holder)[-1]
    assert (last.from_status, last.to_status, last.actor) == (S.NOT_APPLIED, S.DROPPED, "worker-2")
    assert last.detail == {"key_taken_by": rec.effect_id}
    with pytest.raises(IllegalTransitionError):  # the holder cannot be sent again
        ledger.transition(holder, S.DISPATCHED, owner="w")


@pytest.mark.parametrize("status", [S.PLANNED, S.DISPATCHED, S.COMMITTED])
def test_a_key_that_may_have_left_stays_with_its_holder(
    ledger: Ledger, status: EffectStatus
) -> None:
    thread, run = running_thread(ledger)
    ledger.plan_many(
        thread_id=thread, run_id=run, items=[batch_item("first", idempotency_key="k:1")]
    )
    holder = derive_effect_id(thread, "first")
    path = {
        S.PLANNED: [],
        S.DISPATCHED: [S.DISPATCHED],
        S.COMMITTED: [S.DISPATCHED, S.COMMITTED],
    }[status]
    for step in path:
        ledger.transition(holder, step, owner="w")
    with pytest.raises(DuplicateIdempotencyKeyError):
        ledger.plan(
            thread_id=thread,
            run_id=run,
            tool_call_id="second",
            tool="refund",
            kind=EffectKind.IRREVERSIBLE,
            args={},
            idempotency_key="k:1",
        )
    assert ledger.get_effect(holder).idempotency_key == "k:1"


def test_plan_many_refuses_a_status_no_record_starts_in(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    with pytest.raises(IllegalTransitionError):
        ledger.plan_many(thread_id=thread, run_id=run, items=[batch_item("a", status=S.DISPATCHED)])
    assert ledger.effects(thread) == []
    assert ledger.plan_many(thread_id=thread, run_id=run, items=[]) == []


def test_plan_many_returns_exactly_the_records_the_ledger_holds(ledger: Ledger) -> None:
    # SQLite builds new records from the rows it inserted instead of reading them
    # back: they must equal a fresh read, JSON normalisation and timestamps included.
    thread, run = running_thread(ledger)
    odd = NewEffect(
        tool_call_id="odd",
        tool="refund",
        kind=EffectKind.REVERSIBLE,
        args={"pair": (1, 2), "nested": {"b": 1, "a": [None, 1.5, "é"]}},
        seq=7,
    )
    ledger.plan_many(thread_id=thread, run_id=run, items=[batch_item("old")])
    items = [
        odd,
        batch_item("old"),
        batch_item("r", kind="read_only", status=S.COMMITTED, result={"content": "42"}),
    ]
    out = ledger.plan_many(thread_id=thread, run_id=run, items=items, owner="w1", actor="w1")
    returned = [entry[0] for entry in out if isinstance(entry, tuple)]
    assert [entry[1] for entry in out if isinstance(entry, tuple)] == [True, False, True]
    assert returned == [ledger.get_effect(r.effect_id) for r in returned]
    assert returned[0].args == {"pair": [1, 2], "nested": {"b": 1, "a": [None, 1.5, "é"]}}
    assert returned[2].settled_at == returned[2].created_at == returned[2].updated_at


def test_record_many_writes_what_plan_many_would_without_reading_back(ledger: Ledger) -> None:
    other, other_run = running_thread(ledger)
    ledger.plan_many(
        thread_id=other, run_id=other_run, items=[batch_item("held", idempotency_key="k:held")]
    )
    thread, run = running_thread(ledger)
    ledger.plan_many(thread_id=thread, run_id=run, items=[batch_item("before")])
    moved = ledger.transition(derive_effect_id(thread, "before"), S.DISPATCHED, owner="w")
    items = [
        batch_item("r1", kind="read_only", status=S.COMMITTED, result={"content": "1"}),
        batch_item("r2", kind="read_only", status=S.COMMITTED, idempotency_key="k:held"),
        batch_item("r3", kind="read_only", status=S.FAILED, error="boom", detail={"why": "x"}),
        batch_item("before"),  # recorded before: left as it is
    ]
    out = ledger.record_many(thread_id=thread, run_id=run, items=items, owner="w1", actor="w1")
    assert out[0] is None and out[2] is None and out[3] is None
    assert isinstance(out[1], DuplicateIdempotencyKeyError)
    assert out[1].existing_effect_id == derive_effect_id(other, "held")
    recs = {r.tool_call_id: r for r in ledger.effects(thread)}
    assert sorted(recs) == ["before", "r1", "r3"]
    assert recs["r1"].result == {"content": "1"} and recs["r1"].owner == "w1"
    assert recs["r3"].status is S.FAILED and recs["r3"].error == "boom"
    assert recs["before"] == moved and len(ledger.history(moved.effect_id)) == 2
    (audit,) = ledger.history(derive_effect_id(thread, "r3"))
    assert audit.to_status is S.FAILED and audit.actor == "w1" and audit.detail == {"why": "x"}
    with pytest.raises(IllegalTransitionError):
        ledger.record_many(
            thread_id=thread, run_id=run, items=[batch_item("z", status=S.DISPATCHED)]
        )
    assert ledger.record_many(thread_id=thread, run_id=run, items=[]) == []


def test_find_effects_answers_in_one_read(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    ledger.plan_many(thread_id=thread, run_id=run, items=[batch_item("a"), batch_item("b")])
    other, other_run = running_thread(ledger)
    ledger.plan_many(thread_id=other, run_id=other_run, items=[batch_item("c")])
    found = ledger.find_effects(thread, ["a", "b", "c", "never", "a"])
    assert sorted(found) == ["a", "b"]
    assert found["a"] == ledger.find_effect(thread, "a")
    assert ledger.find_effects(thread, []) == {}


# ------------------------------------------------------------------ transition_many
def _planned(ledger: Ledger, count: int) -> tuple[str, str, list[str]]:
    thread, run = running_thread(ledger)
    items = [batch_item(f"c{i}", seq=i) for i in range(count)]
    ledger.plan_many(thread_id=thread, run_id=run, items=items)
    return thread, run, [derive_effect_id(thread, f"c{i}") for i in range(count)]


def _commit(effect_id: str) -> TransitionRequest:
    return TransitionRequest(
        effect_id=effect_id,
        to=S.COMMITTED,
        expected=frozenset({S.DISPATCHED}),
        actor="w",
        result={"content": "ok"},
    )


def test_outcome_and_next_intent_in_one_call(ledger: Ledger) -> None:
    _thread_id, _run, (first_id, second_id) = _planned(ledger, 2)
    ledger.transition(first_id, S.DISPATCHED, owner="w")
    done, begun = ledger.transition_many([_commit(first_id), dispatch_request(second_id)])
    assert isinstance(done, EffectRecord) and done.status is S.COMMITTED
    assert done.result == {"content": "ok"} and done.settled_at is not None
    assert isinstance(begun, EffectRecord) and begun.status is S.DISPATCHED
    assert begun.dispatched_at is not None and begun.owner == "w"
    assert [(t.from_status, t.to_status) for t in ledger.history(first_id)] == [
        (None, S.PLANNED),
        (S.PLANNED, S.DISPATCHED),
        (S.DISPATCHED, S.COMMITTED),
    ]
    assert [(t.from_status, t.to_status, t.actor) for t in ledger.history(second_id)][-1] == (
        S.PLANNED,
        S.DISPATCHED,
        "w",
    )


def test_each_request_fails_on_its_own(ledger: Ledger) -> None:
    _thread_id, _run, (first_id, second_id, third_id) = _planned(ledger, 3)
    ledger.transition(first_id, S.DISPATCHED, owner="w")
    ledger.transition(second_id, S.DROPPED)  # a cancel got there first
    out = ledger.transition_many(
        [
            _commit(first_id),
            dispatch_request(second_id),
            dispatch_request(third_id),
            dispatch_request("no-such-effect"),
        ]
    )
    assert isinstance(out[0], EffectRecord) and out[0].status is S.COMMITTED
    assert isinstance(out[1], IllegalTransitionError)
    assert not isinstance(out[1], TransitionConflictError)  # dropped can never dispatch
    assert isinstance(out[2], EffectRecord) and out[2].status is S.DISPATCHED
    assert isinstance(out[3], UnknownEffectError)
    assert ledger.get_effect(second_id).status is S.DROPPED


def test_the_run_guard_refuses_the_intent_but_keeps_the_outcome(ledger: Ledger) -> None:
    thread, _run, (first_id, second_id) = _planned(ledger, 2)
    ledger.transition(first_id, S.DISPATCHED, owner="w")
    assert ledger.request_cancel(thread, reason="stop", requested_by="user").accepted
    done, refused = ledger.transition_many([_commit(first_id), dispatch_request(second_id)])
    # What happened outside is recorded whatever the run's state; nothing new leaves.
    assert isinstance(done, EffectRecord) and done.status is S.COMMITTED
    assert isinstance(refused, DispatchRefusedError)
    assert ledger.get_effect(second_id).status is S.PLANNED


def test_a_retry_recognises_its_own_write(ledger: Ledger) -> None:
    # Two tokens, one write each: replaying the same tokens (an attempt whose ack was
    # lost) answers with the records, and applies nothing twice.
    _thread_id, _run, (first_id, second_id) = _planned(ledger, 2)
    ledger.transition(first_id, S.DISPATCHED, owner="w")
    requests = [_commit(first_id), dispatch_request(second_id)]
    checked = [(frozenset({S.DISPATCHED}), False), (frozenset({S.PLANNED}), True)]
    first = ledger._transition_many(requests, checked, ["tok-a", "tok-b"])
    again = ledger._transition_many(requests, checked, ["tok-a", "tok-b"])
    assert [r.status for r in first if isinstance(r, EffectRecord)] == [S.COMMITTED, S.DISPATCHED]
    assert again == first
    assert len(ledger.history(first_id)) == 3 and len(ledger.history(second_id)) == 2


def _every_field(effect_id: str, step: int) -> TransitionRequest:
    """Step ``step`` of a legal path that sets every field a transition can set."""
    return [
        TransitionRequest(
            effect_id=effect_id,
            to=S.PENDING_APPROVAL,
            actor="gate",
            detail={"asked": ["alice"], "why": "refund"},
        ),
        TransitionRequest(
            effect_id=effect_id,
            to=S.APPROVED,
            actor="alice",
            approval={"decision": "edit", "original_args": {"n": "x"}},
            args={"n": "edited", "amount": 5},
        ),
        TransitionRequest(effect_id=effect_id, to=S.DISPATCHED, actor="w", owner="w"),
        TransitionRequest(
            effect_id=effect_id,
            to=S.UNKNOWN,
            actor="w",
            owner="operator",
            next_action="ask the bank",
            error="timed out",
        ),
        TransitionRequest(
            effect_id=effect_id,
            to=S.COMMITTED,
            actor="reconciler",
            result={"content": "refunded", "at": [1, 2.5, None]},
            error=None,
            next_action=None,
        ),
    ][step]


def test_a_batch_records_exactly_what_one_at_a_time_records(ledger: Ledger) -> None:
    # The same requests, batched for half of the effects and one at a time for the
    # other half: every field and audit row must come out the same.
    _thread_id, _run, ids = _planned(ledger, 6)
    batched, single = ids[:3], ids[3:]
    for step in range(5):
        out = ledger.transition_many([_every_field(e, step) for e in batched])
        assert all(isinstance(r, EffectRecord) for r in out), out
        for effect_id in single:
            req = _every_field(effect_id, step)
            fields = {
                f: getattr(req, f)
                for f in ("result", "error", "next_action")
                if getattr(req, f) is not ...
            }
            ledger.transition(
                effect_id,
                req.to,
                actor=req.actor,
                detail=req.detail,
                owner=req.owner,
                approval=req.approval,
                args=req.args,
                **fields,
            )

    def comparable(effect_id: str) -> tuple[object, ...]:
        record = ledger.get_effect(effect_id)
        trail = [
            (t.from_status, t.to_status, t.actor, t.detail)
            for t in ledger.history(record.effect_id)
        ]
        return (
            record.status, record.args, record.result, record.error, record.owner,
            record.next_action, record.approval, record.version,
            record.dispatched_at is not None, record.settled_at is not None, trail,
        )  # fmt: skip

    assert comparable(batched[0])[:7] == (
        S.COMMITTED,
        {"n": "edited", "amount": 5},
        {"content": "refunded", "at": [1, 2.5, None]},
        None,
        "operator",
        None,
        {"decision": "edit", "original_args": {"n": "x"}},
    )
    assert all(comparable(e) == comparable(batched[0]) for e in ids)


def test_two_writers_batching_the_same_effects_in_opposite_orders(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    # Row locks are taken in one order whatever the request order, so two batches
    # over the same effects do not deadlock (a deadlock would show as a logged
    # retry): each effect moves once, and the loser of each compare-and-set is told.
    import logging
    import threading

    caplog.set_level(logging.WARNING, logger="langgraph_cancel")
    _thread_id, _run, ids = _planned(ledger, 40)
    pairs = list(zip(ids[::2], ids[1::2], strict=True))
    barrier = threading.Barrier(2)
    results: dict[str, list[EffectRecord | Exception]] = {"fwd": [], "rev": []}

    def writer(name: str) -> None:
        for first_id, second_id in pairs:
            order = [first_id, second_id] if name == "fwd" else [second_id, first_id]
            barrier.wait()
            try:
                results[name].extend(ledger.transition_many([dispatch_request(e) for e in order]))
            except Exception as exc:  # pragma: no cover - what the test looks for
                results[name].append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    outcomes = results["fwd"] + results["rev"]
    assert len(outcomes) == 2 * len(ids)
    won = [r for r in outcomes if isinstance(r, EffectRecord)]
    assert len(won) == len(ids) and {r.effect_id for r in won} == set(ids)
    lost = [r for r in outcomes if not isinstance(r, EffectRecord)]
    assert all(isinstance(r, TransitionConflictError | IllegalTransitionError) for r in lost)
    assert all(len(ledger.history(e)) == 2 for e in ids)
    assert not [r.getMessage() for r in caplog.records if "Retrying" in r.getMessage()]


def test_transition_many_rejects_what_transition_rejects(ledger: Ledger) -> None:
    _thread_id, _run, (first_id, second_id) = _planned(ledger, 2)
    with pytest.raises(IllegalTransitionError):
        ledger.transition_many([TransitionRequest(effect_id=first_id, to=S.UNKNOWN)])  # no owner
    with pytest.raises(IllegalTransitionError):
        ledger.transition_many(
            [TransitionRequest(effect_id=first_id, to=S.COMMITTED, expected=frozenset({S.PLANNED}))]
        )
    with pytest.raises(ValueError, match="one request per effect"):
        ledger.transition_many([dispatch_request(first_id), dispatch_request(first_id)])
    assert ledger.transition_many([]) == []
    assert (
        ledger.get_effect(first_id).status is S.PLANNED
        and ledger.get_effect(second_id).version == 1
    )


async def test_async_twins(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    out = await ledger.aplan_many(thread_id=thread, run_id=run, items=[batch_item("a")])
    assert isinstance(out[0], tuple) and out[0][1]
    found = await ledger.afind_effects(thread, ["a"])
    (begun,) = await ledger.atransition_many([dispatch_request(found["a"].effect_id)])
    assert isinstance(begun, EffectRecord) and begun.status is S.DISPATCHED
    assert await ledger.arecord_many(thread_id=thread, run_id=run, items=[batch_item("b")]) == [
        None
    ]
    assert (await ledger.afind_effects(thread, ["b"]))["b"].status is S.PLANNED


@pytest.mark.postgres
def test_a_batched_write_probes_the_primary_key_whatever_the_ledger_holds(pg_url: str) -> None:
    # The requests travel as a jsonb row set, which the planner counts as 100 rows: on
    # a ledger of a few thousand rows it scanned lgc_effects twice per write (about
    # 9 ms a side effect at 5,000 rows against 1 ms at 500 or 20,000). The ids also
    # travel as an array, so both probes stay on the primary key at every size.
    import datetime
    import json

    import psycopg
    from psycopg.rows import dict_row

    from langgraph_cancel.ledger import sql as ledger_sql

    ledger = Ledger.from_url(pg_url)
    try:
        thread, run = running_thread(ledger)
        ledger.record_many(
            thread_id=thread,
            run_id=run,
            items=[batch_item(f"r{i}", status=S.COMMITTED, result={"c": i}) for i in range(5000)],
        )
        ledger.plan_many(
            thread_id=thread, run_id=run, items=[batch_item("a"), batch_item("b", seq=1)]
        )
        first_id, second_id = (derive_effect_id(thread, c) for c in ("a", "b"))
        rows = [
            {"n": n, "effect_id": e, "to": "dispatched", "token": f"tok-{n}"}
            | {"allowed": ["planned"], "guard": False, "settles": False, "actor": "t"}
            for n, e in enumerate((first_id, second_id))
        ]
        with psycopg.connect(pg_url, autocommit=True, row_factory=dict_row) as conn:
            conn.execute("ANALYZE lgc_effects")
            plan = conn.execute(
                "EXPLAIN " + ledger_sql.PG_TRANSITION_EFFECTS,
                {
                    "rows": json.dumps(rows),
                    "ids": [first_id, second_id],
                    "now": datetime.datetime.now(datetime.UTC),
                },
            ).fetchall()
        text = "\n".join(r["QUERY PLAN"] for r in plan)
        assert "Seq Scan on lgc_effects" not in text, text
    finally:
        ledger.close()

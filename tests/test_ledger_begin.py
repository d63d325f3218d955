"""``Ledger.plan_many_and_begin`` on every backend: a batch's plan carrying the intents
of the calls to go out first, held to what ``plan_many`` and one ``transition`` each
would write (the records, the audit rows), and to what it must leave alone: a record
from before, a stopped run, a taken key, a retry of its own write.
"""

from __future__ import annotations

import pytest

from langgraph_cancel.errors import DuplicateIdempotencyKeyError
from langgraph_cancel.ledger import Ledger, derive_effect_id, derive_idempotency_key
from langgraph_cancel.ledger.steps import run as run_operation
from langgraph_cancel.types import EffectRecord, EffectStatus
from ledger_util import batch_item, dispatch_request, running_thread

S = EffectStatus


def test_a_plan_with_its_first_intent_records_both_as_the_two_writes_would(
    ledger: Ledger,
) -> None:
    thread, run = running_thread(ledger)
    items = [batch_item("a", seq=0), batch_item("b", seq=1)]
    entries, (begun,) = ledger.plan_many_and_begin(
        thread_id=thread, run_id=run, items=items, begin="a", owner="w", actor="w"
    )
    first_id, second_id = derive_effect_id(thread, "a"), derive_effect_id(thread, "b")
    assert isinstance(begun, EffectRecord) and begun.effect_id == first_id
    assert begun.status is S.DISPATCHED and begun.dispatched_at is not None
    assert begun.owner == "w" and begun.idempotency_key == derive_idempotency_key(thread, "a")
    assert [(e[0].effect_id, e[1]) for e in entries if isinstance(e, tuple)] == [
        (first_id, True),
        (second_id, True),
    ]
    assert entries[0] == (begun, True)
    assert ledger.get_effect(first_id) == begun
    assert ledger.get_effect(second_id).status is S.PLANNED
    history = ledger.history(first_id)
    assert [(t.from_status, t.to_status, t.actor) for t in history] == [
        (None, S.PLANNED, "w"),
        (S.PLANNED, S.DISPATCHED, "w"),
    ]
    assert history[1].detail == {"idempotency_key": begun.idempotency_key}
    assert [(t.from_status, t.to_status) for t in ledger.history(second_id)] == [(None, S.PLANNED)]
    # What the two writes leave, field by field (timestamps and tokens aside).
    other, _ = running_thread(ledger)
    ledger.plan_many(thread_id=other, run_id=_, items=items, owner="w", actor="w")
    two = ledger.transition(derive_effect_id(other, "a"), S.DISPATCHED, actor="w", owner="w")
    varying = {"effect_id", "thread_id", "run_id", "idempotency_key", "last_token"}
    times = {"created_at", "updated_at", "dispatched_at"}
    assert begun.model_dump(exclude=varying | times) == two.model_dump(exclude=varying | times)


def test_a_record_from_before_is_not_begun(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    items = [batch_item("a"), batch_item("b", seq=1)]
    ledger.plan_many(thread_id=thread, run_id=run, items=items[:1])
    entries, begun = ledger.plan_many_and_begin(
        thread_id=thread, run_id=run, items=items, begin="a"
    )
    # The call's record was there (an earlier attempt): its intent goes its own way.
    assert begun == []
    assert [e[1] for e in entries if isinstance(e, tuple)] == [False, True]
    assert ledger.get_effect(derive_effect_id(thread, "a")).status is S.PLANNED
    assert len(ledger.history(derive_effect_id(thread, "a"))) == 1


def test_a_stopped_run_plans_but_does_not_begin(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    assert ledger.request_cancel(thread, reason="stop", requested_by="user").accepted
    entries, begun = ledger.plan_many_and_begin(
        thread_id=thread, run_id=run, items=[batch_item("a")], begin="a"
    )
    assert begun == []
    ((rec, created),) = [e for e in entries if isinstance(e, tuple)]
    assert created and rec.status is S.PLANNED
    assert ledger.get_effect(rec.effect_id).status is S.PLANNED


def test_a_taken_key_plans_the_rest_and_begins_nothing(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    ledger.plan_many(
        thread_id=thread, run_id=run, items=[batch_item("holder", idempotency_key="refund-7")]
    )
    items = [batch_item("a", seq=0), batch_item("b", seq=1, idempotency_key="refund-7")]
    entries, begun = ledger.plan_many_and_begin(
        thread_id=thread, run_id=run, items=items, begin=["a"]
    )
    assert begun == []
    assert isinstance(entries[0], tuple) and entries[0][0].status is S.PLANNED
    assert isinstance(entries[1], DuplicateIdempotencyKeyError)


def test_begin_must_name_a_planned_call_of_the_batch(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    with pytest.raises(ValueError, match="no planned item"):
        ledger.plan_many_and_begin(thread_id=thread, run_id=run, items=[batch_item("a")], begin="z")
    done = batch_item("d", status=S.COMMITTED, result={"content": "ok"})
    with pytest.raises(ValueError, match="no planned item"):
        ledger.plan_many_and_begin(thread_id=thread, run_id=run, items=[done], begin="d")
    with pytest.raises(ValueError, match="no call to begin"):
        ledger.plan_many_and_begin(thread_id=thread, run_id=run, items=[batch_item("a")], begin=[])
    assert ledger.find_effects(thread, ["a", "d"]) == {}


def test_a_plan_begins_several_calls_at_once(ledger: Ledger) -> None:
    # Calls that go out together: each intent is written with the plan, in one write,
    # each with its own audit row; a call not named stays planned.
    thread, run = running_thread(ledger)
    items = [batch_item("a", seq=0), batch_item("b", seq=1), batch_item("c", seq=2)]
    entries, begun = ledger.plan_many_and_begin(
        thread_id=thread, run_id=run, items=items, begin=["b", "a", "b"], owner="w", actor="w"
    )
    assert [rec.tool_call_id for rec in begun] == ["b", "a"]
    assert all(rec.status is S.DISPATCHED and rec.dispatched_at is not None for rec in begun)
    assert [e[0].status for e in entries if isinstance(e, tuple)] == [
        S.DISPATCHED,
        S.DISPATCHED,
        S.PLANNED,
    ]
    for rec in begun:
        assert ledger.get_effect(rec.effect_id) == rec
        history = ledger.history(rec.effect_id)
        assert [(t.from_status, t.to_status) for t in history] == [
            (None, S.PLANNED),
            (S.PLANNED, S.DISPATCHED),
        ]
        assert history[1].detail == {"idempotency_key": rec.idempotency_key}
    assert ledger.get_effect(derive_effect_id(thread, "c")).status is S.PLANNED


def test_a_plan_begins_only_the_calls_it_records(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    items = [batch_item("a", seq=0), batch_item("b", seq=1)]
    ledger.plan_many(thread_id=thread, run_id=run, items=items[1:])
    entries, begun = ledger.plan_many_and_begin(
        thread_id=thread, run_id=run, items=items, begin=["a", "b"]
    )
    # "b" was planned before (an earlier attempt): only "a" begins here.
    assert [rec.tool_call_id for rec in begun] == ["a"]
    assert [e[1] for e in entries if isinstance(e, tuple)] == [True, False]
    assert ledger.get_effect(derive_effect_id(thread, "b")).status is S.PLANNED


@pytest.mark.postgres
def test_a_retried_plan_finds_its_own_intent(pg_url: str) -> None:
    # The statement committed but its answer was lost: the retry (same token) finds
    # the call dispatched by its own write, and nothing is written twice.
    ledger = Ledger.from_url(pg_url)
    try:
        thread, run = running_thread(ledger)
        backend = ledger.backend
        unique = {"a": batch_item("a"), "b": batch_item("b", seq=1)}
        intents = [dispatch_request(derive_effect_id(thread, call)) for call in ("a", "b")]

        def attempt() -> tuple[dict[str, tuple[EffectRecord, bool]], list[EffectRecord]]:
            operation = backend.insert_effects_beginning(
                thread, run, unique, owner="w", actor="w", intents=intents[:1], token="tok-1"
            )
            return run_operation(backend, operation)

        first_found, first_begun = attempt()
        again_found, again_begun = attempt()
        assert len(first_begun) == 1 and again_begun == first_begun
        assert again_found["a"] == (first_begun[0], True)
        assert again_found["b"] == (first_found["b"][0], False)
        assert len(ledger.history(intents[0].effect_id)) == 2
        # A retry of a write that began both calls finds both its own.
        other, other_run = running_thread(ledger)
        both = [
            dispatch_request(derive_effect_id(other, "a")),
            dispatch_request(derive_effect_id(other, "b")),
        ]
        results = [
            run_operation(
                backend,
                backend.insert_effects_beginning(
                    other, other_run, unique, owner="w", actor="w", intents=both, token="tok-2"
                ),
            )
            for _ in range(2)
        ]
        assert [rec.tool_call_id for rec in results[1][1]] == ["a", "b"]
        assert results[1][1] == results[0][1]
        assert all(created for _rec, created in results[1][0].values())
    finally:
        ledger.close()


async def test_the_async_twin_plans_and_begins(ledger: Ledger) -> None:
    thread, run = running_thread(ledger)
    entries, (begun,) = await ledger.aplan_many_and_begin(
        thread_id=thread, run_id=run, items=[batch_item("a")], begin="a"
    )
    assert begun.status is S.DISPATCHED
    assert entries == [(begun, True)]
    assert ledger.get_effect(begun.effect_id) == begun

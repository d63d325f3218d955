"""The six numbers of cancellation: pure functions over records, and the ledger query.

The numbers of real cancelled runs of real graphs, through ``langgraph-cancel
stats`` and the OpenTelemetry export, are checked in ``test_stats.py``.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from langgraph_cancel.cli.parser import since as parse_since
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.queries import RunTree, cancelled_trees
from langgraph_cancel.metrics import (
    aggregate,
    cancellation_stats,
    distribution,
    percentile,
    read_stats,
    run_metrics,
    stopped_roots,
)
from langgraph_cancel.types import (
    EffectKind,
    EffectRecord,
    EffectStatus,
    RunRecord,
    RunStatus,
    TransitionRecord,
    utcnow,
)
from ledger_util import make_effect, new_id

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(ms: float) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def run_record(run_id: str = "r1", **fields: Any) -> RunRecord:
    values: dict[str, Any] = {
        "run_id": run_id,
        "thread_id": f"t-{run_id}",
        "status": RunStatus.CANCELLED,
        "created_at": at(-1000),
        "updated_at": at(500),
        "requested_at": at(0),
        "observed_at": at(10),
        "quiesced_at": at(400),
    }
    values.update(fields)
    return RunRecord(**values)


def effect_record(
    effect_id: str,
    tool: str,
    status: EffectStatus,
    kind: EffectKind = EffectKind.IRREVERSIBLE,
    run_id: str = "r1",
) -> EffectRecord:
    return EffectRecord(
        effect_id=effect_id,
        thread_id=f"t-{run_id}",
        run_id=run_id,
        tool_call_id=f"call-{effect_id}",
        tool=tool,
        kind=kind,
        status=status,
        idempotency_key=f"key-{effect_id}",
        created_at=at(-900),
        updated_at=at(300),
    )


def step(
    effect_id: str, source: EffectStatus | None, to: EffectStatus, ms: float
) -> TransitionRecord:
    return TransitionRecord(
        effect_id=effect_id, from_status=source, to_status=to, at=at(ms), actor="test"
    )


E = EffectStatus


# ------------------------------------------------------------------ percentiles
def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 11)]
    assert percentile(values, 50) == 5.0
    assert percentile(values, 90) == 9.0
    assert percentile(values, 99) == 10.0
    assert percentile([7.0], 50) == 7.0
    spread = distribution([30.0, 10.0, 20.0])
    assert (spread.count, spread.total, spread.p50, spread.p90, spread.max) == (
        3,
        60.0,
        20.0,
        30.0,
        30.0,
    )
    assert distribution([]).count == 0 and distribution([]).p50 is None


@pytest.mark.parametrize("pct", [0, -1, 100.5])
def test_a_percentile_outside_its_range_is_refused(pct: float) -> None:
    with pytest.raises(ValueError, match="percentile"):
        percentile([1.0], pct)
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


# ------------------------------------------------------------------ one run
def test_dispatches_count_from_the_request_to_quiescence_only() -> None:
    tree = RunTree(
        run_record(),
        effects=[effect_record("a", "refund", E.COMMITTED), effect_record("b", "email", E.FAILED)],
        transitions=[
            step("a", E.PLANNED, E.DISPATCHED, -5),  # before the request: not counted
            step("a", E.DISPATCHED, E.COMMITTED, 50),
            step("b", E.PLANNED, E.DISPATCHED, 0),  # at the request: counted
            step("b", E.DISPATCHED, E.DISPATCHED, 200),  # a retry in the window: counted
            step("b", E.DISPATCHED, E.FAILED, 450),
        ],
    )
    numbers = run_metrics(tree)
    assert numbers.quiescence_ms == 400.0
    assert numbers.dispatched_in_window == {"email": 2}
    assert numbers.permanent == {"refund": 1}


def test_a_run_not_quiesced_counts_dispatches_until_now() -> None:
    tree = RunTree(
        run_record(status=RunStatus.CANCELLING, quiesced_at=None, report=None),
        effects=[effect_record("a", "refund", E.DISPATCHED)],
        transitions=[step("a", E.PLANNED, E.DISPATCHED, 900)],
    )
    assert run_metrics(tree, now=at(1000)).dispatched_in_window == {"refund": 1}
    assert run_metrics(tree, now=at(800)).dispatched_in_window == {}
    numbers = run_metrics(tree, now=at(1000))
    assert numbers.quiescence_ms is None
    # No report yet: the unknown bucket as the ledger stands (in flight counts).
    assert numbers.unknown == {"refund": 1}


def test_unknown_is_what_the_stop_left_and_permanent_is_what_stands_now() -> None:
    # The stop reported the refund unknown; it settled committed later.
    report = {"unknown": [{"tool": "refund"}], "permanent": [], "orphans": 0}
    tree = RunTree(
        run_record(report=report),
        effects=[effect_record("a", "refund", E.COMMITTED)],
        transitions=[
            step("a", E.PLANNED, E.DISPATCHED, -50),
            step("a", E.DISPATCHED, E.UNKNOWN, 390),
            step("a", E.UNKNOWN, E.COMMITTED, 5000),
        ],
    )
    numbers = run_metrics(tree)
    assert numbers.unknown == {"refund": 1}
    assert numbers.permanent == {"refund": 1}


def test_irreversible_calls_before_other_work_of_their_run_are_counted() -> None:
    def sent(effect: EffectRecord, ms: float) -> EffectRecord:
        return effect.model_copy(update={"dispatched_at": at(ms)})

    tree = RunTree(
        run_record(),
        effects=[
            # The parent refunds before it updates an order: not irreversible-last.
            sent(effect_record("refund", "refund", E.COMMITTED), -800),
            sent(effect_record("order", "update", E.COMMITTED, EffectKind.REVERSIBLE), -700),
            # Its sub-agent emails after its own last reversible call: in order.
            sent(effect_record("draft", "draft", E.COMMITTED, EffectKind.REVERSIBLE, "c1"), -600),
            sent(effect_record("email", "email", E.COMMITTED, run_id="c1"), -500),
        ],
        transitions=[],
    )
    numbers = run_metrics(tree)
    assert numbers.irreversible_first == {"refund": 1}
    stats = aggregate([numbers], since=at(-2000), until=at(1000))
    assert stats.irreversible_first == 1
    assert stats.tools["refund"].irreversible_first == 1
    assert stats.tools["email"].irreversible_first == 0


def test_compensations_count_each_attempt_by_outcome() -> None:
    tree = RunTree(
        run_record(),
        effects=[
            effect_record("a", "hold", E.COMPENSATED, EffectKind.REVERSIBLE),
            effect_record("b", "hold", E.COMPENSATED, EffectKind.REVERSIBLE),
            effect_record("c", "book", E.COMPENSATION_FAILED, EffectKind.REVERSIBLE),
        ],
        transitions=[
            step("a", E.COMMITTED, E.COMPENSATING, 100),
            step("a", E.COMPENSATING, E.COMPENSATED, 110),
            # b failed once, then its retry succeeded: two attempts.
            step("b", E.COMMITTED, E.COMPENSATING, 120),
            step("b", E.COMPENSATING, E.COMPENSATION_FAILED, 130),
            step("b", E.COMPENSATION_FAILED, E.COMPENSATING, 140),
            step("b", E.COMPENSATING, E.COMPENSATED, 150),
            step("c", E.COMMITTED, E.COMPENSATING, 160),
            step("c", E.COMPENSATING, E.COMPENSATION_FAILED, 170),
        ],
    )
    numbers = run_metrics(tree)
    assert numbers.compensations_succeeded == {"hold": 2}
    assert numbers.compensations_failed == {"book": 1, "hold": 1}
    stats = aggregate([numbers], since=T0, until=at(1000))
    assert stats.compensation_success_rate == 0.5
    assert stats.tools["hold"].compensation_success_rate == pytest.approx(2 / 3, abs=1e-4)
    assert stats.tools["book"].compensation_success_rate == 0.0


def test_orphans_without_a_report_are_children_that_never_saw_the_signal() -> None:
    parent = run_record(status=RunStatus.CANCELLING, quiesced_at=None, report=None)
    children = [
        run_record("c1", status=RunStatus.RUNNING, parent_run_id="r1", observed_at=None),
        run_record("c2", status=RunStatus.CANCELLING, parent_run_id="r1"),
        run_record("c3", status=RunStatus.CANCELLED, parent_run_id="r1", observed_at=None),
    ]
    assert run_metrics(RunTree(parent, runs=children), now=at(10)).orphans == 1
    stored = run_record(report={"orphans": 2})
    assert run_metrics(RunTree(stored)).orphans == 2


def test_a_run_never_asked_to_stop_has_no_numbers() -> None:
    with pytest.raises(ValueError, match="never asked to stop"):
        run_metrics(RunTree(run_record(requested_at=None)))


def test_a_sub_agent_stopped_with_its_parent_is_counted_once() -> None:
    child = run_record("c1", parent_run_id="r1", requested_at=at(5))
    child_call = effect_record("x", "post", E.COMMITTED, run_id="c1")
    parent_tree = RunTree(run_record(), runs=[child], effects=[child_call])
    child_tree = RunTree(child, effects=[child_call])
    assert stopped_roots([parent_tree, child_tree]) == [parent_tree]
    stats = cancellation_stats([parent_tree, child_tree], since=T0, now=at(1000))
    assert stats.cancellations == 1 and stats.permanent == 1
    assert stats.tools["post"].permanent == 1


def test_aggregate_gives_totals_distributions_and_tools() -> None:
    runs = [
        run_metrics(
            RunTree(
                run_record(f"r{i}", quiesced_at=at(100 * i), tokens_after_cancel=i),
                effects=[effect_record(f"e{i}", "refund", E.COMMITTED, run_id=f"r{i}")],
            )
        )
        for i in range(1, 5)
    ]
    stats = aggregate(runs, since=T0, until=at(1000))
    assert stats.cancellations == 4 and stats.quiesced == 4
    assert stats.quiescence_ms.p50 == 200.0 and stats.quiescence_ms.max == 400.0
    assert stats.permanent == 4 and stats.permanent_per_cancellation.max == 1.0
    assert stats.tokens_after_signal == 10 and stats.tokens_after_signal_per_run.p90 == 4.0
    assert stats.compensation_success_rate is None
    assert list(stats.tools) == ["refund"] and stats.tools["refund"].permanent == 4


# ------------------------------------------------------------------ --since
def test_since_reads_durations_and_iso_times() -> None:
    # A second either way: the wall clock may step between two readings.
    slack = timedelta(seconds=1)
    for text, span in (("24h", timedelta(hours=24)), ("90s", timedelta(seconds=90))):
        assert abs(utcnow() - parse_since(text) - span) < slack
    assert abs(utcnow() - parse_since("2w") - timedelta(days=14)) < slack
    assert abs(utcnow() - parse_since("1.5 d") - timedelta(hours=36)) < slack
    assert parse_since("2026-01-31") == datetime(2026, 1, 31, tzinfo=UTC)
    zoned = parse_since("2026-01-31T09:00:00+01:00")
    assert zoned == datetime(2026, 1, 31, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize("text", ["", "yesterday", "24", "5y", "2026-13-01", "1e999h"])
def test_since_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_since(text)


# ------------------------------------------------------------------ the query
def test_the_query_reads_each_stopped_tree_in_the_window(ledger: Ledger) -> None:
    """Every backend: a parent, its child and grandchild; an earlier stop; a live run."""
    old_thread, thread, child_thread, grand_thread = (new_id("t") for _ in range(4))
    old = ledger.start_run(old_thread)
    make_effect(ledger, E.COMMITTED, thread_id=old_thread, run_id=old.run_id, tool="old")
    ledger.request_cancel(old_thread, reason="earlier", requested_by="t")
    window = utcnow()
    live = ledger.start_run(new_id("t"))
    make_effect(ledger, E.COMMITTED, thread_id=live.thread_id, run_id=live.run_id, tool="live")

    parent = ledger.start_run(thread)
    child = ledger.start_run(child_thread, parent_run_id=parent.run_id)
    grand = ledger.start_run(grand_thread, parent_run_id=child.run_id)
    refund = make_effect(ledger, E.COMMITTED, thread_id=thread, run_id=parent.run_id, tool="a")
    post = make_effect(ledger, E.UNKNOWN, thread_id=child_thread, run_id=child.run_id, tool="b")
    hold = make_effect(
        ledger,
        E.COMPENSATED,
        thread_id=grand_thread,
        run_id=grand.run_id,
        tool="c",
        kind=EffectKind.REVERSIBLE,
    )
    ledger.request_cancel(thread, reason="stop", requested_by="t")  # cascades to both

    trees = cancelled_trees(ledger, window)
    by_run = {tree.run.run_id: tree for tree in trees}
    assert set(by_run) == {parent.run_id, child.run_id, grand.run_id}
    top = by_run[parent.run_id]
    assert {r.run_id for r in top.runs} == {child.run_id, grand.run_id}
    assert [e.effect_id for e in top.effects] == [refund.effect_id, post.effect_id, hold.effect_id]
    assert [(t.effect_id, t.to_status) for t in top.transitions] == [
        (record.effect_id, status)
        for record in (refund, post, hold)
        for status in (t.to_status for t in ledger.history(record.effect_id))
    ]
    assert {e.effect_id for e in by_run[child.run_id].effects} == {post.effect_id, hold.effect_id}
    assert stopped_roots(trees) == [top]

    stats = read_stats(ledger, since=window)
    assert stats.cancellations == 1
    assert stats.permanent == 1 and stats.tools["a"].permanent == 1
    assert stats.unknown == 1 and stats.tools["b"].unknown == 1  # no report yet: as it stands
    assert stats.compensations_succeeded == 1 and stats.compensation_success_rate == 1.0
    assert read_stats(ledger, since=utcnow()).cancellations == 0
    assert read_stats(ledger, since=window - timedelta(days=1)).cancellations == 2

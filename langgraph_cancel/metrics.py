"""The seed's six numbers of cancellation, computed from ledger records alone.

For every run a stop was requested for (with its sub-agents' runs under it):

1. **Quiescence**: milliseconds from the request to the run's quiescence (no
   call in flight any more), and the calls **dispatched in that window**
   (from the request until quiescence, or until now while the run has not
   quiesced).
2. **Unknown outcomes** per cancellation: calls whose outcome nobody could
   tell when the run stopped (the ``unknown`` bucket of the report written
   then: a call settled later still counts, since the stop left it unknown).
3. **Orphans**: child runs that never saw the signal (as that report says).
4. **Permanent effects** per cancelled run: irreversible calls that committed,
   a child run's included (the ``permanent`` bucket as the ledger stands now:
   an unknown call that later settled as committed counts).
5. **Compensation success rate**: undos that succeeded over undos tried
   (each ``compensating`` step that ended ``compensated`` or
   ``compensation_failed``).
6. **Tokens after the signal**: model tokens spent after the run saw the stop.

A run still stopping (no report yet) is counted as its ledger stands.
Everything here is a pure function of records
(:class:`~langgraph_cancel.ledger.queries.RunTree`), so ``langgraph-cancel
stats`` and the OpenTelemetry export (:mod:`langgraph_cancel.telemetry`) count
the same things the same way.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from langgraph_cancel.ordering import irreversible_first
from langgraph_cancel.report import bucket_of
from langgraph_cancel.types import (
    TERMINAL_RUN_STATUSES,
    EffectRecord,
    EffectStatus,
    RunRecord,
    RunStatusLiteral,
    utcnow,
)

if TYPE_CHECKING:
    from langgraph_cancel.ledger import Ledger
    from langgraph_cancel.ledger.queries import RunTree


class Distribution(BaseModel):
    """Percentiles of a set of values (nearest rank), ``None`` when there is none.

    Attributes:
        count: How many values.
        total: Their sum.
        p50: The median.
        p90: The 90th percentile.
        p99: The 99th percentile.
        max: The largest.
    """

    model_config = ConfigDict(frozen=True)

    count: int = 0
    total: float = 0.0
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None


def percentile(ordered: Sequence[float], pct: float) -> float:
    """The nearest-rank percentile of sorted values.

    Args:
        ordered: The values, sorted ascending (at least one).
        pct: The percentile, 0 < pct <= 100.

    Raises:
        ValueError: No values, or a percentile outside (0, 100].
    """
    if not ordered:
        raise ValueError("a percentile of no values")
    if not 0 < pct <= 100:
        raise ValueError(f"a percentile is in (0, 100], got {pct}")
    rank = math.ceil(pct / 100.0 * len(ordered))
    return ordered[rank - 1]


def distribution(values: Iterable[float]) -> Distribution:
    """The count, sum, p50/p90/p99 and max of ``values``."""
    ordered = sorted(values)
    if not ordered:
        return Distribution()
    return Distribution(
        count=len(ordered),
        total=round(math.fsum(ordered), 3),
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
        max=ordered[-1],
    )


class RunMetrics(BaseModel):
    """The six numbers of one stopped run (its sub-agents' calls included).

    Attributes:
        run_id: The run.
        thread_id: Its thread.
        status: Its status when read.
        requested_at: When the stop was requested.
        quiescence_ms: Request to quiescence, ``None`` while it has not quiesced.
        dispatched_in_window: Dispatches from the request until quiescence, per tool.
        unknown: Calls left with an unknown outcome, per tool.
        orphans: Child runs that never saw the signal.
        permanent: Irreversible calls that committed, per tool.
        irreversible_first: Irreversible calls that went out before read-only or
            reversible work of the same run, per tool (see ``langgraph_cancel.ordering``).
        compensations_succeeded: Undos that succeeded, per tool.
        compensations_failed: Undos that failed, per tool.
        tokens_after_signal: Model tokens spent after the stop was seen.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    thread_id: str
    status: RunStatusLiteral
    requested_at: datetime
    quiescence_ms: float | None = None
    dispatched_in_window: dict[str, int] = Field(default_factory=dict)
    unknown: dict[str, int] = Field(default_factory=dict)
    orphans: int = 0
    permanent: dict[str, int] = Field(default_factory=dict)
    irreversible_first: dict[str, int] = Field(default_factory=dict)
    compensations_succeeded: dict[str, int] = Field(default_factory=dict)
    compensations_failed: dict[str, int] = Field(default_factory=dict)
    tokens_after_signal: int = 0


def _ms(start: datetime, end: datetime) -> float:
    return round(max((end - start).total_seconds(), 0.0) * 1000.0, 3)


def _report_tools(report: dict[str, Any], bucket: str) -> Counter[str]:
    return Counter(str(entry.get("tool")) for entry in report.get(bucket) or [])


def run_metrics(tree: RunTree, *, now: datetime | None = None) -> RunMetrics:
    """The six numbers of one stopped run, from its records.

    Args:
        tree: The run, its child runs, their calls and the calls' audit trail.
        now: The end of the dispatch window of a run that has not quiesced
            (default: the current time).

    Raises:
        ValueError: The run has no stop request.
    """
    run = tree.run
    if run.requested_at is None:
        raise ValueError(f"run {run.run_id!r} was never asked to stop")
    window_end = run.quiesced_at or now or utcnow()
    tool_of = {effect.effect_id: effect.tool for effect in tree.effects}
    dispatched: Counter[str] = Counter()
    succeeded: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for step in tree.transitions:
        tool = tool_of.get(step.effect_id, "?")
        if step.to_status is EffectStatus.DISPATCHED and run.requested_at <= step.at <= window_end:
            dispatched[tool] += 1
        if step.from_status is EffectStatus.COMPENSATING:
            if step.to_status is EffectStatus.COMPENSATED:
                succeeded[tool] += 1
            elif step.to_status is EffectStatus.COMPENSATION_FAILED:
                failed[tool] += 1
    buckets = [(bucket_of(effect), effect.tool) for effect in tree.effects]
    permanent = Counter(tool for bucket, tool in buckets if bucket == "permanent")
    by_run: dict[str, list[EffectRecord]] = {}
    for effect in tree.effects:
        by_run.setdefault(effect.run_id, []).append(effect)
    early = Counter(e.tool for calls in by_run.values() for e in irreversible_first(calls))
    if run.report is not None:
        unknown = _report_tools(run.report, "unknown")
        orphans = int(run.report.get("orphans") or 0)
    else:
        unknown = Counter(tool for bucket, tool in buckets if bucket == "unknown")
        orphans = _orphans(run, tree.runs)
    return RunMetrics(
        run_id=run.run_id,
        thread_id=run.thread_id,
        status=run.status.value,
        requested_at=run.requested_at,
        quiescence_ms=None if run.quiesced_at is None else _ms(run.requested_at, run.quiesced_at),
        dispatched_in_window=dict(sorted(dispatched.items())),
        unknown=dict(sorted(unknown.items())),
        orphans=orphans,
        permanent=dict(sorted(permanent.items())),
        irreversible_first=dict(sorted(early.items())),
        compensations_succeeded=dict(sorted(succeeded.items())),
        compensations_failed=dict(sorted(failed.items())),
        tokens_after_signal=run.tokens_after_cancel or 0,
    )


def _orphans(run: RunRecord, below: Sequence[RunRecord]) -> int:
    return sum(
        1
        for child in below
        if child.parent_run_id == run.run_id
        and child.status not in TERMINAL_RUN_STATUSES
        and child.observed_at is None
    )


def stopped_roots(trees: Sequence[RunTree]) -> list[RunTree]:
    """The trees whose run is not under another stopped run of ``trees``.

    A sub-agent's run stopped with its parent is counted in the parent's tree
    (the parent's report holds its calls); keeping roots only counts each call
    once.
    """
    below = {child.run_id for tree in trees for child in tree.runs}
    return [tree for tree in trees if tree.run.run_id not in below]


class ToolStats(BaseModel):
    """The per-call numbers of one tool across the stopped runs.

    Attributes:
        dispatched_in_window: Its calls dispatched between a request and quiescence.
        unknown: Its calls left unknown.
        permanent: Its irreversible calls committed.
        irreversible_first: Its irreversible calls that went out before other work.
        compensations_succeeded: Its undos that succeeded.
        compensations_failed: Its undos that failed.
        compensation_success_rate: Succeeded over tried; ``None`` when none was tried.
    """

    model_config = ConfigDict(frozen=True)

    dispatched_in_window: int = 0
    unknown: int = 0
    permanent: int = 0
    irreversible_first: int = 0
    compensations_succeeded: int = 0
    compensations_failed: int = 0
    compensation_success_rate: float | None = None


class CancellationStats(BaseModel):
    """The six numbers across every run stopped in a window. JSON via ``model_dump_json``.

    Attributes:
        since: The window's start.
        until: When the numbers were computed.
        cancellations: Stops counted (a sub-agent stopped with its parent is in its
            parent's).
        quiesced: Of those, the runs that quiesced.
        quiescence_ms: Request to quiescence, over the runs that quiesced.
        dispatched_in_window: Calls dispatched between a request and quiescence (total).
        dispatched_in_window_per_run: Their distribution per stop.
        unknown: Calls left unknown (total).
        unknown_per_cancellation: Their distribution per stop.
        orphans: Child runs that never saw the signal (total).
        permanent: Irreversible calls committed (total).
        permanent_per_cancellation: Their distribution per stop.
        irreversible_first: Irreversible calls that went out before read-only or
            reversible work of their run (total): the plan was not irreversible-last.
        compensations_succeeded: Undos that succeeded.
        compensations_failed: Undos that failed.
        compensation_success_rate: Succeeded over tried; ``None`` when none was tried.
        tokens_after_signal: Model tokens spent after a stop was seen (total).
        tokens_after_signal_per_run: Their distribution per stop.
        tools: The per-call numbers, per tool.
        runs: Each stop's own numbers, oldest request first.
    """

    model_config = ConfigDict(frozen=True)

    since: datetime
    until: datetime
    cancellations: int = 0
    quiesced: int = 0
    quiescence_ms: Distribution = Field(default_factory=Distribution)
    dispatched_in_window: int = 0
    dispatched_in_window_per_run: Distribution = Field(default_factory=Distribution)
    unknown: int = 0
    unknown_per_cancellation: Distribution = Field(default_factory=Distribution)
    orphans: int = 0
    permanent: int = 0
    permanent_per_cancellation: Distribution = Field(default_factory=Distribution)
    irreversible_first: int = 0
    compensations_succeeded: int = 0
    compensations_failed: int = 0
    compensation_success_rate: float | None = None
    tokens_after_signal: int = 0
    tokens_after_signal_per_run: Distribution = Field(default_factory=Distribution)
    tools: dict[str, ToolStats] = Field(default_factory=dict)
    runs: list[RunMetrics] = Field(default_factory=list)


def success_rate(succeeded: int, failed: int) -> float | None:
    """``succeeded / (succeeded + failed)`` rounded to 4 places, ``None`` when both are 0."""
    tried = succeeded + failed
    return None if tried == 0 else round(succeeded / tried, 4)


def aggregate(runs: Sequence[RunMetrics], *, since: datetime, until: datetime) -> CancellationStats:
    """The six numbers across stopped runs, overall and per tool."""
    per_tool: dict[str, Counter[str]] = {}
    fields = (
        "dispatched_in_window",
        "unknown",
        "permanent",
        "irreversible_first",
        "compensations_succeeded",
        "compensations_failed",
    )
    for metrics in runs:
        for name in fields:
            for tool, count in getattr(metrics, name).items():
                per_tool.setdefault(tool, Counter())[name] += count
    tools = {
        tool: ToolStats(
            **{name: counts[name] for name in fields},
            compensation_success_rate=success_rate(
                counts["compensations_succeeded"], counts["compensations_failed"]
            ),
        )
        for tool, counts in sorted(per_tool.items())
    }

    def total(name: str) -> int:
        return sum(sum(getattr(metrics, name).values()) for metrics in runs)

    succeeded = total("compensations_succeeded")
    failed = total("compensations_failed")
    return CancellationStats(
        since=since,
        until=until,
        cancellations=len(runs),
        quiesced=sum(1 for m in runs if m.quiescence_ms is not None),
        quiescence_ms=distribution(m.quiescence_ms for m in runs if m.quiescence_ms is not None),
        dispatched_in_window=total("dispatched_in_window"),
        dispatched_in_window_per_run=distribution(
            sum(m.dispatched_in_window.values()) for m in runs
        ),
        unknown=total("unknown"),
        unknown_per_cancellation=distribution(sum(m.unknown.values()) for m in runs),
        orphans=sum(m.orphans for m in runs),
        permanent=total("permanent"),
        permanent_per_cancellation=distribution(sum(m.permanent.values()) for m in runs),
        irreversible_first=total("irreversible_first"),
        compensations_succeeded=succeeded,
        compensations_failed=failed,
        compensation_success_rate=success_rate(succeeded, failed),
        tokens_after_signal=sum(m.tokens_after_signal for m in runs),
        tokens_after_signal_per_run=distribution(m.tokens_after_signal for m in runs),
        tools=tools,
        runs=list(runs),
    )


def cancellation_stats(
    trees: Sequence[RunTree], *, since: datetime, now: datetime | None = None
) -> CancellationStats:
    """The six numbers of the stopped runs in ``trees`` (each stop counted once).

    Args:
        trees: What :func:`langgraph_cancel.ledger.queries.cancelled_trees` read.
        since: The window's start (reported back).
        now: When the numbers are taken (default: the current time).
    """
    until = now or utcnow()
    runs = [run_metrics(tree, now=until) for tree in stopped_roots(trees)]
    return aggregate(runs, since=since, until=until)


def read_stats(
    ledger: Ledger, *, since: datetime, now: datetime | None = None
) -> CancellationStats:
    """The six numbers of the runs whose stop was requested at or after ``since``.

    Args:
        ledger: The ledger to read (memory, SQLite or PostgreSQL).
        since: The window's start (an aware datetime).
        now: When the numbers are taken (default: the current time).
    """
    from langgraph_cancel.ledger.queries import cancelled_trees

    until = now or utcnow()
    return cancellation_stats(cancelled_trees(ledger, since), since=since, now=until)


__all__ = [
    "CancellationStats",
    "Distribution",
    "RunMetrics",
    "ToolStats",
    "aggregate",
    "cancellation_stats",
    "distribution",
    "percentile",
    "read_stats",
    "run_metrics",
    "stopped_roots",
    "success_rate",
]

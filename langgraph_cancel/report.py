"""The cancellation report: what is permanent, undone, unknown, and what never ran.

Built from the ledger alone, so any process can produce it after the fact.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from langgraph_cancel.ledger import Ledger
from langgraph_cancel.limits import LIMITS_REQUESTER, LimitNameLiteral, limit_of_reason
from langgraph_cancel.ordering import irreversible_count, irreversible_first
from langgraph_cancel.types import (
    TERMINAL_RUN_STATUSES,
    EffectKind,
    EffectRecord,
    EffectStatus,
    RunRecord,
    RunStatusLiteral,
)


class ReportEffect(BaseModel):
    """One effect as the report shows it."""

    model_config = ConfigDict(frozen=True)

    effect_id: str
    tool: str
    kind: str
    status: str
    idempotency_key: str
    tool_call_id: str
    args: dict[str, Any] = Field(default_factory=dict)
    dispatched_at: str | None = None
    settled_at: str | None = None
    owner: str | None = None
    next_action: str | None = None
    error: str | None = None
    #: The run that made the call, when it is a child run (a sub-agent) of the report's.
    child_run_id: str | None = None
    #: That child run's thread.
    child_thread_id: str | None = None
    #: End of the delay window, for a scheduled or revoked effect.
    release_at: str | None = None


#: The report's buckets, in the order it shows them. Every call of the run (and of
#: its children, recursively) is in exactly one.
BUCKETS: tuple[str, ...] = (
    "permanent",
    "reversible_committed",
    "compensated",
    "compensation_failed",
    "unknown",
    "failed",
    "not_run",
    "rejected",
    "scheduled",
    "revoked",
    "reads",
)


class CancellationReport(BaseModel):
    """What a cancelled (or any) run did, from the ledger alone. JSON via ``model_dump_json``.

    Attributes:
        permanent: Irreversible effects that committed: nothing undoes them.
        reversible_committed: Reversible effects committed and not compensated.
        compensated: Reversible effects undone by their compensating action.
        compensation_failed: Compensations that failed: a person must look.
        unknown: Outcomes nobody can tell yet, each with an owner and next action.
        failed: Calls that failed for sure (no effect), each with its error: a
            provider's refusal, a malformed call, a tool's exception.
        not_run: Calls dropped before dispatch, reads included: they never happened.
        rejected: Calls refused at approval (or answered by the reviewer instead).
        scheduled: Effects inside their delay window, revocable until ``release_at``.
        revoked: Effects undone inside their delay window, before they became
            permanent (withdrawn from the provider, or dropped from the outbox).
        reads: Read-only calls that ran.
        dispatched_after_cancel: Dispatches after the run observed its cancel signal
            (must be 0).
        orphans: Child runs that never observed the signal (must be 0).
        awaiting: While the stop is ``cancelling``: the effect ids of the calls in
            flight it waits for (listed in ``unknown`` until they settle).
        limit: The limit whose breach stopped the run (``Limits``), if one did;
            ``reason`` gives the figure (``limit: tool_calls 12 > 10``).
        tokens_used: Model tokens counted for the run's token budget (0 when it
            has none).
        irreversible_effects: How many irreversible calls of the run went out
            (committed or maybe applied): what a stop could no longer undo.
        irreversible_first: Irreversible effects that went out before read-only
            or reversible work of the same run: the plan was not irreversible-last.
    """

    model_config = ConfigDict(frozen=True)

    thread_id: str
    run_id: str
    status: RunStatusLiteral
    reason: str | None = None
    requested_by: str | None = None
    limit: LimitNameLiteral | None = None
    requested_at: str | None = None
    observed_at: str | None = None
    quiesced_at: str | None = None
    cancel_latency_ms: float | None = None
    quiescence_ms: float | None = None
    permanent: list[ReportEffect] = Field(default_factory=list)
    reversible_committed: list[ReportEffect] = Field(default_factory=list)
    compensated: list[ReportEffect] = Field(default_factory=list)
    compensation_failed: list[ReportEffect] = Field(default_factory=list)
    unknown: list[ReportEffect] = Field(default_factory=list)
    failed: list[ReportEffect] = Field(default_factory=list)
    not_run: list[ReportEffect] = Field(default_factory=list)
    rejected: list[ReportEffect] = Field(default_factory=list)
    scheduled: list[ReportEffect] = Field(default_factory=list)
    revoked: list[ReportEffect] = Field(default_factory=list)
    reads: list[ReportEffect] = Field(default_factory=list)
    dispatched_after_cancel: int = 0
    orphans: int = 0
    tokens_after_cancel: int | None = None
    awaiting: list[str] = Field(default_factory=list)
    tokens_used: int = 0
    irreversible_effects: int = 0
    irreversible_first: list[ReportEffect] = Field(default_factory=list)
    summary: str = ""

    def entries(self) -> list[ReportEffect]:
        """Every call the report accounts for, bucket by bucket."""
        return [entry for bucket in BUCKETS for entry in getattr(self, bucket)]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _ms(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round(max((end - start).total_seconds(), 0.0) * 1000.0, 3)


def _entry(effect: EffectRecord, child: RunRecord | None = None) -> ReportEffect:
    return ReportEffect(
        effect_id=effect.effect_id,
        tool=effect.tool,
        kind=effect.kind.value,
        status=effect.status.value,
        idempotency_key=effect.idempotency_key,
        tool_call_id=effect.tool_call_id,
        args=effect.args,
        dispatched_at=_iso(effect.dispatched_at),
        settled_at=_iso(effect.settled_at),
        owner=effect.owner
        if effect.status in (EffectStatus.UNKNOWN, EffectStatus.DISPATCHED)
        else None,
        next_action=effect.next_action,
        error=effect.error if effect.status is not EffectStatus.COMMITTED else None,
        child_run_id=child.run_id if child is not None else None,
        child_thread_id=child.thread_id if child is not None else None,
        release_at=_iso(effect.release_at),
    )


def bucket_of(effect: EffectRecord) -> str:
    """The report bucket a call is in (see ``BUCKETS``)."""
    status = effect.status
    if effect.kind is EffectKind.READ_ONLY:
        if status is EffectStatus.COMMITTED:
            return "reads"
        if status is EffectStatus.FAILED:
            return "failed"
        if status is EffectStatus.REJECTED:
            return "rejected"
        if status in (EffectStatus.UNKNOWN, EffectStatus.DISPATCHED):
            return "unknown"
        return "not_run"
    if status is EffectStatus.COMMITTED:
        return "permanent" if effect.kind is EffectKind.IRREVERSIBLE else "reversible_committed"
    if status is EffectStatus.SCHEDULED:
        return "scheduled"
    if status is EffectStatus.REVOKED:
        return "revoked"
    if status is EffectStatus.COMPENSATED:
        return "compensated"
    if status in (EffectStatus.COMPENSATION_FAILED, EffectStatus.COMPENSATING):
        return "compensation_failed"
    if status in (EffectStatus.UNKNOWN, EffectStatus.DISPATCHED):
        return "unknown"
    if status is EffectStatus.REJECTED:
        return "rejected"
    if status is EffectStatus.FAILED:
        return "failed"
    return "not_run"  # dropped, or never dispatched: planned, pending, approved, not applied


def _counted(items: list[ReportEffect]) -> str:
    counts = Counter(e.tool for e in items)
    parts = [f"{n} {tool}" for tool, n in counts.items()]
    if len(parts) <= 1:
        return parts[0] if parts else ""
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def summarize(report: CancellationReport) -> str:
    """One line a person can read, e.g. "1 issue_refund and 2 send_email are permanent; ..."."""
    parts: list[str] = []
    if report.permanent:
        verb = "is" if len(report.permanent) == 1 else "are"
        parts.append(f"{_counted(report.permanent)} {verb} permanent")
    else:
        parts.append("nothing permanent happened")
    if report.reversible_committed:
        parts.append(f"{_counted(report.reversible_committed)} committed (reversible)")
    if report.compensated:
        parts.append(f"{_counted(report.compensated)} undone")
    if report.compensation_failed:
        parts.append(f"{_counted(report.compensation_failed)} could not be undone")
    if report.unknown:
        owners = sorted({e.owner or "?" for e in report.unknown})
        parts.append(f"{len(report.unknown)} unknown (owner: {', '.join(owners)})")
    if report.failed:
        parts.append(f"{len(report.failed)} failed (no effect)")
    if report.rejected:
        parts.append(f"{len(report.rejected)} rejected at approval")
    if report.revoked:
        parts.append(f"{_counted(report.revoked)} revoked inside the delay window")
    if report.scheduled:
        parts.append(f"{_counted(report.scheduled)} scheduled (revocable until sent)")
    not_run = len(report.not_run)
    parts.append(f"{not_run} step{'s' if not_run != 1 else ''} not run")
    if report.limit is not None and report.reason:
        parts.insert(0, f"stopped by its {report.reason}")
    return "; ".join(parts)


def _tree_effects(ledger: Ledger, run: RunRecord) -> list[tuple[EffectRecord, RunRecord | None]]:
    """The run's calls, then its children's (recursively), each with its child run."""
    out: list[tuple[EffectRecord, RunRecord | None]] = [
        (e, None) for e in ledger.run_effects(run.run_id)
    ]
    seen = {run.run_id}
    pending = list(ledger.child_runs(run.run_id))
    while pending:
        child = pending.pop(0)
        if child.run_id in seen:
            continue
        seen.add(child.run_id)
        out.extend((e, child) for e in ledger.run_effects(child.run_id))
        pending.extend(ledger.child_runs(child.run_id))
    return out


def _limit_of(run: RunRecord) -> LimitNameLiteral | None:
    """The limit that stopped ``run``, when its stop was a breach (not a person's words)."""
    if run.requested_by != LIMITS_REQUESTER:
        return None
    limit = limit_of_reason(run.reason)
    return None if limit is None else limit.value


def build_report(
    ledger: Ledger, run: RunRecord, *, status: str | None = None
) -> CancellationReport:
    """Assemble the report of ``run`` from the ledger.

    Args:
        ledger: The ledger.
        run: The run (re-read it first if it may have moved).
        status: Report this status instead of the run's (the final transition
            is written together with the report).
    """
    buckets: dict[str, list[ReportEffect]] = {bucket: [] for bucket in BUCKETS}
    after_cancel = 0
    # I1 is "no dispatch after the signal is observed". The request's own stamp is not
    # the reference: it is taken before the request commits, and a dispatch committing
    # in between (the ledger allows it: the run is still running) would look later.
    cutoff = run.observed_at or run.requested_at
    tree = _tree_effects(ledger, run)
    for effect, child in tree:
        if (
            child is None
            and cutoff is not None
            and effect.dispatched_at is not None
            and effect.dispatched_at > cutoff
        ):
            after_cancel += 1
        buckets[bucket_of(effect)].append(_entry(effect, child))
    own = [effect for effect, child in tree if child is None]
    children = ledger.child_runs(run.run_id)
    orphans = sum(
        1 for c in children if c.status not in TERMINAL_RUN_STATUSES and c.observed_at is None
    )
    report = CancellationReport(
        thread_id=run.thread_id,
        run_id=run.run_id,
        status=(status or run.status.value),  # type: ignore[arg-type]
        reason=run.reason,
        requested_by=run.requested_by,
        limit=_limit_of(run),
        requested_at=_iso(run.requested_at),
        observed_at=_iso(run.observed_at),
        quiesced_at=_iso(run.quiesced_at),
        cancel_latency_ms=_ms(run.requested_at, run.observed_at),
        quiescence_ms=_ms(run.requested_at, run.quiesced_at),
        dispatched_after_cancel=after_cancel,
        orphans=orphans,
        tokens_after_cancel=run.tokens_after_cancel,
        tokens_used=run.tokens_used,
        irreversible_effects=irreversible_count(own),
        irreversible_first=[_entry(e) for e in irreversible_first(own)],
        **buckets,  # type: ignore[arg-type]
    )
    return report.model_copy(update={"summary": summarize(report)})


__all__ = [
    "BUCKETS",
    "CancellationReport",
    "ReportEffect",
    "bucket_of",
    "build_report",
    "summarize",
]

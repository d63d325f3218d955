"""The cancellation report for people: each bucket with its calls, then the run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from langgraph_cancel.cli.config import PROG
from langgraph_cancel.cli.render.text import (
    DETAIL,
    NONE,
    call_label,
    line,
    milliseconds,
    pairs,
    short,
    status_text,
    timestamp,
)

if TYPE_CHECKING:
    from langgraph_cancel.report import CancellationReport, ReportEffect

#: The report's buckets: field, heading, style.
CATEGORIES: tuple[tuple[str, str, str], ...] = (
    ("permanent", "Permanent", "bold red"),
    ("reversible_committed", "Reversible, committed", "yellow"),
    ("compensated", "Compensated (undone)", "cyan"),
    ("compensation_failed", "Compensation failed", "bold red"),
    ("unknown", "Unknown outcome", "bold red"),
    ("not_run", "Not run", "green"),
    ("rejected", "Rejected at approval", "magenta"),
    ("revoked", "Revoked inside the delay window", "cyan"),
    ("scheduled", "Scheduled (revocable until sent)", "yellow"),
)


def _report_note(bucket: str, effect: ReportEffect, thread_id: str) -> str:
    if bucket == "permanent":
        return "irreversible: cancelling cannot undo it"
    if bucket == "reversible_committed":
        return f"undo: {PROG} compensate {thread_id}"
    if bucket == "compensated":
        return f"undone at {timestamp(effect.settled_at)}"
    if bucket == "compensation_failed":
        return f"{effect.error or 'the undo failed'}; retry: {PROG} compensate {thread_id}"
    if bucket == "unknown":
        return f"owner: {effect.owner or '?'}; next: {effect.next_action or '?'}"
    if bucket == "not_run":
        return "never dispatched"
    if bucket == "revoked":
        return f"undone before it became permanent (window until {timestamp(effect.release_at)})"
    if bucket == "scheduled":
        return f"revocable until {timestamp(effect.release_at)}"
    return short(effect.error or "refused by the reviewer", 60)


def _bucket_lines(out: Console, report: CancellationReport) -> None:
    """Each bucket of the report: its heading and count, then each call with its note."""
    for bucket, label, style in CATEGORIES:
        items: list[ReportEffect] = list(getattr(report, bucket))
        if not items:
            line(out, (f"{label} (0)", style), (": none", "dim"))
            continue
        line(out, (f"{label} ({len(items)})", style))
        for effect in items:
            line(out, (call_label(effect.tool, effect.args), "bold"), indent=2, hang=4)
            line(out, f"{effect.kind}, key {effect.idempotency_key}", indent=DETAIL)
            if effect.child_run_id is not None:
                line(
                    out,
                    f"by sub-agent run {effect.child_run_id} (thread {effect.child_thread_id})",
                    indent=DETAIL,
                )
            thread = effect.child_thread_id or report.thread_id
            line(out, _report_note(bucket, effect, thread), indent=DETAIL)


def _run_rows(report: CancellationReport) -> list[tuple[str, str | Text]]:
    """The run's ``field  value`` rows: its status, the stop's times, what came late."""
    late = report.dispatched_after_cancel
    rows: list[tuple[str, str | Text]] = [
        ("status", status_text(report.status)),
        ("reason", report.reason or NONE),
        ("requested by", report.requested_by or NONE),
        ("requested at", timestamp(report.requested_at)),
        (
            "observed at",
            f"{timestamp(report.observed_at, short_form=True)} "
            f"(cancel latency {milliseconds(report.cancel_latency_ms)})",
        ),
        (
            "quiesced at",
            f"{timestamp(report.quiesced_at, short_form=True)} "
            f"(quiescence {milliseconds(report.quiescence_ms)})",
        ),
        (
            "dispatched after cancel",
            Text(f"{late}" + (" (must be 0)" if late else ""), style="bold red" if late else ""),
        ),
        ("orphans", str(report.orphans)),
        (
            "tokens after cancel",
            NONE if report.tokens_after_cancel is None else str(report.tokens_after_cancel),
        ),
    ]
    if report.limit is not None:
        rows.insert(2, ("stopped by limit", Text(report.limit, style="bold yellow")))
    if report.tokens_used:
        rows.append(("tokens used", str(report.tokens_used)))
    if report.irreversible_first:
        early = ", ".join(call_label(e.tool, e.args) for e in report.irreversible_first)
        rows.append(
            (
                "irreversible before other work",
                Text(f"{early} (order the plan so irreversible calls come last)", style="yellow"),
            )
        )
    return rows


def render_report(out: Console, report: CancellationReport) -> None:
    """The report for people: each bucket with its calls, then the run and its timings."""
    line(out, (f"Cancellation report: thread {report.thread_id}, run {report.run_id}", "bold"))
    _bucket_lines(out, report)
    out.print()
    line(out, ("Run and timings", "bold"))
    pairs(out, _run_rows(report))
    line(out, ("Summary: ", "bold"), (report.summary, "bold"))


__all__ = ["CATEGORIES", "render_report"]

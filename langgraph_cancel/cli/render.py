"""Everything the command line prints for people, and its JSON for programs.

Output follows the terminal's width and wraps rather than cuts: each record is
a line of its own with its details indented below it, never a table column
squeezed to a few characters. Piped, it is plain text (no colour, no
animation) at ``$COLUMNS`` or 80 columns.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from langgraph_cancel.cli.config import PROG

if TYPE_CHECKING:
    from langgraph_cancel.cli.inspection import ThreadState
    from langgraph_cancel.nodes.reconcile import ThreadReconciliation
    from langgraph_cancel.report import CancellationReport, ReportEffect
    from langgraph_cancel.types import (
        CancelRequestResult,
        EffectRecord,
        LeaseRecord,
        RunRecord,
        TransitionRecord,
    )

#: Width of piped output when ``$COLUMNS`` does not say.
PIPED_WIDTH = 80
#: Indent of a record's details under its first line.
DETAIL = 6
NONE = "—"
#: The narrowest a wrapped paragraph gets, however deep its indent.
MIN_TEXT_WIDTH = 20


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): the terminal's width, or ``$COLUMNS``/80 when piped."""
    stream = sys.stderr if stderr else sys.stdout
    width: int | None = None
    if not stream.isatty():
        width = PIPED_WIDTH
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit() and int(columns) > 0:
            width = int(columns)
    return Console(file=stream, width=width, highlight=False, markup=False, emoji=False)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout."""
    print(json.dumps(data, indent=2, default=str))


def line(
    out: Console, *parts: str | Text | tuple[str, str], indent: int = 0, hang: int | None = None
) -> None:
    """Print ``parts`` as one paragraph, wrapped at the console's width.

    Args:
        out: The console.
        parts: Text, or ``(text, style)`` pairs.
        indent: Spaces before the first line.
        hang: Spaces before each continuation line (default: ``indent``).
    """
    _wrapped(out, Text.assemble(*parts), indent, indent if hang is None else hang)


def pairs(out: Console, rows: Sequence[tuple[str, str | Text]], *, indent: int = 2) -> None:
    """``field  value`` rows, the values aligned and wrapped under themselves."""
    key_width = max(len(field) for field, _value in rows) + 2
    for field, value in rows:
        label = " " * indent + field.ljust(key_width)
        _wrapped(out, Text(value) if isinstance(value, str) else value, 0, len(label), label)


def _wrapped(out: Console, text: Text, indent: int, hang: int, first: str = "") -> None:
    width = max(out.width - max(indent, hang), MIN_TEXT_WIDTH)
    for number, piece in enumerate(text.wrap(out, width)):
        piece.rstrip()
        lead = (first or " " * indent) if number == 0 else " " * hang
        out.print(Text(lead) + piece)


# ------------------------------------------------------------------ formatting
def short(value: Any, limit: int = 48) -> str:
    """``value`` as text, elided to ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_label(tool: str, args: Mapping[str, Any], limit: int = 24) -> str:
    """``tool(k=v, ...)``: long values shortened, free text (over 40 characters) elided."""
    parts = []
    for key, value in args.items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if isinstance(value, str) and len(text) > 40:
            parts.append(f"{key}=…")
        else:
            parts.append(f"{key}={short(text, limit)}")
    return f"{tool}({', '.join(parts)})"


def timestamp(value: datetime | str | None, *, short_form: bool = False) -> str:
    """A local time to the millisecond (the time of day only with ``short_form``)."""
    if value is None:
        return NONE
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
    else:
        moment = value
    pattern = "%H:%M:%S.%f" if short_form else "%Y-%m-%d %H:%M:%S.%f"
    return moment.astimezone().strftime(pattern)[:-3]


def milliseconds(value: float | None) -> str:
    """``1,234 ms``, or a dash."""
    return NONE if value is None else f"{value:,.0f} ms"


_STATUS_STYLE = {
    "committed": "green",
    "completed": "green",
    "compensated": "cyan",
    "compensating": "yellow",
    "compensation_failed": "bold red",
    "dispatched": "yellow",
    "unknown": "bold red",
    "dropped": "dim",
    "rejected": "magenta",
    "failed": "red",
    "not_applied": "dim",
    "pending_approval": "yellow",
    "approved": "yellow",
    "planned": "dim",
    "cancelled": "bold",
    "cancel_requested": "yellow",
    "cancelling": "yellow",
    "running": "cyan",
}


def status_text(status: str) -> Text:
    """A status word in its colour."""
    return Text(status, style=_STATUS_STYLE.get(status, ""))


# ------------------------------------------------------------------ the report
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


def render_report(out: Console, report: CancellationReport) -> None:
    """The report for people: each bucket with its calls, then the run and its timings."""
    line(out, (f"Cancellation report: thread {report.thread_id}, run {report.run_id}", "bold"))
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
    out.print()
    line(out, ("Run and timings", "bold"))
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
    pairs(out, rows)
    line(out, ("Summary: ", "bold"), (report.summary, "bold"))


# ------------------------------------------------------------------ status
def _lease_line(lease: LeaseRecord | None, live: bool, beat_seconds: float | None) -> str:
    if lease is None:
        return "Lease: none (no worker is running this thread)"
    if live:
        alive = "live"
    elif lease.expires_at > datetime.now(UTC):
        alive = "HOLDER GONE (its process on this host no longer runs)"
    else:
        alive = "EXPIRED (its worker stopped heartbeating)"
    return (
        f"Lease: held by {lease.owner} until {timestamp(lease.expires_at)} "
        f"({alive}; last heartbeat {beat_seconds or 0:.0f} s ago)"
    )


def _run_lines(out: Console, run: RunRecord) -> None:
    line(out, (run.run_id, "bold"), "  ", status_text(run.status.value), indent=2)
    line(out, f"started {timestamp(run.created_at)}", indent=DETAIL)
    if run.requested_at is not None:
        who = " / ".join(x for x in (run.requested_by, run.reason) if x) or NONE
        line(
            out,
            f"stop requested {timestamp(run.requested_at, short_form=True)} by {who}",
            indent=DETAIL,
        )
        line(
            out,
            f"observed {timestamp(run.observed_at, short_form=True)}, "
            f"quiesced {timestamp(run.quiesced_at, short_form=True)}",
            indent=DETAIL,
        )


def _verdict(effect: EffectRecord) -> str:
    status = effect.status.value
    if status == "committed":
        return (
            "committed, permanent"
            if effect.kind.value == "irreversible"
            else "committed, reversible"
        )
    if status == "compensated":
        return "committed, then undone"
    if status == "dispatched":
        return "MAY have been committed: in flight, no outcome recorded"
    if status == "unknown":
        return f"MAY have been committed: unknown (owner {effect.owner})"
    return f"committed; undo {status}"


def render_status(
    out: Console, state: ThreadState, steps: Sequence[str], *, lease_live: bool, beat: float | None
) -> None:
    """``status`` for people: the runs, the lease, then the three questions."""
    line(out, (f"Thread {state.thread_id}: runs", "bold"))
    for run in state.runs:
        _run_lines(out, run)
    line(out, _lease_line(state.lease, lease_live, beat))
    if state.checkpoint:
        line(
            out,
            f"Last checkpoint: step {state.checkpoint.get('step')} at "
            f"{timestamp(state.checkpoint.get('ts'))}",
        )
    for value in state.interrupts:
        line(out, ("Waiting for an answer: ", "bold yellow"), short(value, 300))

    out.print()
    line(out, ("1. What was done", "bold"))
    if not state.done:
        line(out, "nothing yet", indent=3)
    for effect in state.done:
        line(
            out,
            status_text(effect.status.value),
            f"  {call_label(effect.tool, effect.args)} ({effect.kind.value})",
            indent=3,
            hang=7,
        )
    if state.not_done:
        line(out, "Not done:", indent=3)
        for effect in state.not_done:
            line(
                out,
                status_text(effect.status.value),
                f"  {call_label(effect.tool, effect.args)}",
                indent=5,
                hang=9,
            )

    out.print()
    line(out, ("2. External side effects committed, or that may have been", "bold"))
    if not state.side_effects:
        line(out, "none: nothing left the process with a side effect", indent=3)
    for effect in state.side_effects:
        line(
            out,
            f"{call_label(effect.tool, effect.args)} key {effect.idempotency_key}: "
            f"{_verdict(effect)}",
            indent=3,
            hang=7,
        )

    out.print()
    line(out, ("3. Next step", "bold"))
    for step in steps:
        line(out, step, indent=3, hang=5)


# ------------------------------------------------------------------ effects
def _effect_note(effect: EffectRecord) -> str:
    if effect.status.value in ("unknown", "dispatched"):
        return f"{effect.owner or '?'}: {effect.next_action or 'in flight'}"
    return short(effect.error or "", 120)


def _transition(record: TransitionRecord) -> str:
    before = record.from_status.value if record.from_status else "(new)"
    detail = f" ({short(record.detail, 90)})" if record.detail else ""
    return (
        f"{timestamp(record.at, short_form=True)}  {before} → {record.to_status.value}"
        f"  by {record.actor}{detail}"
    )


def render_effects(
    out: Console,
    thread_id: str,
    effects: Sequence[EffectRecord],
    history: Mapping[str, Sequence[TransitionRecord]] | None,
) -> None:
    """Each effect on a line, its kind, status, key and times below it (and its trail)."""
    line(out, (f"Effects of thread {thread_id} ({len(effects)})", "bold"))
    if not effects:
        line(out, "(no effects recorded)", indent=2)
    for number, effect in enumerate(effects, 1):
        line(
            out, f"{number:>2}. ", (call_label(effect.tool, effect.args), "bold"), indent=1, hang=8
        )
        line(
            out,
            f"{effect.kind.value}, ",
            status_text(effect.status.value),
            f", key {effect.idempotency_key}",
            indent=DETAIL,
        )
        line(
            out,
            f"dispatched {timestamp(effect.dispatched_at, short_form=True)}, "
            f"settled {timestamp(effect.settled_at, short_form=True)}",
            indent=DETAIL,
        )
        note = _effect_note(effect)
        if note:
            line(out, note, indent=DETAIL)
        if history is not None:
            for record in history.get(effect.effect_id, ()):
                line(out, _transition(record), indent=DETAIL + 2, hang=DETAIL + 4)


# ------------------------------------------------------------------ cancel
def render_cancel(
    out: Console,
    result: CancelRequestResult,
    *,
    worker: str | None,
    thread_id: str,
    db_flag: str,
) -> None:
    """What ``cancel`` did, and what happens next."""
    if not result.accepted:
        line(out, f"{result.message}: no-op.")
        return
    reason = f" (reason: {result.reason or ''})" if result.first else ""
    line(out, f"{result.message}{reason}")
    if worker is not None:
        line(
            out,
            f"Worker {worker} stops at its next check, waits for in-flight calls and writes "
            f"the report: `{PROG} report {thread_id}{db_flag}`.",
        )
    else:
        line(
            out,
            "No worker is running this thread right now; the cancel is finished when the "
            f"thread is resumed: `{PROG} resume {thread_id}{db_flag}`.",
        )


# ------------------------------------------------------------------ recovery
def render_reconciled(out: Console, results: Iterable[ThreadReconciliation]) -> None:
    """What ``reconcile`` (or ``resume``'s first step) settled, skipped or reaped."""
    settled = 0
    busy = False
    for result in results:
        if result.reaped:
            line(out, f"Took over the lease of {result.reaped} on thread {result.thread_id}.")
        if result.busy:
            busy = True
            line(
                out,
                f"Skipped thread {result.thread_id}: worker {result.busy} holds a live lease "
                f"(until {result.busy_until}); its in-flight calls are still awaited.",
            )
        for item in result.effects:
            effect = item.effect
            if not settled:
                line(out, ("Reconciliation", "bold"))
            settled += 1
            line(
                out,
                f"{result.thread_id}: ",
                (call_label(effect.tool, effect.args), "bold"),
                f"  {item.before.value} → ",
                status_text(effect.status.value),
                indent=2,
            )
            note = (
                f"{effect.owner}: {effect.next_action}"
                if effect.status.value == "unknown"
                else (effect.error or "")
            )
            if note:
                line(out, short(note, 200), indent=DETAIL)
    if not settled and not busy:
        line(out, "Nothing to reconcile: no effect is in flight without an outcome or unknown.")


def render_compensated(out: Console, thread_id: str, done: Sequence[EffectRecord]) -> None:
    """What ``compensate`` undid (or failed to)."""
    if not done:
        line(
            out,
            "Nothing to compensate: no committed reversible effect with a known compensating "
            "action.",
        )
        return
    line(out, (f"Compensation of thread {thread_id} (newest first)", "bold"))
    for effect in done:
        line(
            out,
            (call_label(effect.tool, effect.args), "bold"),
            "  ",
            status_text(effect.status.value),
            indent=2,
        )
        if effect.error:
            line(out, effect.error, indent=DETAIL)


def render_resumed(
    out: Console,
    run: RunRecord,
    *,
    interrupts: Sequence[Any],
    report: CancellationReport | None,
    last_message: Any,
    thread_id: str,
    db_flag: str,
) -> None:
    """Where a resumed thread stands: its run, what waits for an answer, its report."""
    line(out, f"Run {run.run_id} is now ", status_text(run.status.value))
    for value in interrupts:
        line(out, ("Waiting for an answer: ", "bold yellow"), short(value, 400))
    if interrupts:
        line(out, f"Answer with `{PROG} resume {thread_id} --resume-value JSON{db_flag}`.")
    if report is not None:
        render_report(out, report)
    elif last_message:
        line(out, ("Last message: ", "bold"), str(last_message))


# ------------------------------------------------------------------ the demo
_MARKS = {"dispatched": "→", "committed": "✓", "dropped": "✗", "unknown": "?", "failed": "✗"}


def progress_line(effect: EffectRecord) -> Text:
    """One call's new status, as the demo's stop button sees it."""
    status = effect.status.value
    note = "  (in flight: the request has left the process)" if status == "dispatched" else ""
    return Text.assemble(
        f"  {_MARKS.get(status, '·')} ",
        (call_label(effect.tool, effect.args), "bold"),
        "  ",
        status_text(status),
        note,
    )


def describe_progress(event: Mapping[str, Any]) -> Text | None:
    """One line for a progress event of a stop (``langgraph_cancel.progress``).

    ``event`` is the chunk's ``"langgraph_cancel"`` value (or a ``ProgressEvent``
    dumped to JSON); None for a kind this version does not know.
    """
    kind = event.get("event")
    effect = event.get("effect") or {}
    label = call_label(str(effect.get("tool", "?")), effect.get("args") or {})
    if kind == "requested":
        who = event.get("requested_by") or "someone"
        reason = event.get("reason") or "no reason given"
        return Text.assemble(("stop requested", "bold red"), f" by {who}: {reason}")
    if kind == "observed":
        return Text.assemble(("stop observed", "bold red"), ": the run is cancelling")
    if kind == "dropped":
        return Text.assemble("  ", (label, "bold"), "  ", status_text("dropped"), "  (never ran)")
    if kind == "waiting":
        since = timestamp(effect.get("dispatched_at"), short_form=True)
        grace = event.get("grace_s")
        within = "until it returns" if grace is None else f"up to {grace:g}s"
        return Text.assemble(
            ("waiting", "bold yellow"),
            " for ",
            (label, "bold"),
            f", in flight since {since}: the request has left the process ({within})",
        )
    if kind == "settled":
        status = str(effect.get("status", "unknown"))
        return Text.assemble("  ", (label, "bold"), "  ", status_text(status), "  (settled)")
    if kind in ("compensated", "compensation_failed"):
        return Text.assemble("  ", (label, "bold"), "  ", status_text(str(kind)))
    if kind == "cancelled":
        return Text.assemble(("run cancelled", "bold red"), ": the report follows")
    return None


def describe_update(chunk: Mapping[str, Any]) -> list[Text]:
    """The demo's lines for one ``stream_mode="updates"`` chunk."""
    lines: list[Text] = []
    for node, update in chunk.items():
        if node == "agent" and isinstance(update, dict):
            for message in update.get("messages", []):
                calls = getattr(message, "tool_calls", None) or []
                if calls:
                    names = ", ".join(call["name"] for call in calls)
                    what = f": plans {len(calls)} call(s): {names}"
                else:
                    what = ": " + short(getattr(message, "content", ""), 120)
                lines.append(Text.assemble(("model", "bold cyan"), what))
        elif node == "cancel":
            lines.append(
                Text.assemble(
                    ("cancel node", "bold red"),
                    ": queue drained, in-flight calls settled, run cancelled",
                )
            )
    return lines


__all__ = [
    "CATEGORIES",
    "PIPED_WIDTH",
    "call_label",
    "console",
    "describe_progress",
    "describe_update",
    "line",
    "milliseconds",
    "pairs",
    "print_json",
    "progress_line",
    "render_cancel",
    "render_compensated",
    "render_effects",
    "render_reconciled",
    "render_report",
    "render_resumed",
    "render_status",
    "short",
    "status_text",
    "timestamp",
]

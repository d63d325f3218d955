"""What ``reconcile``, ``compensate`` and ``resume`` did to a thread."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

from langgraph_cancel.cli.config import PROG
from langgraph_cancel.cli.render.report import render_report
from langgraph_cancel.cli.render.text import DETAIL, call_label, line, short, status_text

if TYPE_CHECKING:
    from langgraph_cancel.nodes.reconcile import ThreadReconciliation
    from langgraph_cancel.report import CancellationReport
    from langgraph_cancel.types import EffectRecord, RunRecord


def render_reconciled(
    out: Console, results: Iterable[ThreadReconciliation], *, kept: bool = True
) -> None:
    """What ``reconcile`` (or ``resume``'s first step) settled, skipped or reaped;
    ``kept``: also the leases kept on stopped threads for their close."""
    settled = 0
    busy = False
    for result in results:
        if result.reaped:
            line(out, f"Took over the lease of {result.reaped} on thread {result.thread_id}.")
        if kept and result.kept_lease:
            line(
                out,
                f"Left the lease on thread {result.thread_id}, expired: its run is "
                f"cancelled and its worker left the thread open; a sweeper given the "
                f"agent closes it, or `{PROG} resume {result.thread_id}` now.",
            )
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


__all__ = ["render_compensated", "render_reconciled", "render_resumed"]

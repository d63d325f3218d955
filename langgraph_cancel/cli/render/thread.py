"""A thread as ``status``, ``effects`` and ``cancel`` show it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.console import Console

from langgraph_cancel.cli.config import PROG
from langgraph_cancel.cli.render.text import (
    DETAIL,
    NONE,
    call_label,
    line,
    short,
    status_text,
    timestamp,
)

if TYPE_CHECKING:
    from langgraph_cancel.cli.thread import StoredThread
    from langgraph_cancel.types import (
        CancelRequestResult,
        EffectRecord,
        LeaseRecord,
        RunRecord,
        TransitionRecord,
    )


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
    out: Console, state: StoredThread, steps: Sequence[str], *, lease_live: bool, beat: float | None
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


__all__ = ["render_cancel", "render_effects", "render_status"]

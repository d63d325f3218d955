"""``status``, ``effects`` and ``report``: what the database says about a thread.

These read the ledger only (``status`` also peeks at the checkpoint of an
unfinished run), so they import neither LangGraph nor LangChain for a finished
one and answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

from langgraph_cancel.cli import render
from langgraph_cancel.cli.config import LEASE_TTL_NOTE, PROG, Database, resolve_database
from langgraph_cancel.cli.database import open_ledger, open_saver
from langgraph_cancel.cli.thread import StoredThread
from langgraph_cancel.errors import CommandLineError, UnknownThreadError
from langgraph_cancel.types import (
    EffectKind,
    EffectRecord,
    EffectStatus,
    RunRecord,
    RunStatus,
    utcnow,
)
from langgraph_cancel.workers import lease_is_live


def _peek_checkpoint(saver: Any, thread_id: str) -> tuple[dict[str, Any] | None, list[Any]]:
    """The latest checkpoint's step and time, and the interrupts waiting for an answer."""
    found = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    if found is None:
        return None, []
    info = {
        "checkpoint_id": found.config.get("configurable", {}).get("checkpoint_id"),
        "ts": found.checkpoint.get("ts"),
        "step": (found.metadata or {}).get("step"),
    }
    interrupts: list[Any] = []
    for _task, channel, value in found.pending_writes or []:
        if channel == "__interrupt__":
            for item in value if isinstance(value, list | tuple) else [value]:
                interrupts.append(getattr(item, "value", item))
    return info, interrupts


def load_thread(db: Database, thread_id: str) -> StoredThread:
    """Everything ``status`` needs, from the database alone.

    Raises:
        UnknownThreadError: The ledger has no run of the thread.
    """
    with open_ledger(db) as ledger:
        runs = ledger.runs(thread_id)
        if not runs:
            raise UnknownThreadError(thread_id)
        effects = ledger.effects(thread_id)
        lease = ledger.lease(thread_id)
    state = StoredThread(thread_id, runs, effects, lease)
    if state.latest.terminal or db.url.is_memory:
        return state
    # An unfinished run: where it stopped, and whether it waits for an answer, is in
    # the checkpoint (this is what imports LangGraph).
    checkpoint: dict[str, Any] | None = None
    interrupts: list[Any] = []
    with contextlib.suppress(Exception), open_saver(db) as saver:
        checkpoint, interrupts = _peek_checkpoint(saver, thread_id)
    return StoredThread(thread_id, runs, effects, lease, interrupts, checkpoint)


def _unfinished_steps(state: StoredThread, flag: str) -> list[str]:
    thread = state.thread_id
    latest = state.latest
    live = lease_is_live(state.lease)
    holder = state.lease.owner if state.lease else "?"
    pending = [
        e
        for e in state.effects
        if e.run_id == latest.run_id and e.status is EffectStatus.PENDING_APPROVAL
    ]
    if live and latest.status is RunStatus.RUNNING:
        return [
            f"The run is in progress on worker {holder}. To stop it: "
            f"`{PROG} cancel {thread} --reason '...' --by '...'{flag}`. (If that worker died, "
            f"its lease expires within {LEASE_TTL_NOTE}; then `{PROG} resume {thread}{flag}`.)"
        ]
    if live:
        return [
            f"Stop was requested; worker {holder} is finishing the cancel (waiting for in-flight "
            f"calls). Run `{PROG} status {thread}{flag}` again."
        ]
    if state.interrupts or pending:
        what = f"{len(pending)} call(s) awaiting approval" if pending else "an interrupt"
        action = (
            "resume it to finish the cancel (pending calls are dropped)"
            if latest.cancel_requested
            else f"answer it in Studio, or with `{PROG} resume {thread} --resume-value JSON{flag}`"
        )
        return [f"The thread is paused on {what}: {action}."]
    if latest.cancel_requested:
        return [
            f"Stop was requested but no worker is finishing it: `{PROG} resume {thread}{flag}` "
            "reconciles what was in flight, drops what never ran and writes the report."
        ]
    return [
        f"No worker holds this thread (it crashed or was stopped): `{PROG} resume {thread}{flag}` "
        "reconciles first, then continues without repeating any committed call."
    ]


def next_steps(state: StoredThread, flag: str) -> list[str]:
    """What must happen next, from persisted state alone (the seeds' third question).

    Args:
        state: The thread.
        flag: `` --db X`` to repeat in the suggested commands (may be empty).
    """
    thread = state.thread_id
    latest = state.latest
    steps = [] if latest.terminal else _unfinished_steps(state, flag)
    in_flight = [e for e in state.effects if e.status is EffectStatus.DISPATCHED]
    if in_flight and not lease_is_live(state.lease):
        steps.append(
            f"{len(in_flight)} call(s) were left in flight with no recorded outcome: "
            f"`{PROG} reconcile {thread}{flag}` asks the providers what became of them."
        )
    for effect in state.effects:
        label = render.call_label(effect.tool, effect.args)
        if effect.status is EffectStatus.UNKNOWN:
            steps.append(
                f"{label} [{effect.idempotency_key}] has an unknown outcome: "
                f"{effect.owner or 'an operator'} must {effect.next_action or 'settle it'}."
            )
        elif effect.status in (EffectStatus.COMPENSATION_FAILED, EffectStatus.COMPENSATING):
            steps.append(
                f"Undoing {label} did not finish ({effect.status.value}): "
                f"retry with `{PROG} compensate {thread}{flag}`."
            )
    if steps:
        return steps
    if latest.status is RunStatus.CANCELLED:
        steps.append("Nothing: the run was cancelled and every effect is settled.")
        reversible = [
            e
            for e in state.committed
            if e.run_id == latest.run_id and e.kind is EffectKind.REVERSIBLE
        ]
        if reversible:
            steps.append(
                f"Optional: undo its {len(reversible)} committed reversible effect(s) with "
                f"`{PROG} compensate {thread}{flag}`."
            )
    elif latest.status is RunStatus.COMPLETED:
        steps.append("Nothing: the run completed and every effect is settled.")
    else:
        steps.append(
            f"The run failed: `{PROG} resume {thread}{flag}` retries from the last checkpoint "
            "(committed calls are not repeated)."
        )
    return steps


def effect_json(effect: EffectRecord) -> dict[str, Any]:
    """An effect record as JSON data."""
    data: dict[str, Any] = effect.model_dump(mode="json")
    return data


def run_json(run: RunRecord) -> dict[str, Any]:
    """A run record as JSON data, without its stored report."""
    data: dict[str, Any] = run.model_dump(mode="json", exclude={"report"})
    return data


def status_json(state: StoredThread, flag: str) -> dict[str, Any]:
    """``status --json``: the runs, the lease and the three questions."""
    lease = state.lease
    return {
        "thread_id": state.thread_id,
        "run": run_json(state.latest),
        "runs": [run_json(run) for run in state.runs],
        "lease": None
        if lease is None
        else {**lease.model_dump(mode="json"), "live": lease_is_live(lease)},
        "checkpoint": state.checkpoint,
        "interrupts": json.loads(json.dumps(state.interrupts, default=str)),
        "done": [effect_json(e) for e in state.done],
        "committed": [effect_json(e) for e in state.committed],
        "permanent": [effect_json(e) for e in state.committed if e.kind is EffectKind.IRREVERSIBLE],
        "maybe_committed": [effect_json(e) for e in state.maybe_committed],
        "not_done": [effect_json(e) for e in state.not_done],
        "next_steps": next_steps(state, flag),
    }


# ------------------------------------------------------------------ commands
def status(args: argparse.Namespace) -> int:
    """``langgraph-cancel status THREAD``."""
    db = resolve_database(args.db)
    state = load_thread(db, args.thread)
    if args.json:
        render.print_json(status_json(state, db.flag))
        return 0
    beat = None
    if state.lease is not None:
        beat = (utcnow() - state.lease.heartbeat_at).total_seconds()
    render.render_status(
        render.console(),
        state,
        next_steps(state, db.flag),
        lease_live=lease_is_live(state.lease),
        beat=beat,
    )
    return 0


def effects(args: argparse.Namespace) -> int:
    """``langgraph-cancel effects THREAD [--history]``."""
    db = resolve_database(args.db)
    with open_ledger(db) as ledger:
        ledger.require_latest_run(args.thread)
        records = ledger.effects(args.thread)
        history = (
            {e.effect_id: ledger.history(e.effect_id) for e in records} if args.history else None
        )
    if args.json:
        out = []
        for effect in records:
            item = effect_json(effect)
            if history is not None:
                item["history"] = [h.model_dump(mode="json") for h in history[effect.effect_id]]
            out.append(item)
        render.print_json(out)
        return 0
    render.render_effects(render.console(), args.thread, records, history)
    return 0


def report(args: argparse.Namespace) -> int:
    """``langgraph-cancel report THREAD [--run ID] [--now]``."""
    from langgraph_cancel.report import CancellationReport, build_report

    db = resolve_database(args.db)
    with open_ledger(db) as ledger:
        run = ledger.require_latest_run(args.thread)
        if args.run is not None:
            run = ledger.get_run(args.run)
            if run.thread_id != args.thread:
                raise CommandLineError(
                    f"run {args.run} belongs to thread {run.thread_id!r}, not {args.thread!r}"
                )
        current = build_report(ledger, run)
    stored = CancellationReport.model_validate(run.report) if run.report else None
    shown = current if args.now or stored is None else stored
    if args.json:
        print(shown.model_dump_json(indent=2))
        return 0
    out = render.console()
    render.render_report(out, shown)
    if stored is not None and not args.now and _buckets(stored) != _buckets(current):
        render.line(
            out,
            "Note: this is the report written when the run was cancelled; effects have moved "
            f"since (compensated or reconciled). `{PROG} report {args.thread} --now{db.flag}` "
            "shows them as they are now.",
        )
    return 0


def _buckets(shown: Any) -> dict[str, set[str]]:
    return {b: {e.effect_id for e in getattr(shown, b)} for b, _label, _style in render.CATEGORIES}


__all__ = [
    "StoredThread",
    "effect_json",
    "effects",
    "load_thread",
    "next_steps",
    "report",
    "run_json",
    "status",
    "status_json",
]

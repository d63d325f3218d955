"""``langgraph-cancel``: run the demo, and inspect, stop, settle and resume threads.

Every command takes ``--db URL`` (``sqlite:///file.db``, a bare file path,
``postgresql://...``; default ``$LANGGRAPH_CANCEL_DB`` or the embedded SQLite
file ``.langgraph-cancel.db``). Commands whose output is data take ``--json``;
without it they print tables for people. Errors are one line on stderr and exit
code 1 (set ``LANGGRAPH_CANCEL_DEBUG=1`` for a traceback).

Commands::

    demo [--cancel-at STEP]        the seed scenario, stopped mid-run, and its report
    status THREAD                  run lifecycle and the three questions, from the database
    effects THREAD [--history]     every effect record (and its audit trail)
    cancel THREAD --reason R --by WHO
    report THREAD                  the cancellation report
    compensate THREAD [--graph M:A]   undo committed reversible effects
    resume THREAD [--graph M:A]    reconcile, then continue the thread from its checkpoint
    reconcile [THREAD | --all]     settle unknown / in-flight effects through reconcile hooks
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import importlib
import importlib.util
import json
import os
import sqlite3
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.table import Table
from rich.text import Text

from langgraph_cancel.errors import (
    ConfigurationError,
    InvalidURLError,
    LangGraphCancelError,
    UnknownThreadError,
)
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.report import CancellationReport, ReportEffect
from langgraph_cancel.runtime import ENV_DB, default_db_url
from langgraph_cancel.types import (
    EffectKind,
    EffectRecord,
    EffectStatus,
    LeaseRecord,
    RunRecord,
    RunStatus,
    utcnow,
)

PROG = "langgraph-cancel"
DEFAULT_GRAPH = "langgraph_cancel.demo.graph:graph"
DEBUG_ENV = "LANGGRAPH_CANCEL_DEBUG"
LEASE_NOTE = "30 s"


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


# ------------------------------------------------------------------ consoles
def _console(*, stderr: bool = False) -> Console:
    """A console that does not squeeze tables when output is not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 160
    return Console(file=stream, width=width, soft_wrap=True, highlight=False)


# -------------------------------------------------------------------- the db
def normalize_url(db: str) -> str:
    """A database URL from ``--db``: URLs pass through, a bare path becomes ``sqlite:///``.

    Raises:
        InvalidURLError: For a URL of an unsupported scheme.
    """
    db = db.strip()
    if not db:
        raise InvalidURLError("empty database URL")
    if db in (":memory:", "memory", "memory://"):
        return "memory://"
    if "://" in db:
        scheme = db.split("://", 1)[0].lower()
        if scheme == "postgres":
            return "postgresql://" + db.split("://", 1)[1]
        if scheme not in ("sqlite", "postgresql", "postgresql+psycopg", "memory"):
            raise InvalidURLError(
                f"unsupported database URL {db!r}: use sqlite:///path/to/file.db, a file "
                "path, or postgresql://user@host:port/dbname"
            )
        path = sqlite_path(db)
        if scheme == "sqlite" and path is None:
            raise InvalidURLError(f"{db!r} names no file: use sqlite:///path/to/file.db")
        if path is not None and path != ":memory:" and not os.path.isabs(path):
            return "sqlite:///" + os.path.abspath(path)
        return db
    return "sqlite:///" + os.path.abspath(os.path.expanduser(db))


def sqlite_path(url: str) -> str | None:
    """The file a ``sqlite:///`` URL names (``None`` for other URLs)."""
    if url.startswith("sqlite:///"):
        return url[len("sqlite:///") :] or None
    return None


def _check_reachable(url: str, *, create: bool) -> None:
    path = sqlite_path(url)
    if path is not None:
        if path == ":memory:":
            return
        if not create and not Path(path).is_file():
            raise CliError(
                f"no database at {path} (run `{PROG} demo`, or point --db / ${ENV_DB} at your "
                "agent's database)"
            )
        if create:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        return
    if url.startswith(("postgresql://", "postgresql+psycopg://")):
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - extra missing
            raise CliError(
                "PostgreSQL needs the extra: pip install 'langgraph-cancel[postgres]'"
            ) from exc
        conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
        try:
            with psycopg.connect(conninfo, connect_timeout=5):
                pass
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CliError(f"cannot connect to {_redact(url)}: {first}") from exc


def _redact(url: str) -> str:
    """A URL with its password hidden."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    auth, host = rest.rsplit("@", 1)
    if ":" in auth:
        auth = auth.split(":", 1)[0] + ":***"
    return f"{scheme}://{auth}@{host}"


@contextlib.contextmanager
def open_ledger(db: str, *, create: bool = False) -> Iterator[Ledger]:
    """The ledger ``--db`` names, checked first (a missing file is an error unless ``create``)."""
    url = normalize_url(db)
    _check_reachable(url, create=create)
    ledger = Ledger.from_url(url)
    try:
        yield ledger
    finally:
        ledger.close()


@contextlib.contextmanager
def open_saver(db: str, *, create: bool = False) -> Iterator[Any]:
    """A cancel-aware checkpointer on ``--db``, set up: SQLite, PostgreSQL or memory."""
    url = normalize_url(db)
    _check_reachable(url, create=create)
    if url == "memory://" or url.startswith("memory://"):
        from langgraph_cancel.checkpointers.memory import MemoryCancelSaver

        memory = MemoryCancelSaver()
        yield memory
        return
    path = sqlite_path(url)
    if path is not None:
        from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver

        with SqliteCancelSaver.from_conn_string(path) as saver:
            saver.setup()
            yield saver
        return
    from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

    with PostgresCancelSaver.from_conn_string(
        url.replace("postgresql+psycopg://", "postgresql://", 1)
    ) as pg:
        pg.setup()
        yield pg


def _require_thread(ledger: Ledger, thread_id: str) -> RunRecord:
    return ledger.require_latest_run(thread_id)


# ---------------------------------------------------------------- formatting
def _short(value: Any, limit: int = 48) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_label(tool: str, args: Mapping[str, Any], limit: int = 24) -> str:
    """``tool(k=v, ...)``: long values shortened, free text (over 40 characters) elided."""
    parts = []
    for k, v in args.items():
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        parts.append(
            f"{k}=…" if isinstance(v, str) and len(text) > 40 else f"{k}={_short(text, limit)}"
        )
    return f"{tool}({', '.join(parts)})"


def _ts(value: datetime | str | None, *, short: bool = False) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return value
        value = parsed
    fmt = "%H:%M:%S.%f" if short else "%Y-%m-%d %H:%M:%S.%f"
    return value.astimezone().strftime(fmt)[:-3]


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} ms"


def _lease_live(lease: LeaseRecord | None) -> bool:
    return lease is not None and lease.expires_at > utcnow()


_STATUS_STYLE = {
    "committed": "green",
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
}


def _status_text(status: str) -> Text:
    return Text(status, style=_STATUS_STYLE.get(status, ""))


# ---------------------------------------------------------------- the report
_CATEGORIES: tuple[tuple[str, str, str], ...] = (
    ("permanent", "Permanent", "bold red"),
    ("reversible_committed", "Reversible, committed", "yellow"),
    ("compensated", "Compensated (undone)", "cyan"),
    ("compensation_failed", "Compensation failed", "bold red"),
    ("unknown", "Unknown outcome", "bold red"),
    ("not_run", "Not run", "green"),
    ("rejected", "Rejected at approval", "magenta"),
)


def _report_note(bucket: str, e: ReportEffect, thread_id: str) -> str:
    if bucket == "permanent":
        return "irreversible: cancelling cannot undo it"
    if bucket == "reversible_committed":
        return f"undo: {PROG} compensate {thread_id}"
    if bucket == "compensated":
        return f"undone at {_ts(e.settled_at)}"
    if bucket == "compensation_failed":
        return f"{e.error or 'the undo failed'}; retry: {PROG} compensate {thread_id}"
    if bucket == "unknown":
        return f"owner: {e.owner or '?'}; next: {e.next_action or '?'}"
    if bucket == "not_run":
        return "never dispatched"
    return _short(e.error or "refused by the reviewer", 60)


def render_report(console: Console, report: CancellationReport) -> None:
    """The report as tables a person reads: effects by category, then the timings."""
    table = Table(
        title=f"Cancellation report — thread {escape(report.thread_id)}, run {report.run_id}",
        title_justify="left",
        show_lines=False,
        expand=False,
    )
    table.add_column("Category", no_wrap=True)
    table.add_column("Tool call", overflow="fold")
    table.add_column("Kind", no_wrap=True)
    table.add_column("Idempotency key", overflow="fold")
    table.add_column("What it means", overflow="fold")
    for bucket, label, style in _CATEGORIES:
        items: list[ReportEffect] = list(getattr(report, bucket))
        head = Text(f"{label} ({len(items)})", style=style)
        if not items:
            table.add_row(head, Text("none", style="dim"), "", "", "")
        for i, e in enumerate(items):
            table.add_row(
                head if i == 0 else "",
                escape(call_label(e.tool, e.args)),
                e.kind,
                escape(e.idempotency_key),
                escape(_report_note(bucket, e, report.thread_id)),
            )
        table.add_section()
    console.print(table)

    timings = Table(title="Run and timings", title_justify="left", show_header=False)
    timings.add_column("field", style="bold", no_wrap=True)
    timings.add_column("value", overflow="fold")
    timings.add_row("status", _status_text(report.status))
    timings.add_row("reason", escape(report.reason or "—"))
    timings.add_row("requested by", escape(report.requested_by or "—"))
    timings.add_row("requested at", _ts(report.requested_at))
    timings.add_row(
        "observed at",
        f"{_ts(report.observed_at, short=True)}  (cancel latency {_ms(report.cancel_latency_ms)})",
    )
    timings.add_row(
        "quiesced at",
        f"{_ts(report.quiesced_at, short=True)}  (quiescence {_ms(report.quiescence_ms)})",
    )
    dac = report.dispatched_after_cancel
    timings.add_row(
        "dispatched after cancel",
        Text(f"{dac}" + ("  (must be 0)" if dac else ""), style="bold red" if dac else "green"),
    )
    timings.add_row("orphans", str(report.orphans))
    timings.add_row(
        "tokens after cancel",
        "—" if report.tokens_after_cancel is None else str(report.tokens_after_cancel),
    )
    console.print(timings)
    console.print(Text.assemble(("Summary: ", "bold"), (report.summary, "bold")))


# ------------------------------------------------------------ graph loading
def load_object(spec: str) -> Any:
    """``module:attr`` or ``path/to/file.py:attr`` (``attr`` may be dotted)."""
    if ":" not in spec:
        raise CliError(f"--graph wants module:attribute or path/to/file.py:attribute, got {spec!r}")
    module_name, _, attr = spec.rpartition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = Path(module_name).resolve()
            if not path.is_file():
                raise CliError(f"--graph: no file {path}")
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            if mod_spec is None or mod_spec.loader is None:
                raise CliError(f"--graph: cannot import {path}")
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules.setdefault(path.stem, module)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"--graph: cannot import {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"--graph: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def builder_of(obj: Any) -> Any:
    """The ``StateGraph`` behind a compiled graph, a builder, or a factory of either."""
    from langgraph.graph import StateGraph
    from langgraph.graph.state import CompiledStateGraph

    if isinstance(obj, CompiledStateGraph):
        return obj.builder
    if isinstance(obj, StateGraph):
        return obj
    if callable(obj):
        return builder_of(obj())
    raise CliError(
        f"--graph must name a StateGraph, a compiled graph or a function returning one, "
        f"not {type(obj).__name__}"
    )


def tools_of(obj: Any) -> dict[str, Any]:
    """The tools (with their hooks) a graph, a builder or a list of tools holds."""
    from langchain_core.tools import BaseTool
    from langgraph.prebuilt import ToolNode

    if isinstance(obj, BaseTool):
        return {obj.name: obj}
    if isinstance(obj, list | tuple) and all(isinstance(t, BaseTool) for t in obj):
        return {t.name: t for t in obj}
    builder = builder_of(obj)
    tools: dict[str, Any] = {}
    for node in builder.nodes.values():
        if isinstance(node.runnable, ToolNode):
            tools.update(node.runnable.tools_by_name)
    settings = getattr(builder, "cancellation", None)
    if settings is not None:
        tools.update(settings.tools)
    return tools


# ------------------------------------------------------------------- status
@dataclass
class ThreadState:
    """What the database holds about a thread."""

    thread_id: str
    runs: list[RunRecord]
    effects: list[EffectRecord]
    lease: LeaseRecord | None
    interrupts: list[Any]
    checkpoint: dict[str, Any] | None

    @property
    def latest(self) -> RunRecord:
        return self.runs[-1]


def _peek_checkpoint(saver: Any, thread_id: str) -> tuple[dict[str, Any] | None, list[Any]]:
    """The latest checkpoint's step/time and any interrupt waiting for an answer."""
    try:
        tup = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    except Exception:
        return None, []
    if tup is None:
        return None, []
    info = {
        "checkpoint_id": tup.config.get("configurable", {}).get("checkpoint_id"),
        "ts": tup.checkpoint.get("ts"),
        "step": (tup.metadata or {}).get("step"),
    }
    interrupts: list[Any] = []
    for _task, channel, value in tup.pending_writes or []:
        if channel == "__interrupt__":
            for item in value if isinstance(value, list | tuple) else [value]:
                interrupts.append(getattr(item, "value", item))
    return info, interrupts


def load_thread(db: str, thread_id: str) -> ThreadState:
    """Everything ``status`` needs, from the database alone."""
    url = normalize_url(db)
    with open_ledger(db) as ledger:
        runs = ledger.runs(thread_id)
        if not runs:
            raise UnknownThreadError(thread_id)
        effects = ledger.effects(thread_id)
        lease = ledger.lease(thread_id)
    checkpoint: dict[str, Any] | None = None
    interrupts: list[Any] = []
    if not url.startswith("memory"):
        with contextlib.suppress(Exception), open_saver(db) as saver:
            checkpoint, interrupts = _peek_checkpoint(saver, thread_id)
    return ThreadState(thread_id, runs, effects, lease, interrupts, checkpoint)


def next_steps(state: ThreadState, db_flag: str) -> list[str]:
    """What must happen next, from persisted state alone (the seeds' third question)."""
    t = state.thread_id
    latest = state.latest
    live = _lease_live(state.lease)
    by = [e for e in state.effects if e.run_id == latest.run_id]
    unknown = [e for e in state.effects if e.status is EffectStatus.UNKNOWN]
    in_flight = [e for e in state.effects if e.status is EffectStatus.DISPATCHED]
    comp_failed = [
        e
        for e in state.effects
        if e.status in (EffectStatus.COMPENSATION_FAILED, EffectStatus.COMPENSATING)
    ]
    pending = [e for e in by if e.status is EffectStatus.PENDING_APPROVAL]
    steps: list[str] = []
    if not latest.terminal:
        holder = state.lease.owner if state.lease else "?"
        if live and latest.status is RunStatus.RUNNING:
            steps.append(
                f"The run is in progress on worker {holder}. To stop it: "
                f"`{PROG} cancel {t} --reason '...' --by '...'{db_flag}`. (If that worker died, "
                f"its lease expires within {LEASE_NOTE}; then `{PROG} resume {t}{db_flag}`.)"
            )
        elif live:
            steps.append(
                f"Stop was requested; worker {holder} is finishing the cancel (waiting for "
                f"in-flight calls). Run `{PROG} status {t}{db_flag}` again."
            )
        elif state.interrupts or pending:
            what = f"{len(pending)} call(s) awaiting approval" if pending else "an interrupt"
            action = (
                "resume it to finish the cancel (pending calls are dropped)"
                if latest.cancel_requested
                else "answer it in Studio, or with "
                f"`{PROG} resume {t} --resume-value JSON{db_flag}`"
            )
            steps.append(f"The thread is paused on {what}: {action}.")
        elif latest.cancel_requested:
            steps.append(
                f"Stop was requested but no worker is finishing it: `{PROG} resume {t}{db_flag}` "
                "reconciles what was in flight, drops what never ran and writes the report."
            )
        else:
            steps.append(
                f"No worker holds this thread (it crashed or was stopped): "
                f"`{PROG} resume {t}{db_flag}` reconciles first, then continues without "
                "repeating any committed call."
            )
    if in_flight and not live:
        steps.append(
            f"{len(in_flight)} call(s) were left in flight with no recorded outcome: "
            f"`{PROG} reconcile {t}{db_flag}` asks the providers what became of them."
        )
    for e in unknown:
        steps.append(
            f"{call_label(e.tool, e.args)} [{e.idempotency_key}] has an unknown outcome: "
            f"{e.owner or 'an operator'} must {e.next_action or 'settle it'}."
        )
    for e in comp_failed:
        steps.append(
            f"Undoing {call_label(e.tool, e.args)} did not finish ({e.status.value}): "
            f"retry with `{PROG} compensate {t}{db_flag}`."
        )
    if not steps:
        reversible = [
            e for e in by if e.kind is EffectKind.REVERSIBLE and e.status is EffectStatus.COMMITTED
        ]
        if latest.status is RunStatus.CANCELLED:
            steps.append("Nothing: the run was cancelled and every effect is settled.")
            if reversible:
                steps.append(
                    f"Optional: undo its {len(reversible)} committed reversible effect(s) with "
                    f"`{PROG} compensate {t}{db_flag}`."
                )
        elif latest.status is RunStatus.COMPLETED:
            steps.append("Nothing: the run completed and every effect is settled.")
        else:
            steps.append(
                f"The run failed: `{PROG} resume {t}{db_flag}` retries from the last checkpoint "
                "(committed calls are not repeated)."
            )
    return steps


def _effect_json(e: EffectRecord) -> dict[str, Any]:
    data: dict[str, Any] = e.model_dump(mode="json")
    return data


def status_json(state: ThreadState, db_flag: str) -> dict[str, Any]:
    """``status --json``."""
    e = state.effects
    committed = [
        x for x in e if x.status is EffectStatus.COMMITTED and x.kind is not EffectKind.READ_ONLY
    ]
    maybe = [
        x
        for x in e
        if x.status
        in (
            EffectStatus.DISPATCHED,
            EffectStatus.UNKNOWN,
            EffectStatus.COMPENSATING,
            EffectStatus.COMPENSATION_FAILED,
        )
    ]
    return {
        "thread_id": state.thread_id,
        "run": state.latest.model_dump(mode="json", exclude={"report"}),
        "runs": [r.model_dump(mode="json", exclude={"report"}) for r in state.runs],
        "lease": None
        if state.lease is None
        else {**state.lease.model_dump(mode="json"), "live": _lease_live(state.lease)},
        "checkpoint": state.checkpoint,
        "interrupts": json.loads(json.dumps(state.interrupts, default=str)),
        "done": [
            _effect_json(x)
            for x in e
            if x.status
            in (
                EffectStatus.COMMITTED,
                EffectStatus.COMPENSATED,
                EffectStatus.FAILED,
                EffectStatus.NOT_APPLIED,
            )
        ],
        "committed": [_effect_json(x) for x in committed],
        "permanent": [_effect_json(x) for x in committed if x.kind is EffectKind.IRREVERSIBLE],
        "maybe_committed": [_effect_json(x) for x in maybe],
        "not_done": [
            _effect_json(x)
            for x in e
            if x.status
            in (
                EffectStatus.DROPPED,
                EffectStatus.REJECTED,
                EffectStatus.PLANNED,
                EffectStatus.PENDING_APPROVAL,
                EffectStatus.APPROVED,
            )
        ],
        "next_steps": next_steps(state, db_flag),
    }


def render_status(console: Console, state: ThreadState, db_flag: str) -> None:
    """``status`` for people: runs, lease, then the three questions."""
    t = state.thread_id
    runs = Table(title=f"Thread {escape(t)}: runs", title_justify="left")
    runs.add_column("run id", no_wrap=True)
    for col in ("status", "started", "stop requested", "by / reason", "observed", "quiesced"):
        runs.add_column(col, overflow="fold")
    for r in state.runs:
        runs.add_row(
            r.run_id,
            _status_text(r.status.value),
            _ts(r.created_at),
            _ts(r.requested_at, short=True),
            escape(" / ".join(x for x in (r.requested_by, r.reason) if x) or "—"),
            _ts(r.observed_at, short=True),
            _ts(r.quiesced_at, short=True),
        )
    console.print(runs)
    lease = state.lease
    if lease is None:
        console.print("Lease: none (no worker is running this thread)")
    else:
        alive = "live" if _lease_live(lease) else "EXPIRED (its worker stopped heartbeating)"
        beat = (utcnow() - lease.heartbeat_at).total_seconds()
        console.print(
            f"Lease: held by {escape(lease.owner)} until {_ts(lease.expires_at)} "
            f"({alive}; last heartbeat {beat:.0f} s ago)"
        )
    if state.checkpoint:
        console.print(
            f"Last checkpoint: step {state.checkpoint.get('step')} at "
            f"{_ts(state.checkpoint.get('ts'))}"
        )
    for value in state.interrupts:
        console.print(
            Text("Waiting for an answer: ", style="bold yellow") + Text(_short(value, 300))
        )

    done = [
        e
        for e in state.effects
        if e.status
        in (
            EffectStatus.COMMITTED,
            EffectStatus.COMPENSATED,
            EffectStatus.FAILED,
            EffectStatus.NOT_APPLIED,
        )
    ]
    not_done = [
        e
        for e in state.effects
        if e.status
        in (
            EffectStatus.DROPPED,
            EffectStatus.REJECTED,
            EffectStatus.PLANNED,
            EffectStatus.PENDING_APPROVAL,
            EffectStatus.APPROVED,
        )
    ]
    console.print(Text("\n1. What was done", style="bold"))
    if not done:
        console.print("   nothing yet")
    for e in done:
        console.print(
            Text("   ")
            + _status_text(e.status.value)
            + Text(f"  {call_label(e.tool, e.args)}  ({e.kind.value})")
        )
    if not_done:
        console.print("   Not done:")
        for e in not_done:
            console.print(
                Text("   ") + _status_text(e.status.value) + Text(f"  {call_label(e.tool, e.args)}")
            )

    console.print(Text("\n2. External side effects committed, or that may have been", style="bold"))
    side = [
        e
        for e in state.effects
        if e.kind is not EffectKind.READ_ONLY
        and e.status
        in (
            EffectStatus.COMMITTED,
            EffectStatus.DISPATCHED,
            EffectStatus.UNKNOWN,
            EffectStatus.COMPENSATING,
            EffectStatus.COMPENSATION_FAILED,
            EffectStatus.COMPENSATED,
        )
    ]
    if not side:
        console.print("   none: nothing left the process with a side effect")
    for e in side:
        if e.status is EffectStatus.COMMITTED:
            verdict = (
                "committed, permanent"
                if e.kind is EffectKind.IRREVERSIBLE
                else "committed, reversible"
            )
        elif e.status is EffectStatus.COMPENSATED:
            verdict = "committed, then undone"
        elif e.status is EffectStatus.DISPATCHED:
            verdict = "MAY have been committed: in flight, no outcome recorded"
        elif e.status is EffectStatus.UNKNOWN:
            verdict = f"MAY have been committed: unknown (owner {e.owner})"
        else:
            verdict = f"committed; undo {e.status.value}"
        console.print(
            f"   {escape(call_label(e.tool, e.args))}  key {escape(e.idempotency_key)}: {verdict}"
        )

    console.print(Text("\n3. Next step", style="bold"))
    for line in next_steps(state, db_flag):
        console.print(f"   {escape(line)}")


# ---------------------------------------------------------------- commands
def _db_flag(args: argparse.Namespace) -> str:
    """The ``--db`` to repeat in suggested commands (empty when it is the default)."""
    return "" if args.db == default_db_url() else f" --db {args.db}"


def cmd_status(args: argparse.Namespace) -> int:
    state = load_thread(args.db, args.thread)
    if args.json:
        print(json.dumps(status_json(state, _db_flag(args)), indent=2, default=str))
    else:
        render_status(_console(), state, _db_flag(args))
    return 0


def cmd_effects(args: argparse.Namespace) -> int:
    with open_ledger(args.db) as ledger:
        _require_thread(ledger, args.thread)
        effects = ledger.effects(args.thread)
        history = (
            {e.effect_id: ledger.history(e.effect_id) for e in effects} if args.history else {}
        )
    if args.json:
        out = []
        for e in effects:
            item = _effect_json(e)
            if args.history:
                item["history"] = [h.model_dump(mode="json") for h in history[e.effect_id]]
            out.append(item)
        print(json.dumps(out, indent=2, default=str))
        return 0
    console = _console()
    table = Table(title=f"Effects of thread {escape(args.thread)}", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("tool call", overflow="fold", min_width=24)
    table.add_column("kind", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("idempotency key", overflow="fold")
    table.add_column("owner / next action / error", overflow="fold")
    table.add_column("dispatched", no_wrap=True)
    table.add_column("settled", no_wrap=True)
    for i, e in enumerate(effects, 1):
        if e.status in (EffectStatus.UNKNOWN, EffectStatus.DISPATCHED):
            note = f"{e.owner or '?'}: {e.next_action or 'in flight'}"
        else:
            note = _short(e.error or "", 60)
        table.add_row(
            str(i),
            escape(call_label(e.tool, e.args)),
            e.kind.value,
            _status_text(e.status.value),
            escape(e.idempotency_key),
            escape(note),
            _ts(e.dispatched_at, short=True),
            _ts(e.settled_at, short=True),
        )
    console.print(table)
    if not effects:
        console.print("(no effects recorded)")
    for e in effects if args.history else []:
        trail = Table(
            title=f"{escape(call_label(e.tool, e.args))}  [{e.effect_id}]",
            title_justify="left",
            show_edge=False,
        )
        for col in ("at", "transition", "actor", "detail"):
            trail.add_column(col, overflow="fold")
        for h in history[e.effect_id]:
            src = h.from_status.value if h.from_status else "(new)"
            trail.add_row(
                _ts(h.at, short=True),
                f"{src} → {h.to_status.value}",
                escape(h.actor),
                escape(_short(h.detail, 90) if h.detail else ""),
            )
        console.print(trail)
    return 0


def _bucket_ids(report: CancellationReport) -> dict[str, set[str]]:
    return {b: {e.effect_id for e in getattr(report, b)} for b, _l, _s in _CATEGORIES}


def cmd_report(args: argparse.Namespace) -> int:
    from langgraph_cancel.api import get_report
    from langgraph_cancel.report import build_report

    with open_ledger(args.db) as ledger:
        run = ledger.get_run(args.run) if args.run else _require_thread(ledger, args.thread)
        report = get_report(ledger, args.thread, run_id=args.run)
        current = build_report(ledger, run, status=run.status.value) if run.report else report
    moved = _bucket_ids(current) != _bucket_ids(report)
    if args.now:
        report = current
    if args.json:
        print(report.model_dump_json(indent=2))
        return 0
    console = _console()
    render_report(console, report)
    if moved and not args.now:
        console.print(
            "Note: this is the report written when the run was cancelled; effects have moved "
            f"since (compensated or reconciled). `{PROG} report {args.thread} --now"
            f"{_db_flag(args)}` shows them as they are now."
        )
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from langgraph_cancel.api import request_cancel

    with open_ledger(args.db) as ledger:
        result = request_cancel(ledger, args.thread, reason=args.reason, requested_by=args.by)
        lease = ledger.lease(args.thread)
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    console = _console()
    if not result.accepted:
        console.print(f"{escape(result.message)}: no-op.")
        return 0
    console.print(
        escape(result.message)
        + (f" (reason: {escape(result.reason or '')})" if result.first else "")
    )
    if _lease_live(lease):
        console.print(
            f"Worker {escape(lease.owner if lease else '?')} stops at its next check, waits for "
            f"in-flight calls and writes the report: `{PROG} report {args.thread}"
            f"{_db_flag(args)}`."
        )
    else:
        console.print(
            "No worker is running this thread right now; the cancel is finished when the thread "
            f"is resumed: `{PROG} resume {args.thread}{_db_flag(args)}`."
        )
    return 0


def _render_reconciled(console: Console, results: Sequence[Any]) -> None:
    table = Table(title="Reconciliation", title_justify="left")
    for col in ("thread", "tool call", "before", "after", "owner / next action / note"):
        table.add_column(col, overflow="fold")
    rows = 0
    for r in results:
        if r.reaped:
            console.print(
                f"Reaped the expired lease of {escape(r.reaped)} on thread {escape(r.thread_id)}."
            )
        if r.busy:
            console.print(
                f"Skipped thread {escape(r.thread_id)}: worker {escape(r.busy)} holds a "
                f"live lease (until {escape(str(r.busy_until))}); its in-flight calls "
                "are still awaited."
            )
        for s in r.effects:
            e = s.effect
            note = (
                f"{e.owner}: {e.next_action}"
                if e.status is EffectStatus.UNKNOWN
                else (e.error or "")
            )
            table.add_row(
                escape(r.thread_id),
                escape(call_label(e.tool, e.args)),
                s.before.value,
                _status_text(e.status.value),
                escape(_short(note, 100)),
            )
            rows += 1
    if rows:
        console.print(table)
    elif not any(r.busy for r in results):
        console.print("Nothing to reconcile: no effect is in flight without an outcome or unknown.")


def _reconciled_json(results: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {
            "thread_id": r.thread_id,
            "busy": r.busy,
            "busy_until": r.busy_until,
            "reaped_lease_of": r.reaped,
            "effects": [{**_effect_json(s.effect), "before": s.before.value} for s in r.effects],
            "still_unknown": [e.effect_id for e in r.still_unknown],
        }
        for r in results
    ]


def cmd_reconcile(args: argparse.Namespace) -> int:
    from langgraph_cancel.recovery import reconcile

    if bool(args.thread) == bool(args.all):
        raise CliError("reconcile wants a THREAD or --all (not both)")
    tools = tools_of(load_object(args.graph))
    with open_ledger(args.db) as ledger:
        if args.thread:
            _require_thread(ledger, args.thread)
        results = reconcile(ledger, args.thread, tools=tools)
    if args.json:
        print(json.dumps(_reconciled_json(results), indent=2, default=str))
    else:
        _render_reconciled(_console(), results)
    return 0


def cmd_compensate(args: argparse.Namespace) -> int:
    from langgraph_cancel.api import compensate
    from langgraph_cancel.errors import ThreadBusyError
    from langgraph_cancel.runtime import WORKER_ID

    tools = tools_of(load_object(args.graph))
    with open_ledger(args.db) as ledger:
        _require_thread(ledger, args.thread)
        try:
            ledger.acquire_lease(args.thread, WORKER_ID, ttl=120.0)
        except ThreadBusyError as exc:
            raise CliError(f"{exc}; compensate once it has stopped") from exc
        try:
            done = compensate(ledger, args.thread, tools=tools)
        finally:
            ledger.release_lease(args.thread, WORKER_ID)
    if args.json:
        print(json.dumps([_effect_json(e) for e in done], indent=2, default=str))
        return 0
    console = _console()
    if not done:
        console.print(
            "Nothing to compensate: no committed reversible effect with a known "
            "compensating action."
        )
        return 0
    table = Table(
        title=f"Compensation of thread {escape(args.thread)} (newest first)", title_justify="left"
    )
    for col in ("tool call", "status", "error"):
        table.add_column(col, overflow="fold")
    for e in done:
        table.add_row(
            escape(call_label(e.tool, e.args)), _status_text(e.status.value), escape(e.error or "")
        )
    console.print(table)
    failed = [e for e in done if e.status is not EffectStatus.COMPENSATED]
    return 1 if failed else 0


def cmd_resume(args: argparse.Namespace) -> int:
    from langgraph.types import Command

    from langgraph_cancel.api import get_report
    from langgraph_cancel.recovery import reconcile

    url = normalize_url(args.db)
    if url.startswith("memory"):
        raise CliError("memory:// keeps nothing between processes: there is nothing to resume")
    builder = builder_of(load_object(args.graph))
    settings = getattr(builder, "cancellation", None)
    if settings is None:
        raise CliError("--graph was not prepared with add_cancellation(builder)")
    settings.ledger = None  # the saver on --db owns the ledger here
    tools = tools_of(builder)
    console = _console(stderr=args.json)
    with open_saver(args.db) as saver:
        _require_thread(saver.ledger, args.thread)
        if args.force:
            held = saver.ledger.lease(args.thread)
            if held is not None and _lease_live(held):
                # The operator knows its worker is gone (kill -9, lost host): break the
                # lease now instead of waiting out its TTL.
                saver.ledger.release_lease(args.thread, held.owner)
                console.print(
                    f"Broke the live lease of {escape(held.owner)} on thread "
                    f"{escape(args.thread)} (--force)."
                )
        settled = reconcile(saver.ledger, args.thread, tools=tools)
        if any(r.busy for r in settled):
            busy = settled[0]
            raise CliError(
                f"thread {args.thread!r} is being run by {busy.busy} (lease until "
                f"{busy.busy_until}): it cannot be resumed twice (if that worker is "
                "dead, --force takes the thread over now)"
            )
        if not args.json and any(r.effects for r in settled):
            _render_reconciled(console, settled)
        graph = builder.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": args.thread}}
        snapshot = graph.get_state(config)
        run_before = saver.ledger.require_latest_run(args.thread)
        saved = snapshot.created_at is not None
        if not saved or (not snapshot.next and not snapshot.interrupts and run_before.terminal):
            message = (
                f"nothing to resume: run {run_before.run_id} is {run_before.status.value}"
                if saved
                else f"nothing to resume: thread {args.thread!r} has no saved checkpoint (its "
                "worker stopped before writing the first one); the ledger's effects were "
                "reconciled, and new input on the thread starts it again"
            )
            if args.json:
                print(
                    json.dumps(
                        {
                            "thread_id": args.thread,
                            "resumed": False,
                            "message": message,
                            "run": run_before.model_dump(mode="json", exclude={"report"}),
                        },
                        indent=2,
                    )
                )
            else:
                console.print(message)
            return 0
        value: Any = None
        if args.resume_value is not None:
            try:
                value = Command(resume=json.loads(args.resume_value))
            except json.JSONDecodeError as exc:
                raise CliError(f"--resume-value is not JSON: {exc}") from exc
        if not args.json:
            with Status(f"resuming thread {args.thread}…", console=console):
                graph.invoke(value, config)
        else:
            graph.invoke(value, config)
        after = graph.get_state(config)
        run = saver.ledger.require_latest_run(args.thread)
        interrupts = [i.value for i in after.interrupts]
        report = get_report(saver.ledger, args.thread) if run.cancel_requested else None
        messages = after.values.get("messages", []) if isinstance(after.values, dict) else []
    last = messages[-1].content if messages else None
    if args.json:
        print(
            json.dumps(
                {
                    "thread_id": args.thread,
                    "resumed": True,
                    "run": run.model_dump(mode="json", exclude={"report"}),
                    "interrupts": interrupts,
                    "last_message": last,
                    "report": None if report is None else report.model_dump(mode="json"),
                },
                indent=2,
                default=str,
            )
        )
        return 0
    console.print(Text.assemble("Run ", run.run_id, " is now ", _status_text(run.status.value)))
    for item in interrupts:
        console.print(
            Text("Waiting for an answer: ", style="bold yellow") + Text(_short(item, 400))
        )
    if interrupts:
        console.print(
            f"Answer with `{PROG} resume {args.thread} --resume-value JSON{_db_flag(args)}`."
        )
    if report is not None:
        render_report(console, report)
    elif last:
        console.print(Text("Last message: ", style="bold") + Text(str(last)))
    return 0


# -------------------------------------------------------------------- demo
class _Watcher(threading.Thread):
    """Another thread watching the ledger as a user would, and pressing stop."""

    def __init__(
        self,
        ledger: Ledger,
        thread_id: str,
        step: Any,
        started: threading.Event,
        say: Callable[[Text], None],
        status: Status | None,
        demo: Any,
    ) -> None:
        super().__init__(name="langgraph-cancel-demo-stop", daemon=True)
        self.ledger = ledger
        self.thread_id = thread_id
        self.step = step
        self.started = started
        self.say = say
        self.status = status
        self.demo = demo
        self.done = threading.Event()
        self.pressed_at: float | None = None
        self.error: BaseException | None = None
        self._seen: dict[str, str] = {}

    def run(self) -> None:
        try:
            while not self.done.is_set():
                self._tick()
                self.done.wait(0.02)
            self._tick()
        except BaseException as exc:  # shown by the main thread
            self.error = exc

    def _tick(self) -> None:
        from langgraph_cancel.api import request_cancel

        try:
            effects = self.ledger.effects(self.thread_id)
        except Exception:
            return
        for e in effects:
            if self._seen.get(e.effect_id) == e.status.value:
                continue
            self._seen[e.effect_id] = e.status.value
            mark = {
                "dispatched": "→",
                "committed": "✓",
                "dropped": "✗",
                "unknown": "?",
                "failed": "✗",
            }.get(e.status.value, "·")
            self.say(
                Text.assemble(
                    f"  {mark} ",
                    (call_label(e.tool, e.args), "bold"),
                    "  ",
                    _status_text(e.status.value),
                    (
                        "  (in flight: the request has left the process)"
                        if e.status is EffectStatus.DISPATCHED
                        else ""
                    ),
                )
            )
        if self.pressed_at is not None or self.done.is_set():
            return
        hit = self.demo.trigger(self.step, effects)
        if hit is None and not (self.step.name == "plan" and self.started.is_set()):
            return
        result = request_cancel(
            self.ledger, self.thread_id, reason="user pressed stop", requested_by="demo user"
        )
        self.pressed_at = time.monotonic()
        self.say(
            Text.assemble(("■ STOP pressed ", "bold red"), f"{self.step.when} ({result.message})")
        )
        if self.status is not None and hit is not None and hit.status is EffectStatus.DISPATCHED:
            self.status.update(
                f"stop requested; waiting for {call_label(hit.tool, hit.args)} to finish (the "
                "request has left the process: its outcome is awaited, never abandoned)…"
            )
        elif self.status is not None:
            self.status.update("stop requested; draining the run…")


def _import_example(name: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module('langgraph_cancel.demo.' + ('scenario' if name == 'demo' else name))
    except ImportError as exc:
        raise CliError(
            "the demo needs the refund-agent example (examples/refund_agent in the "
            f"repository): install from a checkout with `pip install -e .` ({exc})"
        ) from exc


def _describe_update(chunk: Mapping[str, Any]) -> list[Text]:
    lines: list[Text] = []
    for node, update in chunk.items():
        if node == "agent" and isinstance(update, dict):
            for m in update.get("messages", []):
                calls = getattr(m, "tool_calls", None) or []
                if calls:
                    names = ", ".join(c["name"] for c in calls)
                    lines.append(
                        Text.assemble(
                            ("model", "bold cyan"), f": plans {len(calls)} call(s): {names}"
                        )
                    )
                else:
                    lines.append(
                        Text.assemble(
                            ("model", "bold cyan"), ": ", _short(getattr(m, "content", ""), 120)
                        )
                    )
        elif node == "cancel":
            lines.append(
                Text.assemble(
                    ("cancel node", "bold red"),
                    ": queue drained, in-flight calls settled, run cancelled",
                )
            )
    return lines


def cmd_demo(args: argparse.Namespace) -> int:
    from langgraph_cancel.api import get_report

    graph_mod = _import_example("graph")
    demo = _import_example("demo")
    tools_mod = _import_example("tools")
    step = demo.STEPS[args.cancel_at]
    thread = args.thread
    quiet = args.json
    err = _console(stderr=True)
    out = _console()
    providers_path = os.path.abspath(args.providers_db)
    providers = demo.reset_providers(providers_path)
    tools_mod.set_providers_path(providers_path)
    demo.arm(step, providers, args.hang)
    url = normalize_url(args.db)

    def say(line: Text) -> None:
        if not quiet:
            err.print(line)

    if not quiet:
        err.print(
            Text.assemble(
                ("langgraph-cancel demo", "bold"),
                f": the seed scenario on thread {thread!r}, stop pressed "
                f"{step.when} ({args.cancel_at})",
            )
        )
        err.print(f"  agent database: {_redact(url)}; providers' truth: {providers_path}")
    with open_saver(args.db, create=True) as saver:
        ledger: Ledger = saver.ledger
        lease = ledger.lease(thread)
        if lease is not None:
            ledger.release_lease(thread, lease.owner)
        saver.delete_thread(thread)
        for key in demo.refund_keys(step):
            holder = ledger.effect_by_key(key)
            if holder is not None and holder.thread_id != thread:
                raise CliError(
                    f"this database already holds the demo's refund key {key!r} on thread "
                    f"{holder.thread_id!r}: run the demo with --thread {holder.thread_id} "
                    "or another --db"
                )
        started = threading.Event()
        graph = graph_mod.build_builder(demo.demo_model(step, started)).compile(checkpointer=saver)
        watch_ledger = ledger if url.startswith("memory") else Ledger.from_url(url)
        status = None if quiet else Status("running the refund agent…", console=err)
        watcher = _Watcher(watch_ledger, thread, step, started, say, status, demo)
        config: Any = {"configurable": {"thread_id": thread}}
        try:
            if status is not None:
                status.start()
            watcher.start()
            inputs: Any = graph_mod.seed_input()
            while True:
                for mode, chunk in graph.stream(inputs, config, stream_mode=["updates", "custom"]):
                    if mode == "updates" and isinstance(chunk, dict):
                        for line in _describe_update(chunk):
                            say(line)
                run = ledger.require_latest_run(thread)
                if run.terminal or not graph.get_state(config).interrupts:
                    break
                # Paused at the approval gate. Nobody approves in the demo: wait for the
                # stop, then resume the thread so the cancel finishes (pending calls dropped).
                say(
                    Text.assemble(
                        ("approval gate", "bold yellow"), ": the run is paused for a human decision"
                    )
                )
                deadline = time.monotonic() + 30
                while not ledger.get_run(run.run_id).cancel_requested:
                    if time.monotonic() > deadline:
                        raise CliError("the demo paused for approval and stop was never pressed")
                    time.sleep(0.02)
                say(Text("resuming the paused thread to finish the cancel"))
                inputs = None
        finally:
            watcher.done.set()
            watcher.join(timeout=10)
            if status is not None:
                status.stop()
            if watch_ledger is not ledger:
                watch_ledger.close()
        if watcher.error is not None:
            raise CliError(f"the stop button failed: {watcher.error}")
        report = get_report(ledger, thread)
    check = demo.check_truth(report, providers.truth())
    if quiet:
        print(report.model_dump_json(indent=2))
        return 0 if check.agrees else 1
    out.print()
    render_report(out, report)
    out.print(Text(check.line, style="green" if check.agrees else "bold red"))
    flag = _db_flag(args)
    out.print(
        f"Inspect it: `{PROG} status {thread}{flag}`, `{PROG} effects {thread} --history{flag}`, "
        f"`python -m langgraph_cancel.demo.services truth --db {providers_path}`"
    )
    return 0 if check.agrees else 1


# ------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    """The ``langgraph-cancel`` argument parser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Make LangGraph agents safe to stop and resume: demo, inspect, cancel, "
        "reconcile and resume threads.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        default=default_db_url(),
        metavar="URL",
        help=f"sqlite:///file.db, a file path, or postgresql://... (default: ${ENV_DB} or "
        f"{default_db_url()})",
    )
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON for programs")
    graph_opt = argparse.ArgumentParser(add_help=False)
    graph_opt.add_argument(
        "--graph",
        default=DEFAULT_GRAPH,
        metavar="MODULE:ATTR",
        help=f"the graph (or builder, factory, or list of tools) whose tools' hooks to use "
        f"(default: {DEFAULT_GRAPH})",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        parents=[common, as_json],
        help="run the seed scenario, press stop mid-run, print the report",
        description="Run the refund agent of the seed scenario with fake providers, press stop "
        "from another thread (through the ledger) and print the cancellation report and how "
        "it compares with what the providers actually did. Steps: update (default): while "
        "update_order(o-88) is in flight with four calls queued; refund: while the refund is in "
        "flight; email: while the email to the customer is in flight; plan: while the model "
        "streams turn 2 (the stream is closed); approval: while a 120.00 refund waits at the "
        "approval gate; none: never (the run completes).",
    )
    demo.add_argument(
        "--cancel-at",
        default="update",
        choices=["update", "refund", "email", "plan", "approval", "none"],
        metavar="STEP",
        help="when to press stop: update (default), refund, email, plan, approval, none",
    )
    demo.add_argument(
        "--providers-db",
        default=os.environ.get("REFUND_AGENT_PROVIDERS_DB") or "refund-providers.db",
        metavar="PATH",
        help="the fake providers' SQLite file, reset by each demo "
        "(default: $REFUND_AGENT_PROVIDERS_DB or ./refund-providers.db)",
    )
    demo.add_argument("--thread", default="refund-demo", help="thread id (default refund-demo)")
    demo.add_argument(
        "--hang",
        type=float,
        default=1.5,
        metavar="SECONDS",
        help="how long the in-flight request takes (default 1.5)",
    )
    demo.set_defaults(func=cmd_demo)

    status = sub.add_parser(
        "status",
        parents=[common, as_json],
        help="run lifecycle, cancel request and next step of a thread",
    )
    status.add_argument("thread")
    status.set_defaults(func=cmd_status)

    effects = sub.add_parser(
        "effects", parents=[common, as_json], help="the effect records of a thread"
    )
    effects.add_argument("thread")
    effects.add_argument("--history", action="store_true", help="add each effect's audit trail")
    effects.set_defaults(func=cmd_effects)

    cancel = sub.add_parser(
        "cancel", parents=[common, as_json], help="ask a thread's live run to stop"
    )
    cancel.add_argument("thread")
    cancel.add_argument("--reason", default="requested from the command line")
    try:
        user = getpass.getuser()
    except Exception:  # pragma: no cover - no user database
        user = "cli"
    cancel.add_argument("--by", default=f"{user} (cli)", metavar="WHO")
    cancel.set_defaults(func=cmd_cancel)

    report = sub.add_parser(
        "report", parents=[common, as_json], help="the cancellation report of a thread's latest run"
    )
    report.add_argument("thread")
    report.add_argument("--run", default=None, help="a run id (default: the latest run)")
    report.add_argument(
        "--now",
        action="store_true",
        help="rebuild the report from the ledger as it is now (a cancelled "
        "run's stored report is frozen at its cancel)",
    )
    report.set_defaults(func=cmd_report)

    comp = sub.add_parser(
        "compensate",
        parents=[common, as_json, graph_opt],
        help="undo a thread's committed reversible effects, newest first",
    )
    comp.add_argument("thread")
    comp.set_defaults(func=cmd_compensate)

    resume = sub.add_parser(
        "resume",
        parents=[common, as_json, graph_opt],
        help="reconcile, then continue a thread from its last checkpoint",
    )
    resume.add_argument("thread")
    resume.add_argument(
        "--resume-value",
        default=None,
        metavar="JSON",
        help="answer a pending interrupt with Command(resume=JSON)",
    )
    resume.add_argument(
        "--force",
        action="store_true",
        help="take the thread over even if its lease is live: only when you know its "
        "worker is dead (kill -9, lost host), instead of waiting for the lease to expire",
    )
    resume.set_defaults(func=cmd_resume)

    rec = sub.add_parser(
        "reconcile",
        parents=[common, as_json, graph_opt],
        help="settle unknown and in-flight effects through reconcile hooks",
    )
    rec.add_argument("thread", nargs="?")
    rec.add_argument(
        "--all",
        action="store_true",
        help="every thread that needs it, after reaping expired leases",
    )
    rec.set_defaults(func=cmd_reconcile)
    return parser


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    if isinstance(exc, CliError | LangGraphCancelError):
        return first
    return f"{type(exc).__name__}: {first}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``langgraph-cancel`` console script.

    Returns:
        The exit code: 0 on success, 1 on an error (one line on stderr).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `langgraph-cancel effects T | head`: stop quietly
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (
        CliError,
        InvalidURLError,
        UnknownThreadError,
        ConfigurationError,
        LangGraphCancelError,
        sqlite3.Error,
        OSError,
        ValueError,
    ) as exc:
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

"""``reconcile``, ``compensate`` and ``resume``: settling and continuing a thread.

Each loads the agent named by ``--graph`` for its tools' hooks (so each
imports LangGraph and the agent's own code).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from langgraph_cancel.cli import render
from langgraph_cancel.cli.config import Database, resolve_database
from langgraph_cancel.cli.database import open_ledger, open_saver
from langgraph_cancel.cli.inspection import effect_json, run_json
from langgraph_cancel.errors import CommandLineError, ThreadBusyError
from langgraph_cancel.types import RunRecord, RunStatus
from langgraph_cancel.workers import lease_is_live

if TYPE_CHECKING:
    from langgraph_cancel.agents import GuardedAgent
    from langgraph_cancel.ledger import Ledger
    from langgraph_cancel.report import CancellationReport

#: How long ``compensate`` holds the thread's lease while it undoes effects, in seconds.
COMPENSATE_LEASE_TTL = 120.0


# ------------------------------------------------------------------ the graph
def load_object(spec: str) -> Any:
    """What ``module:attr`` or ``path/to/file.py:attr`` names (``attr`` may be dotted).

    The working directory is importable, as it is for ``python -m``.

    Raises:
        CommandLineError: The module or file cannot be imported, or has no such attribute.
    """
    module_name, _, attr = spec.rpartition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = Path(module_name).resolve()
            if not path.is_file():
                raise CommandLineError(f"--graph: no file {path}")
            found = importlib.util.spec_from_file_location(path.stem, path)
            if found is None or found.loader is None:
                raise CommandLineError(f"--graph: cannot import {path}")
            module = importlib.util.module_from_spec(found)
            sys.modules.setdefault(path.stem, module)
            found.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandLineError(f"--graph: cannot import {module_name!r}: {exc}") from exc
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise CommandLineError(f"--graph: {module_name!r} has no attribute {attr!r}")
        value = getattr(value, part)
    return value


def builder_of(value: Any) -> Any:
    """The ``StateGraph`` behind a compiled graph, a builder, or a factory of either.

    Raises:
        CommandLineError: ``value`` is none of these.
    """
    from langgraph.graph import StateGraph
    from langgraph.graph.state import CompiledStateGraph

    if isinstance(value, CompiledStateGraph):
        return value.builder
    if isinstance(value, StateGraph):
        return value
    if callable(value):
        return builder_of(value())
    raise CommandLineError(
        "--graph must name a StateGraph, a compiled graph or a function returning one, "
        f"not {type(value).__name__}"
    )


def tools_of(value: Any) -> dict[str, Any]:
    """The tools (with their hooks) of a graph, a builder or a list of tools, by name."""
    from langchain_core.tools import BaseTool
    from langgraph.prebuilt import ToolNode

    if isinstance(value, BaseTool):
        return {value.name: value}
    if isinstance(value, list | tuple) and all(isinstance(t, BaseTool) for t in value):
        return {t.name: t for t in value}
    builder = builder_of(value)
    tools: dict[str, Any] = {}
    for node in builder.nodes.values():
        if isinstance(node.runnable, ToolNode):
            tools.update(node.runnable.tools_by_name)
    settings = getattr(builder, "cancellation", None)
    if settings is not None:
        tools.update(settings.tools)
    return tools


# ------------------------------------------------------------------ commands
def _reconciled_json(results: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {
            "thread_id": r.thread_id,
            "busy": r.busy,
            "busy_until": r.busy_until,
            "reaped_lease_of": r.reaped,
            "kept_lease": r.kept_lease,
            "effects": [{**effect_json(s.effect), "before": s.before.value} for s in r.effects],
            "still_unknown": [e.effect_id for e in r.still_unknown],
        }
        for r in results
    ]


def reconcile(args: argparse.Namespace) -> int:
    """``langgraph-cancel reconcile [THREAD | --all]``."""
    from langgraph_cancel.nodes.reconcile import reconcile as settle

    if (args.thread is None) == (not args.all):
        raise CommandLineError("reconcile wants a THREAD or --all (not both)")
    db = resolve_database(args.db)
    tools = tools_of(load_object(args.graph))
    with open_ledger(db) as ledger:
        if args.thread is not None:
            ledger.require_latest_run(args.thread)
        results = settle(ledger, args.thread, tools=tools)
    if args.json:
        render.print_json(_reconciled_json(results))
    else:
        render.render_reconciled(render.console(), results)
    return 0


def compensate(args: argparse.Namespace) -> int:
    """``langgraph-cancel compensate THREAD``: exit 1 when an undo failed."""
    from langgraph_cancel.api import compensate as undo
    from langgraph_cancel.errors import ThreadBusyError
    from langgraph_cancel.runtime import worker_id
    from langgraph_cancel.types import EffectStatus

    db = resolve_database(args.db)
    tools = tools_of(load_object(args.graph))
    with open_ledger(db) as ledger:
        ledger.require_latest_run(args.thread)
        worker = worker_id()
        try:
            ledger.acquire_lease(args.thread, worker, ttl=COMPENSATE_LEASE_TTL)
        except ThreadBusyError as exc:
            raise CommandLineError(f"{exc}; compensate once it has stopped") from exc
        try:
            done = undo(ledger, args.thread, tools=tools)
        finally:
            ledger.release_lease(args.thread, worker)
    if args.json:
        render.print_json([effect_json(e) for e in done])
    else:
        render.render_compensated(render.console(), args.thread, done)
    failed = [e for e in done if e.status is not EffectStatus.COMPENSATED]
    return 1 if failed else 0


@dataclass(frozen=True, slots=True)
class Resumed:
    """Where a resumed thread stands once its graph has run on.

    Attributes:
        run: The thread's latest run.
        interrupts: The values of the interrupts it waits on.
        report: The cancellation report, when a stop was asked for.
        last_message: The content of the last message in the state, if any.
    """

    run: RunRecord
    interrupts: list[Any]
    report: CancellationReport | None
    last_message: Any


def _resumable_agent(args: argparse.Namespace, db: Database) -> GuardedAgent:
    """The ``--graph`` agent, to compile on the saver on ``--db``."""
    from langgraph_cancel.agents import guarded_agent

    if db.url.is_memory:
        raise CommandLineError(
            "memory:// keeps nothing between processes: there is nothing to resume"
        )
    agent = guarded_agent(load_object(args.graph))
    if agent is None:
        raise CommandLineError(
            "--graph must be prepared with add_cancellation(builder), or be a "
            "create_agent agent with EffectMiddleware"
        )
    if agent.middleware is None:
        agent.settings.ledger = None  # the saver on --db owns the ledger here
    return agent


def _force_take_over(ledger: Ledger, thread_id: str, out: Console) -> None:
    """``--force``: break a live lease whose worker the operator knows is gone."""
    from langgraph_cancel.nodes.reconcile import RECONCILE_LEASE_TTL as LEASE_TTL
    from langgraph_cancel.runtime import worker_id

    held = ledger.lease(thread_id)
    if held is not None and lease_is_live(held):
        # The operator knows its worker is gone (a lost host): take the lease
        # now instead of waiting out its TTL, with the takeover in the audit.
        ledger.break_lease(thread_id, worker_id(), ttl=LEASE_TTL)
        render.line(out, f"Broke the live lease of {held.owner} on thread {thread_id} (--force).")


def _settle_first(
    ledger: Ledger, thread_id: str, tools: dict[str, Any], out: Console, *, quiet: bool
) -> None:
    """Reconcile the thread before it runs on; refuse a thread another worker runs."""
    from langgraph_cancel.nodes.reconcile import reconcile as settle

    settled = settle(ledger, thread_id, tools=tools)
    busy = next((result for result in settled if result.busy), None)
    if busy is not None:
        raise CommandLineError(
            f"thread {thread_id!r} is being run by {busy.busy} (lease until "
            f"{busy.busy_until}): it cannot be resumed twice (if that worker is dead, "
            "--force takes the thread over now)"
        )
    if not quiet and any(result.effects for result in settled):
        # The run on, next, closes a stopped thread whose lease the settling kept.
        render.render_reconciled(out, settled, kept=False)


def _nothing_to_resume(snapshot: Any, before: RunRecord, thread_id: str) -> str | None:
    """Why the thread has nothing to run on, or ``None`` when it has.

    A saved step has something to run on while it has tasks: those still to run
    (``next``), and those that finished with their writes saved while the step's own
    checkpoint was not (LangGraph's state lists them in ``tasks``, not in ``next``;
    running on applies their writes).
    """
    saved = snapshot.created_at is not None
    if saved and (snapshot.tasks or snapshot.interrupts or not before.terminal):
        return None
    if saved:
        return f"nothing to resume: run {before.run_id} is {before.status.value}"
    return (
        f"nothing to resume: thread {thread_id!r} has no saved checkpoint (its "
        "worker stopped before writing the first one); the ledger's effects were "
        "reconciled, and new input on the thread starts it again"
    )


def _close_stopped(
    saver: Any, graph: Any, agent: GuardedAgent, run: RunRecord, thread_id: str
) -> bool:
    """Close a cancelled run's thread that has nothing to run on but whose state lacks
    what the cancel node leaves (its worker's last write was lost); True if closed.

    Raises:
        CommandLineError: Another worker holds the thread, or the close failed.
    """
    from langgraph_cancel.nodes.reconcile import RECONCILE_LEASE_TTL as LEASE_TTL
    from langgraph_cancel.runtime import worker_id
    from langgraph_cancel.sweep_threads import CloseOutcome, SweptThreads

    ledger: Ledger = saver.ledger
    threads = SweptThreads(saver, graph, worker_id(), agent.settings, ledger)
    if run.status is not RunStatus.CANCELLED or not threads.left_open(thread_id, run):
        return False
    try:
        ledger.acquire_lease(thread_id, threads.owner, ttl=LEASE_TTL)
    except ThreadBusyError as exc:
        raise CommandLineError(f"thread {thread_id!r} is being run by {exc.owner}") from exc
    try:
        outcome = threads.close(thread_id, run.report)
    finally:
        ledger.release_lease(thread_id, threads.owner)
    if outcome is CloseOutcome.FAILED:
        raise CommandLineError(f"could not close thread {thread_id!r} (logged); try again")
    return outcome is CloseOutcome.CLOSED


def _run_on(graph: Any, ledger: Ledger, args: argparse.Namespace, out: Console) -> Resumed:
    """Invoke the graph from its checkpoint (answering the interrupt, if asked to)."""
    from langgraph.types import Command

    from langgraph_cancel.api import get_report

    config: Any = {"configurable": {"thread_id": args.thread}}
    value: Command[Any] | None = (
        None if args.resume_value is None else Command(resume=args.resume_value)
    )
    if args.json or not out.is_terminal:
        graph.invoke(value, config)
    else:
        with out.status(f"resuming thread {args.thread}…"):
            graph.invoke(value, config)
    after = graph.get_state(config)
    run = ledger.require_latest_run(args.thread)
    report = get_report(ledger, args.thread) if run.cancel_requested else None
    messages = after.values.get("messages", []) if isinstance(after.values, dict) else []
    return Resumed(
        run=run,
        interrupts=[interrupt.value for interrupt in after.interrupts],
        report=report,
        last_message=messages[-1].content if messages else None,
    )


def resume(args: argparse.Namespace) -> int:
    """``langgraph-cancel resume THREAD``: reconcile, then continue from the last checkpoint."""
    db = resolve_database(args.db)
    agent = _resumable_agent(args, db)
    tools = tools_of(agent.graph)
    out = render.console(stderr=args.json)
    with open_saver(db) as saver:
        ledger = saver.ledger
        ledger.require_latest_run(args.thread)
        if args.force:
            _force_take_over(ledger, args.thread, out)
        _settle_first(ledger, args.thread, tools, out, quiet=args.json)
        graph = agent.compile_on(saver)
        snapshot = graph.get_state({"configurable": {"thread_id": args.thread}})
        before = ledger.require_latest_run(args.thread)
        message = _nothing_to_resume(snapshot, before, args.thread)
        if message is not None and _close_stopped(saver, graph, agent, before, args.thread):
            message = (
                f"closed thread {args.thread}: run {before.run_id} is cancelled, and its "
                "calls are answered and its report written, as the cancel node leaves them"
            )
        if message is not None:
            if args.json:
                render.print_json(
                    {
                        "thread_id": args.thread,
                        "resumed": False,
                        "message": message,
                        "run": run_json(before),
                    }
                )
            else:
                render.line(out, message)
            return 0
        resumed = _run_on(graph, ledger, args, out)
    if args.json:
        render.print_json(
            {
                "thread_id": args.thread,
                "resumed": True,
                "run": run_json(resumed.run),
                "interrupts": resumed.interrupts,
                "last_message": resumed.last_message,
                "report": None
                if resumed.report is None
                else resumed.report.model_dump(mode="json"),
            }
        )
        return 0
    render.render_resumed(
        out,
        resumed.run,
        interrupts=resumed.interrupts,
        report=resumed.report,
        last_message=resumed.last_message,
        thread_id=args.thread,
        db_flag=db.flag,
    )
    return 0


__all__ = [
    "COMPENSATE_LEASE_TTL",
    "Resumed",
    "builder_of",
    "compensate",
    "load_object",
    "reconcile",
    "resume",
    "tools_of",
]

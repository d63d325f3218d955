"""``langgraph-cancel sweep``: settle what dead workers left, once or ``--watch``.

It loads the agent named by ``--graph`` for its tools' reconcile and compensate
hooks (as ``reconcile --all`` does) and, when it names an agent the package guards
(prepared with ``add_cancellation``, or a ``create_agent`` agent with
``EffectMiddleware``), to close the threads of the stops it finishes; it runs
:class:`langgraph_cancel.sweeper.Sweeper` passes on ``--db``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from langgraph_cancel.cli import render
from langgraph_cancel.cli.config import DEFAULT_GRAPH, resolve_database
from langgraph_cancel.cli.database import open_saver
from langgraph_cancel.cli.recovery import load_object, tools_of
from langgraph_cancel.errors import CommandLineError


def _guarded(value: Any) -> Any:
    """The agent ``--graph`` names, when the package guards it (an ``add_cancellation``
    graph's ledger left to the saver on ``--db``, as ``resume`` leaves it); else None
    (a list of tools)."""
    from langgraph_cancel.agents import guarded_agent

    if isinstance(value, list | tuple):
        return None
    agent = guarded_agent(value)
    if agent is None:
        return None
    if agent.middleware is None:
        agent.settings.ledger = None
    return agent.graph


def run(args: argparse.Namespace) -> int:
    """``langgraph-cancel sweep [--watch] [--interval S] [--max-threads N]``."""
    from langgraph_cancel.sweeper import Sweeper, SweepSummary

    db = resolve_database(args.db)
    if db.url.is_memory:
        raise CommandLineError(
            "memory:// keeps nothing between processes: there is nothing to sweep"
        )
    agent = load_object(args.graph)
    tools = tools_of(agent)
    graph = _guarded(agent)
    out = render.console()

    def show(summary: SweepSummary) -> None:
        if args.json:
            # One JSON document per pass, one per line, so ``--watch`` can be piped.
            print(json.dumps(summary.to_json(), default=str), flush=True)
            return
        counts = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in summary.counts.items() if n)
        render.line(
            out,
            (f"Sweep pass at {summary.started_at:%H:%M:%S}", "bold"),
            f": {summary.threads_examined} thread(s) in {summary.duration_s:.2f}s; "
            f"{counts or 'nothing to do'}{' (more next pass)' if summary.truncated else ''}.",
        )
        for action in summary.actions:
            text = f"{action.thread_id}: {action.kind.value.replace('_', ' ')}: {action.detail}"
            if action.next_action:
                text += f". Next: {action.next_action}"
            render.line(out, text, indent=2)

    with open_saver(db) as saver:
        sweeper = Sweeper(
            saver,
            tools=tools,
            # The demo's agent, the default, lends its tools; it never runs a user's thread.
            graph=graph if args.graph != DEFAULT_GRAPH else None,
            max_threads=args.max_threads,
            cancel_grace=args.cancel_grace,
        )
        if not args.watch:
            show(sweeper.sweep_once())
            return 0
        try:
            for summary in sweeper.run(interval=args.interval):
                show(summary)
        except KeyboardInterrupt:
            return 0
    return 0


__all__ = ["run"]

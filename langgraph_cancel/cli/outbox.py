"""``outbox``: send the calls held for a delay window once it has passed.

Loads the agent named by ``--graph`` for its tools (the outbox calls them).
"""

from __future__ import annotations

import argparse
import signal
import threading
from types import FrameType

from langgraph_cancel.cli import render
from langgraph_cancel.cli.config import resolve_database
from langgraph_cancel.cli.database import open_ledger
from langgraph_cancel.cli.inspection import effect_json
from langgraph_cancel.cli.recovery import load_object, tools_of


def run(args: argparse.Namespace) -> int:
    """``langgraph-cancel outbox [--watch]``: one drain, or drain until SIGINT/SIGTERM."""
    from langgraph_cancel.outbox import Outbox

    db = resolve_database(args.db)
    tools = tools_of(load_object(args.graph))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if args.watch:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    out = render.console(stderr=args.json)
    moved: list[dict[str, object]] = []
    with open_ledger(db) as ledger:
        outbox = Outbox(ledger, tools, stale_after=args.stale_after)
        while True:
            result = outbox.drain()
            for label, effects in (
                ("sent", result.sent),
                ("resent", result.resent),
                ("permanent", result.made_permanent),
            ):
                for effect in effects:
                    moved.append({"action": label, **effect_json(effect)})
                    if not args.json:
                        render.line(
                            out,
                            f"{label}: {effect.tool} {effect.effect_id} -> {effect.status.value}",
                        )
            if not args.watch or stop.wait(args.interval):
                break
    if args.json:
        render.print_json(moved)
    elif not moved:
        render.line(out, "Nothing due in the outbox.")
    return 0


__all__ = ["run"]

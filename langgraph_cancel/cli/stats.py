"""``stats``: the seed's six numbers of cancellation across the runs of a window.

Reads the ledger only (no LangGraph import); the numbers are those of
:mod:`langgraph_cancel.metrics`, the same the OpenTelemetry export records.
"""

from __future__ import annotations

import argparse

from langgraph_cancel.cli import render
from langgraph_cancel.cli.config import resolve_database
from langgraph_cancel.cli.database import open_ledger
from langgraph_cancel.cli.render.stats import render_stats


def run(args: argparse.Namespace) -> int:
    """``langgraph-cancel stats [--since DURATION|ISO] [--json] [--db URL]``."""
    from langgraph_cancel.metrics import read_stats

    db = resolve_database(args.db)
    with open_ledger(db) as ledger:
        stats = read_stats(ledger, since=args.since)
    if args.json:
        print(stats.model_dump_json(indent=2))
        return 0
    render_stats(render.console(), stats)
    return 0


__all__ = ["render_stats", "run"]

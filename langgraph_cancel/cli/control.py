"""``cancel``: ask a thread's live run to stop, from any process that reaches its database.

It writes the request to the ledger and returns: the run's worker sees it at
its next check. Only the ledger is imported, so it answers at once.
"""

from __future__ import annotations

import argparse

from langgraph_cancel.cli import render
from langgraph_cancel.cli.config import resolve_database
from langgraph_cancel.cli.database import open_ledger
from langgraph_cancel.cli.inspection import lease_live


def cancel(args: argparse.Namespace) -> int:
    """``langgraph-cancel cancel THREAD [--reason R] [--by WHO]``."""
    db = resolve_database(args.db)
    with open_ledger(db) as ledger:
        result = ledger.request_cancel(args.thread, reason=args.reason, requested_by=args.by)
        lease = ledger.lease(args.thread)
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    render.render_cancel(
        render.console(),
        result,
        worker=lease.owner if lease is not None and lease_live(lease) else None,
        thread_id=args.thread,
        db_flag=db.flag,
    )
    return 0


__all__ = ["cancel"]

"""``cancel``: ask a thread's live run to stop, from any process that reaches its database.

It writes the request to the ledger and returns: the run's worker sees it at
its next check. With ``--follow`` it then reads the stop's progress from the
ledger (:mod:`langgraph_cancel.follow`) until the run is cancelled, and prints
its report. Only the ledger is imported, so it answers at once.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from langgraph_cancel.cli import render
from langgraph_cancel.cli.config import PROG, Database, resolve_database
from langgraph_cancel.cli.database import open_ledger
from langgraph_cancel.errors import CommandLineError, FollowTimeoutError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import CancelRequestResult
from langgraph_cancel.workers import lease_is_live


def cancel(args: argparse.Namespace) -> int:
    """``langgraph-cancel cancel THREAD [--reason R] [--by WHO] [--follow [--timeout S]]``."""
    if args.timeout is not None and not args.follow:
        raise CommandLineError(f"--timeout goes with --follow (see `{PROG} cancel --help`)")
    db = resolve_database(args.db)
    with open_ledger(db) as ledger:
        result = ledger.request_cancel(args.thread, reason=args.reason, requested_by=args.by)
        lease = ledger.lease(args.thread)
        worker = lease.owner if lease is not None and lease_is_live(lease) else None
        if args.follow and result.accepted and result.run_id is not None:
            return _follow(ledger, db, args, result, worker)
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    render.render_cancel(
        render.console(), result, worker=worker, thread_id=args.thread, db_flag=db.flag
    )
    return 0


def _follow(
    ledger: Ledger,
    db: Database,
    args: argparse.Namespace,
    result: CancelRequestResult,
    worker: str | None,
) -> int:
    """Print each step of the stop as the ledger records it, then the report."""
    from langgraph_cancel.follow import follow
    from langgraph_cancel.progress import ProgressKind
    from langgraph_cancel.report import CancellationReport

    assert result.run_id is not None
    out: Console | None = None
    if not args.json:
        out = render.console()
        render.render_cancel(out, result, worker=worker, thread_id=args.thread, db_flag=db.flag)
    report: CancellationReport | None = None
    try:
        for event in follow(ledger, result.run_id, timeout=args.timeout):
            if args.json:
                print(event.model_dump_json(exclude_none=True), flush=True)
            elif out is not None:
                described = render.describe_progress(event.model_dump(mode="json"))
                if described is not None:
                    render.line(out, described, hang=6)
            if event.event is ProgressKind.CANCELLED and event.report is not None:
                report = CancellationReport.model_validate(event.report)
    except FollowTimeoutError as exc:
        raise CommandLineError(
            f"{exc}: the stop is still in progress (`{PROG} status {args.thread}{db.flag}`)"
        ) from exc
    run = ledger.get_run(result.run_id)
    if report is None:
        raise CommandLineError(f"run {run.run_id} ended {run.status.value} before it saw the stop")
    if out is not None:
        out.print()
        render.render_report(out, report)
    return 0


__all__ = ["cancel"]

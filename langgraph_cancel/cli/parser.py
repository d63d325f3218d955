"""The ``langgraph-cancel`` argument parser: every command, argument and help text.

Arguments are checked here (a thread id that is empty, ``--hang -1``, a
malformed ``--db``), so a bad one is refused before anything is opened. A
refusal raises :class:`~langgraph_cancel.errors.CommandLineError` instead of
argparse's usage-and-exit-2. Each command names its handler as
``"module:function"`` inside this package, imported only when that command
runs: building the parser imports nothing heavy.
"""

from __future__ import annotations

import argparse
import getpass
import json
import math
import os
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from langgraph_cancel.cli.config import DEFAULT_GRAPH, PROG, version
from langgraph_cancel.errors import CommandLineError, InvalidURLError
from langgraph_cancel.urls import DEFAULT_DB_URL, ENV_DB, DatabaseURL, parse_database_url

#: The demo's ``--cancel-at`` steps (``langgraph_cancel.demo.scenario.STEPS``, named
#: here so that the parser does not import the demo).
DEMO_STEPS: tuple[str, ...] = (
    "update",
    "refund",
    "email",
    "plan",
    "approval",
    "budget",
    "ordered",
    "subagent",
    "window",
    "none",
)
DEMO_THREAD = "refund-demo"
DEMO_HANG = 1.5
#: ``langgraph_cancel.demo.services.ENV_PROVIDERS_DB`` and ``DEFAULT_PROVIDERS_DB``,
#: named here so that the parser does not import the demo.
ENV_PROVIDERS_DB = "REFUND_AGENT_PROVIDERS_DB"
DEFAULT_PROVIDERS_DB = "./refund-providers.db"
SHELLS: tuple[str, ...] = ("bash", "zsh")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are exceptions, not usage text and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Refuse the command line.

        Raises:
            CommandLineError: Always, with argparse's message and where to look.
        """
        raise CommandLineError(f"{message} (see `{self.prog} --help`)")


class _Version(argparse.Action):
    """``--version``: the installed version on stdout, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"{PROG} {version()}")
        parser.exit()


# ------------------------------------------------------------------ argument types
def thread_id(text: str) -> str:
    """A thread id: any text but an empty one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a thread id cannot be empty")
    return text


def seconds(text: str) -> float:
    """A duration in seconds: a finite number, zero or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"wants a number of seconds >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A whole number, one or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"wants a number >= 1, got {text!r}")
    return value


def database(text: str) -> DatabaseURL:
    """A ``--db`` value, parsed (see :mod:`langgraph_cancel.urls`)."""
    try:
        return parse_database_url(text)
    except InvalidURLError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def json_value(text: str) -> Any:
    """A JSON document (``--resume-value``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None


def graph_spec(text: str) -> str:
    """``module:attribute`` or ``path/to/file.py:attribute``."""
    module, _, attr = text.rpartition(":")
    if not module or not attr:
        raise argparse.ArgumentTypeError(
            f"wants module:attribute or path/to/file.py:attribute, got {text!r}"
        )
    return text


def non_empty(text: str) -> str:
    """Any text but an empty one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("cannot be empty")
    return text


def _default_requester() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # pragma: no cover - no user database, no $USER
        user = "someone"
    return f"{user} (cli)"


def since(text: str) -> datetime:
    """A window's start: a duration back from now (``90s``, ``30m``, ``24h``, ``7d``, ``2w``)
    or an ISO 8601 time (``2026-01-31``, ``2026-01-31T09:00:00+01:00``; UTC when no zone)."""
    found = _DURATION.fullmatch(text.strip())
    if found is not None:
        amount = float(found.group(1))
        try:
            return datetime.now(UTC) - timedelta(
                seconds=amount * _UNIT_SECONDS[found.group(2).lower()]
            )
        except OverflowError:
            raise argparse.ArgumentTypeError(f"a duration too long: {text!r}") from None
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"wants a duration (90s, 30m, 24h, 7d, 2w) or an ISO 8601 time, got {text!r}"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DEFAULT_SINCE = "24h"


def _add_follow(cancel: Parser) -> None:
    cancel.add_argument(
        "--follow",
        action="store_true",
        help="then follow the stop from the ledger (requested, observed, waiting for calls in "
        "flight, each call dropped, settled or undone) until the run is cancelled, and print "
        "its report (--json: one progress event per line)",
    )
    cancel.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="with --follow: give up (exit 1) if the run has not ended by then (default: wait)",
    )


def _add_stats(command: Any, parents: list[Parser]) -> None:
    stats = command(
        "stats",
        "stats:run",
        parents,
        help="the six numbers of cancellation across runs, per tool and overall",
        description="Across every run whose stop was requested in the window (a sub-agent's "
        "calls counted in its parent's stop): time from the request to quiescence and the "
        "calls dispatched in that window, unknown outcomes per cancellation, orphaned child "
        "runs, permanent effects per cancelled run, the compensation success rate and the "
        "model tokens spent after the signal; durations as p50/p90/p99/max. From the ledger "
        "alone.",
    )
    stats.add_argument(
        "--since",
        type=since,
        default=DEFAULT_SINCE,
        metavar="DURATION|ISO",
        help=f"the window's start: a duration back from now (90s, 30m, 24h, 7d, 2w) or an "
        f"ISO 8601 time (default: {DEFAULT_SINCE})",
    )


# ------------------------------------------------------------------------- parser
def build_parser() -> Parser:
    """The ``langgraph-cancel`` parser (each command's ``handler`` is ``"module:function"``)."""
    parser = Parser(
        prog=PROG,
        description="Make LangGraph agents safe to stop and resume: run the demo, and "
        "inspect, stop, settle and resume threads from their database.",
        epilog=f"Errors are one line on stderr and exit 1 (JSON on stdout under --json; "
        f"a traceback with $LANGGRAPH_CANCEL_DEBUG=1). `{PROG} COMMAND --help` describes "
        "a command.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")

    db = Parser(add_help=False, allow_abbrev=False)
    db.add_argument(
        "--db",
        type=database,
        default=None,
        metavar="URL",
        help=f"the database: sqlite:///file.db, a file path, postgresql://user@host/dbname "
        f"or memory:// (default: ${ENV_DB}, else {DEFAULT_DB_URL} in the working directory)",
    )
    as_json = Parser(add_help=False, allow_abbrev=False)
    as_json.add_argument(
        "--json",
        action="store_true",
        help="print JSON on stdout for programs (errors too), nothing else",
    )
    graph = Parser(add_help=False, allow_abbrev=False)
    graph.add_argument(
        "--graph",
        type=graph_spec,
        default=DEFAULT_GRAPH,
        metavar="MODULE:ATTR",
        help="the agent whose tools' reconcile and compensate hooks to use: a compiled "
        "graph, a builder, a function returning one, or a list of tools, as module:attribute "
        f"or path/to/file.py:attribute (default: {DEFAULT_GRAPH}, the demo's agent)",
    )
    thread = Parser(add_help=False, allow_abbrev=False)
    thread.add_argument(
        "thread", type=thread_id, metavar="THREAD", help="the thread id (LangGraph's thread_id)"
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands"
    )

    def command(name: str, handler: str, parents: list[Parser], **kwargs: Any) -> Parser:
        sub: Parser = commands.add_parser(name, parents=parents, allow_abbrev=False, **kwargs)
        sub.set_defaults(handler=handler)
        return sub

    demo = command(
        "demo",
        "demo:run",
        [db, as_json],
        help="run the seed scenario, press stop mid-run, print the report",
        description="Run the refund agent of the seed scenario against fake providers, "
        "press stop from another thread through the database, as a user in another process "
        "would, and print the cancellation report next to what the providers actually did. "
        "Nothing to set up, no API key.",
    )
    demo.add_argument(
        "--cancel-at",
        choices=DEMO_STEPS,
        default="update",
        metavar="STEP",
        help="when to press stop: update (default: while update_order(o-88) is in flight, "
        "four calls queued), refund (while the refund is in flight), email (while the email "
        "to the customer is in flight), plan (while the model writes turn 2), approval "
        "(while a 120.00 refund waits at the approval gate), budget (never by hand: a "
        "budget of 6 tool calls stops the run, and the report names the limit), ordered "
        "(the plan put irreversible calls last: stop while the refund waits for approval "
        "leaves nothing permanent), subagent (at the parent, while the refund its sub-agent "
        "makes on a thread of its own is in flight), window (while a follow-up email waits in "
        "its delay window: the stop revokes it), none (never: the run completes)",
    )
    demo.add_argument(
        "--thread",
        type=thread_id,
        default=DEMO_THREAD,
        metavar="ID",
        help=f"the thread to run on, reset first (default: {DEMO_THREAD})",
    )
    demo.add_argument(
        "--providers-db",
        type=non_empty,
        default=os.environ.get(ENV_PROVIDERS_DB) or DEFAULT_PROVIDERS_DB,
        metavar="PATH",
        help=f"the fake providers' own SQLite file, reset by each demo "
        f"(default: ${ENV_PROVIDERS_DB}, else {DEFAULT_PROVIDERS_DB})",
    )
    demo.add_argument(
        "--hang",
        type=seconds,
        default=DEMO_HANG,
        metavar="SECONDS",
        help=f"how long the request in flight at the stop takes (default: {DEMO_HANG:g})",
    )

    command(
        "status",
        "inspection:status",
        [thread, db, as_json],
        help="a thread's runs and lease, what was done, what may be committed, what is next",
        description="Answer from the database alone: what was done, which external side "
        "effects were (or may have been) committed, and what must happen next.",
    )
    effects = command(
        "effects",
        "inspection:effects",
        [thread, db, as_json],
        help="every effect record of a thread",
        description="Every tool call the ledger recorded for the thread: its kind, status, "
        "idempotency key, owner and next action.",
    )
    effects.add_argument(
        "--history", action="store_true", help="add each effect's audit trail of transitions"
    )
    report = command(
        "report",
        "inspection:report",
        [thread, db, as_json],
        help="the cancellation report of a thread's latest run",
        description="The report of the thread's latest run (or of --run): what is permanent, "
        "what is committed and reversible, what is unknown, what never ran.",
    )
    report.add_argument(
        "--run",
        type=non_empty,
        default=None,
        metavar="RUN_ID",
        help="a run id (default: the latest)",
    )
    report.add_argument(
        "--now",
        action="store_true",
        help="rebuild the report from the ledger as it is now (a cancelled run's stored report "
        "is the one written when it stopped)",
    )
    cancel = command(
        "cancel",
        "control:cancel",
        [thread, db, as_json],
        help="ask a thread's live run to stop",
        description="Ask the thread's live run to stop, through the database: its worker, in "
        "any process, stops at its next check, waits for the calls in flight and writes the "
        "report. The first reason wins; cancelling a finished run is a no-op (exit 0).",
    )
    cancel.add_argument(
        "--reason",
        type=non_empty,
        default="requested from the command line",
        metavar="TEXT",
        help="why (kept in the report; default: requested from the command line)",
    )
    cancel.add_argument(
        "--by",
        type=non_empty,
        default=_default_requester(),
        metavar="WHO",
        help="who asks (kept in the report; default: your user name)",
    )
    _add_follow(cancel)
    command(
        "compensate",
        "recovery:compensate",
        [thread, db, as_json, graph],
        help="undo a thread's committed reversible effects, newest first",
        description="Run the compensating action of each committed reversible effect of the "
        "thread, newest first. Exit 1 if one of them failed (it is then compensation_failed).",
    )
    resume = command(
        "resume",
        "recovery:resume",
        [thread, db, as_json, graph],
        help="reconcile a thread, then continue it from its last checkpoint",
        description="Settle the thread's in-flight and unknown effects through the tools' "
        "reconcile hooks, then continue it from its last checkpoint without repeating any "
        "committed call.",
    )
    resume.add_argument(
        "--resume-value",
        type=json_value,
        default=None,
        metavar="JSON",
        help="answer the pending interrupt with Command(resume=JSON)",
    )
    resume.add_argument(
        "--force",
        action="store_true",
        help="take the thread over even if its lease is live: only when you know its worker "
        "is dead (kill -9, lost host), instead of waiting for the lease to expire",
    )
    reconcile = command(
        "reconcile",
        "recovery:reconcile",
        [db, as_json, graph],
        help="settle unknown and in-flight effects through reconcile hooks",
        description="Ask the providers, through the tools' reconcile hooks, what became of "
        "calls left in flight or unknown. Give a THREAD, or --all.",
    )
    reconcile.add_argument(
        "thread",
        type=thread_id,
        nargs="?",
        default=None,
        metavar="THREAD",
        help="the thread id (or --all)",
    )
    reconcile.add_argument(
        "--all",
        action="store_true",
        help="every thread that needs it, after reaping the leases of dead workers",
    )
    outbox = command(
        "outbox",
        "outbox:run",
        [db, as_json, graph],
        help="send the calls held for a delay window once it has passed",
        description="Send each call the package holds for its delay window (a tool declared "
        "with effect(..., delay=...) and no revoke hook) once its window has passed, under its "
        "idempotency key; settle the calls a killed outbox worker left in flight; record as "
        "permanent the provider-held calls whose window has passed.",
    )
    outbox.add_argument(
        "--watch",
        action="store_true",
        help="keep draining every --interval seconds until SIGINT or SIGTERM",
    )
    outbox.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between drains with --watch (default: 1)",
    )
    outbox.add_argument(
        "--stale-after",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="take over a released call another worker left in flight this long (default: 30)",
    )
    sweep = command(
        "sweep",
        "sweep:run",
        [db, as_json, graph],
        help="settle what dead workers left, across all threads (once, or --watch)",
        description="Reap expired and dead leases, finish stops whose worker died, reconcile "
        "in-flight and unknown effects through the tools' hooks and retry failed "
        "compensations, a bounded pass at a time. Safe to run on several machines at once.",
    )
    sweep.add_argument(
        "--watch", action="store_true", help="sweep again every --interval seconds until Ctrl-C"
    )
    sweep.add_argument(
        "--interval",
        type=seconds,
        default=10.0,
        metavar="S",
        help="seconds between passes with --watch (default: 10)",
    )
    sweep.add_argument(
        "--max-threads",
        type=positive_int,
        default=100,
        metavar="N",
        help="work on at most N threads per pass (default: 100)",
    )
    sweep.add_argument(
        "--cancel-grace",
        type=seconds,
        default=30.0,
        metavar="S",
        help="finish a stop nobody holds once it is S seconds old, even when its worker "
        "cannot be known dead (another host); at once when it can (default: 30)",
    )
    _add_stats(command, [db, as_json])
    completion = command(
        "completion",
        "completion:run",
        [],
        help="print a bash or zsh completion script",
        description=f'bash: eval "$({PROG} completion bash)" in ~/.bashrc. zsh: '
        f"{PROG} completion zsh > ~/.zfunc/_{PROG}, with ~/.zfunc in $fpath before compinit.",
    )
    completion.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")
    return parser


__all__ = [
    "DEFAULT_PROVIDERS_DB",
    "DEFAULT_SINCE",
    "DEMO_HANG",
    "DEMO_STEPS",
    "DEMO_THREAD",
    "ENV_PROVIDERS_DB",
    "SHELLS",
    "Parser",
    "build_parser",
    "database",
    "graph_spec",
    "json_value",
    "non_empty",
    "positive_int",
    "seconds",
    "since",
    "thread_id",
]

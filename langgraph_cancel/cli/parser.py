"""The ``langgraph-cancel`` argument parser: every command, argument and help text.

Arguments are checked as they are parsed (a thread id that is empty, ``--hang -1``, a
malformed ``--db``: the types of :mod:`~langgraph_cancel.cli.arguments`), so a bad one
is refused before anything is opened. A
refusal raises :class:`~langgraph_cancel.errors.CommandLineError` instead of
argparse's usage-and-exit-2. Each command names its handler as
``"module:function"`` inside this package, imported only when that command
runs: building the parser imports nothing heavy.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from langgraph_cancel.cli.arguments import (
    DEFAULT_SINCE,
    database,
    default_requester,
    graph_spec,
    json_value,
    non_empty,
    positive_int,
    seconds,
    since,
    thread_id,
)
from langgraph_cancel.cli.config import DEFAULT_GRAPH, PROG, version
from langgraph_cancel.errors import CommandLineError
from langgraph_cancel.urls import DEFAULT_DB_URL, ENV_DB

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


class AddCommand(Protocol):
    """Adds one command to the parser: its name, its ``"module:function"`` handler, the
    shared arguments it takes, and ``add_parser``'s keywords (help, description)."""

    def __call__(self, name: str, handler: str, parents: list[Parser], **kwargs: Any) -> Parser: ...


@dataclass(frozen=True, slots=True)
class SharedArguments:
    """The arguments several commands take, each a parent parser of theirs.

    Attributes:
        db: ``--db URL``.
        as_json: ``--json``.
        graph: ``--graph MODULE:ATTR``, the agent whose tools' hooks to use.
        thread: The ``THREAD`` positional.
    """

    db: Parser
    as_json: Parser
    graph: Parser
    thread: Parser


def _shared_arguments() -> SharedArguments:
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
    return SharedArguments(db=db, as_json=as_json, graph=graph, thread=thread)


# ------------------------------------------------------------------ command groups
def _add_demo(command: AddCommand, shared: SharedArguments) -> None:
    """``demo``: the seed scenario (:mod:`langgraph_cancel.cli.demo`)."""
    demo = command(
        "demo",
        "demo:run",
        [shared.db, shared.as_json],
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


def _add_inspection(command: AddCommand, shared: SharedArguments) -> None:
    """``status``, ``effects``, ``report`` (:mod:`langgraph_cancel.cli.inspection`)."""
    command(
        "status",
        "inspection:status",
        [shared.thread, shared.db, shared.as_json],
        help="a thread's runs and lease, what was done, what may be committed, what is next",
        description="Answer from the database alone: what was done, which external side "
        "effects were (or may have been) committed, and what must happen next.",
    )
    effects = command(
        "effects",
        "inspection:effects",
        [shared.thread, shared.db, shared.as_json],
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
        [shared.thread, shared.db, shared.as_json],
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


def _add_control(command: AddCommand, shared: SharedArguments) -> None:
    """``cancel`` (:mod:`langgraph_cancel.cli.control`)."""
    cancel = command(
        "cancel",
        "control:cancel",
        [shared.thread, shared.db, shared.as_json],
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
        default=default_requester(),
        metavar="WHO",
        help="who asks (kept in the report; default: your user name)",
    )
    _add_follow(cancel)


def _add_recovery(command: AddCommand, shared: SharedArguments) -> None:
    """``compensate``, ``resume``, ``reconcile`` (:mod:`langgraph_cancel.cli.recovery`)."""
    command(
        "compensate",
        "recovery:compensate",
        [shared.thread, shared.db, shared.as_json, shared.graph],
        help="undo a thread's committed reversible effects, newest first",
        description="Run the compensating action of each committed reversible effect of the "
        "thread, newest first. Exit 1 if one of them failed (it is then compensation_failed).",
    )
    resume = command(
        "resume",
        "recovery:resume",
        [shared.thread, shared.db, shared.as_json, shared.graph],
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
        [shared.db, shared.as_json, shared.graph],
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


def _add_outbox(command: AddCommand, shared: SharedArguments) -> None:
    """``outbox`` (:mod:`langgraph_cancel.cli.outbox`)."""
    outbox = command(
        "outbox",
        "outbox:run",
        [shared.db, shared.as_json, shared.graph],
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


def _add_sweep(command: AddCommand, shared: SharedArguments) -> None:
    """``sweep`` (:mod:`langgraph_cancel.cli.sweep`)."""
    sweep = command(
        "sweep",
        "sweep:run",
        [shared.db, shared.as_json, shared.graph],
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


def _add_stats(command: AddCommand, shared: SharedArguments) -> None:
    """``stats`` (:mod:`langgraph_cancel.cli.stats`)."""
    stats = command(
        "stats",
        "stats:run",
        [shared.db, shared.as_json],
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


def _add_completion(command: AddCommand, shared: SharedArguments) -> None:
    """``completion`` (:mod:`langgraph_cancel.cli.completion`)."""
    completion = command(
        "completion",
        "completion:run",
        [],
        help="print a bash or zsh completion script",
        description=f'bash: eval "$({PROG} completion bash)" in ~/.bashrc. zsh: '
        f"{PROG} completion zsh > ~/.zfunc/_{PROG}, with ~/.zfunc in $fpath before compinit.",
    )
    completion.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")


#: The command groups, in the order ``--help`` lists their commands.
_GROUPS: tuple[Callable[[AddCommand, SharedArguments], None], ...] = (
    _add_demo,
    _add_inspection,
    _add_control,
    _add_recovery,
    _add_outbox,
    _add_sweep,
    _add_stats,
    _add_completion,
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
    shared = _shared_arguments()
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands"
    )

    def command(name: str, handler: str, parents: list[Parser], **kwargs: Any) -> Parser:
        sub: Parser = commands.add_parser(name, parents=parents, allow_abbrev=False, **kwargs)
        sub.set_defaults(handler=handler)
        return sub

    for add_group in _GROUPS:
        add_group(command, shared)
    return parser


__all__ = [
    "DEFAULT_PROVIDERS_DB",
    "DEFAULT_SINCE",
    "DEMO_HANG",
    "DEMO_STEPS",
    "DEMO_THREAD",
    "ENV_PROVIDERS_DB",
    "SHELLS",
    "AddCommand",
    "Parser",
    "SharedArguments",
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

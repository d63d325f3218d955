"""``main``: parse, run the command's handler, turn every failure into one line and exit 1."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from langgraph_cancel.cli.config import DEBUG_ENV, PROG
from langgraph_cancel.errors import CommandLineError, LangGraphCancelError

#: Exit code of a command that did not run to its end.
EXIT_ERROR = 1
#: Exit code after Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``langgraph-cancel`` console script.

    Args:
        argv: The arguments (default ``sys.argv[1:]``).

    Returns:
        The exit code: 0 on success, 1 on an error (one line on stderr, or a
        JSON object on stdout under ``--json``), 130 after Ctrl-C.
    """
    from langgraph_cancel.cli.parser import build_parser

    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(arguments)
    except SystemExit as done:  # --help and --version
        return done.code if isinstance(done.code, int) else 0
    except CommandLineError as exc:
        return _fail(exc, as_json="--json" in arguments)
    try:
        return _handler(args.handler)(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `langgraph-cancel effects T | head`: stop quietly
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        return _fail(exc, as_json=bool(getattr(args, "json", False)))


def _handler(spec: str) -> Callable[[argparse.Namespace], int]:
    module, _, name = spec.partition(":")
    handler: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"langgraph_cancel.cli.{module}"), name
    )
    return handler


def one_line(exc: BaseException) -> str:
    """An exception as one line: the package's own errors speak for themselves."""
    text = str(exc).strip() or type(exc).__name__
    first = " ".join(text.splitlines()[0].split())
    if isinstance(exc, LangGraphCancelError):
        return first
    return f"{type(exc).__name__}: {first}"


def _fail(exc: BaseException, *, as_json: bool) -> int:
    if os.environ.get(DEBUG_ENV):
        traceback.print_exception(exc, file=sys.stderr)
    message = one_line(exc)
    if as_json:
        error = {"type": type(exc).__name__, "message": message}
        print(json.dumps({"error": error}, indent=2))
    else:
        print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_ERROR


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "main", "one_line"]

"""The types of the command line's arguments: each checks one value, or refuses it.

A refusal is argparse's ``ArgumentTypeError`` with a message that says what was wanted,
so that a bad value is refused before anything is opened.
"""

from __future__ import annotations

import argparse
import getpass
import json
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from langgraph_cancel.errors import InvalidURLError
from langgraph_cancel.urls import DatabaseURL, parse_database_url

#: ``stats --since``'s default window.
DEFAULT_SINCE = "24h"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


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


def default_requester() -> str:
    """Who asks, when ``cancel --by`` does not say: the user name, marked as the CLI's."""
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


__all__ = [
    "DEFAULT_SINCE",
    "database",
    "default_requester",
    "graph_spec",
    "json_value",
    "non_empty",
    "positive_int",
    "seconds",
    "since",
    "thread_id",
]

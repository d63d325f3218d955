"""The printing primitives: a console at the terminal's width, wrapped paragraphs,
aligned ``field  value`` rows, and the short forms of values, times and statuses."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.text import Text

#: Width of piped output when ``$COLUMNS`` does not say.
PIPED_WIDTH = 80
#: Indent of a record's details under its first line.
DETAIL = 6
NONE = "—"
#: The narrowest a wrapped paragraph gets, however deep its indent.
MIN_TEXT_WIDTH = 20


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): the terminal's width, or ``$COLUMNS``/80 when piped."""
    stream = sys.stderr if stderr else sys.stdout
    width: int | None = None
    if not stream.isatty():
        width = PIPED_WIDTH
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit() and int(columns) > 0:
            width = int(columns)
    return Console(file=stream, width=width, highlight=False, markup=False, emoji=False)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout."""
    print(json.dumps(data, indent=2, default=str))


def line(
    out: Console, *parts: str | Text | tuple[str, str], indent: int = 0, hang: int | None = None
) -> None:
    """Print ``parts`` as one paragraph, wrapped at the console's width.

    Args:
        out: The console.
        parts: Text, or ``(text, style)`` pairs.
        indent: Spaces before the first line.
        hang: Spaces before each continuation line (default: ``indent``).
    """
    _wrapped(out, Text.assemble(*parts), indent, indent if hang is None else hang)


def pairs(out: Console, rows: Sequence[tuple[str, str | Text]], *, indent: int = 2) -> None:
    """``field  value`` rows, the values aligned and wrapped under themselves."""
    key_width = max(len(field) for field, _value in rows) + 2
    for field, value in rows:
        label = " " * indent + field.ljust(key_width)
        _wrapped(out, Text(value) if isinstance(value, str) else value, 0, len(label), label)


def _wrapped(out: Console, text: Text, indent: int, hang: int, first: str = "") -> None:
    width = max(out.width - max(indent, hang), MIN_TEXT_WIDTH)
    for number, piece in enumerate(text.wrap(out, width)):
        piece.rstrip()
        lead = (first or " " * indent) if number == 0 else " " * hang
        out.print(Text(lead) + piece)


def short(value: Any, limit: int = 48) -> str:
    """``value`` as text, elided to ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_label(tool: str, args: Mapping[str, Any], limit: int = 24) -> str:
    """``tool(k=v, ...)``: long values shortened, free text (over 40 characters) elided."""
    parts = []
    for key, value in args.items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if isinstance(value, str) and len(text) > 40:
            parts.append(f"{key}=…")
        else:
            parts.append(f"{key}={short(text, limit)}")
    return f"{tool}({', '.join(parts)})"


def timestamp(value: datetime | str | None, *, short_form: bool = False) -> str:
    """A local time to the millisecond (the time of day only with ``short_form``)."""
    if value is None:
        return NONE
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
    else:
        moment = value
    pattern = "%H:%M:%S.%f" if short_form else "%Y-%m-%d %H:%M:%S.%f"
    return moment.astimezone().strftime(pattern)[:-3]


def milliseconds(value: float | None) -> str:
    """``1,234 ms``, or a dash."""
    return NONE if value is None else f"{value:,.0f} ms"


_STATUS_STYLE = {
    "committed": "green",
    "completed": "green",
    "compensated": "cyan",
    "compensating": "yellow",
    "compensation_failed": "bold red",
    "dispatched": "yellow",
    "unknown": "bold red",
    "dropped": "dim",
    "rejected": "magenta",
    "failed": "red",
    "not_applied": "dim",
    "pending_approval": "yellow",
    "approved": "yellow",
    "planned": "dim",
    "cancelled": "bold",
    "cancel_requested": "yellow",
    "cancelling": "yellow",
    "running": "cyan",
}


def status_text(status: str) -> Text:
    """A status word in its colour."""
    return Text(status, style=_STATUS_STYLE.get(status, ""))


__all__ = [
    "DETAIL",
    "MIN_TEXT_WIDTH",
    "NONE",
    "PIPED_WIDTH",
    "call_label",
    "console",
    "line",
    "milliseconds",
    "pairs",
    "print_json",
    "short",
    "status_text",
    "timestamp",
]

"""Everything the command line prints for people, and its JSON for programs.

Output follows the terminal's width and wraps rather than cuts: each record is
a line of its own with its details indented below it, never a table column
squeezed to a few characters. Piped, it is plain text (no colour, no
animation) at ``$COLUMNS`` or 80 columns.

The printing primitives are in :mod:`~langgraph_cancel.cli.render.text`; each
other module renders one kind of output: the cancellation report
(:mod:`~langgraph_cancel.cli.render.report`), a thread's status, effects and
cancel (:mod:`~langgraph_cancel.cli.render.thread`), what recovery did
(:mod:`~langgraph_cancel.cli.render.recovery`), the numbers of ``stats``
(:mod:`~langgraph_cancel.cli.render.stats`) and the demo's narration
(:mod:`~langgraph_cancel.cli.render.progress`). Commands use them through this
package (``render.line``, ``render.render_report``).
"""

from langgraph_cancel.cli.render.progress import describe_progress, describe_update, progress_line
from langgraph_cancel.cli.render.recovery import (
    render_compensated,
    render_reconciled,
    render_resumed,
)
from langgraph_cancel.cli.render.report import CATEGORIES, render_report
from langgraph_cancel.cli.render.stats import render_stats
from langgraph_cancel.cli.render.text import (
    DETAIL,
    MIN_TEXT_WIDTH,
    NONE,
    PIPED_WIDTH,
    call_label,
    console,
    line,
    milliseconds,
    pairs,
    print_json,
    short,
    status_text,
    timestamp,
)
from langgraph_cancel.cli.render.thread import render_cancel, render_effects, render_status

__all__ = [
    "CATEGORIES",
    "DETAIL",
    "MIN_TEXT_WIDTH",
    "NONE",
    "PIPED_WIDTH",
    "call_label",
    "console",
    "describe_progress",
    "describe_update",
    "line",
    "milliseconds",
    "pairs",
    "print_json",
    "progress_line",
    "render_cancel",
    "render_compensated",
    "render_effects",
    "render_reconciled",
    "render_report",
    "render_resumed",
    "render_stats",
    "render_status",
    "short",
    "status_text",
    "timestamp",
]

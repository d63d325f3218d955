"""The six numbers of cancellation as a person reads them, then a table per tool."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from langgraph_cancel.cli.render.text import NONE, line, pairs, timestamp

if TYPE_CHECKING:
    from langgraph_cancel.metrics import CancellationStats, Distribution


def _spread(values: Distribution, unit: str = "") -> str:
    if values.count == 0:
        return NONE

    def show(value: float | None) -> str:
        return NONE if value is None else f"{value:,.0f}{unit}"

    return (
        f"p50 {show(values.p50)}, p90 {show(values.p90)}, p99 {show(values.p99)}, "
        f"max {show(values.max)}"
    )


def _rate(value: float | None) -> str:
    return NONE if value is None else f"{value:.1%}"


def render_stats(out: Console, stats: CancellationStats) -> None:
    """The six numbers as a person reads them, then a table per tool."""
    line(
        out,
        ("Cancellations", "bold"),
        f" since {timestamp(stats.since)}: {stats.cancellations} ({stats.quiesced} quiesced)",
    )
    if stats.cancellations == 0:
        line(out, "No run was asked to stop in this window.", indent=2)
        return
    pairs(
        out,
        [
            ("time to quiescence", _spread(stats.quiescence_ms, " ms")),
            (
                "dispatched in that window",
                f"{stats.dispatched_in_window} ({_spread(stats.dispatched_in_window_per_run)} "
                "per stop)",
            ),
            (
                "unknown outcomes",
                f"{stats.unknown} ({_spread(stats.unknown_per_cancellation)} per stop)",
            ),
            ("orphaned child runs", str(stats.orphans)),
            (
                "permanent effects",
                f"{stats.permanent} ({_spread(stats.permanent_per_cancellation)} per stop)",
            ),
            ("irreversible before other work", str(stats.irreversible_first)),
            (
                "compensations",
                f"{_rate(stats.compensation_success_rate)} succeeded "
                f"({stats.compensations_succeeded} of "
                f"{stats.compensations_succeeded + stats.compensations_failed})",
            ),
            (
                "tokens after the signal",
                f"{stats.tokens_after_signal} ({_spread(stats.tokens_after_signal_per_run)} "
                "per stop)",
            ),
        ],
    )
    if stats.tools:
        out.print()
        _tool_table(out, stats)


def _tool_table(out: Console, stats: CancellationStats) -> None:
    """Per tool: calls in the window, unknown, permanent, undos and their rate."""
    line(out, ("Per tool", "bold"))
    rows = [_TOOL_COLUMNS] + [
        (
            tool,
            str(numbers.dispatched_in_window),
            str(numbers.unknown),
            str(numbers.permanent),
            f"{numbers.compensations_succeeded}/"
            f"{numbers.compensations_succeeded + numbers.compensations_failed}",
            _rate(numbers.compensation_success_rate),
        )
        for tool, numbers in stats.tools.items()
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_TOOL_COLUMNS))]
    for number, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)
        ]
        text = ("  " + "  ".join(cells)).rstrip()
        out.print(Text(text, style="bold" if number == 0 else ""), soft_wrap=True)


#: The per-tool table's columns: calls dispatched between a request and quiescence, left
#: unknown, permanent; undos that succeeded over undos tried, and their rate.
_TOOL_COLUMNS = ("tool", "in window", "unknown", "permanent", "undone", "undo rate")

__all__ = ["render_stats"]

"""A run as the demo narrates it: each call's new status, each step of a stop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.text import Text

from langgraph_cancel.cli.render.text import call_label, short, status_text, timestamp

if TYPE_CHECKING:
    from langgraph_cancel.types import EffectRecord

_MARKS = {"dispatched": "→", "committed": "✓", "dropped": "✗", "unknown": "?", "failed": "✗"}


def progress_line(effect: EffectRecord) -> Text:
    """One call's new status, as the demo's stop button sees it."""
    status = effect.status.value
    note = "  (in flight: the request has left the process)" if status == "dispatched" else ""
    return Text.assemble(
        f"  {_MARKS.get(status, '·')} ",
        (call_label(effect.tool, effect.args), "bold"),
        "  ",
        status_text(status),
        note,
    )


def describe_progress(event: Mapping[str, Any]) -> Text | None:
    """One line for a progress event of a stop (``langgraph_cancel.progress``).

    ``event`` is the chunk's ``"langgraph_cancel"`` value (or a ``ProgressEvent``
    dumped to JSON); None for a kind this version does not know.
    """
    kind = event.get("event")
    effect = event.get("effect") or {}
    label = call_label(str(effect.get("tool", "?")), effect.get("args") or {})
    if kind == "requested":
        who = event.get("requested_by") or "someone"
        reason = event.get("reason") or "no reason given"
        return Text.assemble(("stop requested", "bold red"), f" by {who}: {reason}")
    if kind == "observed":
        return Text.assemble(("stop observed", "bold red"), ": the run is cancelling")
    if kind == "dropped":
        return Text.assemble("  ", (label, "bold"), "  ", status_text("dropped"), "  (never ran)")
    if kind == "waiting":
        since = timestamp(effect.get("dispatched_at"), short_form=True)
        grace = event.get("grace_s")
        within = "until it returns" if grace is None else f"up to {grace:g}s"
        return Text.assemble(
            ("waiting", "bold yellow"),
            " for ",
            (label, "bold"),
            f", in flight since {since}: the request has left the process ({within})",
        )
    if kind == "settled":
        status = str(effect.get("status", "unknown"))
        return Text.assemble("  ", (label, "bold"), "  ", status_text(status), "  (settled)")
    if kind in ("compensated", "compensation_failed"):
        return Text.assemble("  ", (label, "bold"), "  ", status_text(str(kind)))
    if kind == "cancelled":
        return Text.assemble(("run cancelled", "bold red"), ": the report follows")
    return None


def describe_update(chunk: Mapping[str, Any]) -> list[Text]:
    """The demo's lines for one ``stream_mode="updates"`` chunk."""
    lines: list[Text] = []
    for node, update in chunk.items():
        if node == "agent" and isinstance(update, dict):
            for message in update.get("messages", []):
                calls = getattr(message, "tool_calls", None) or []
                if calls:
                    names = ", ".join(call["name"] for call in calls)
                    what = f": plans {len(calls)} call(s): {names}"
                else:
                    what = ": " + short(getattr(message, "content", ""), 120)
                lines.append(Text.assemble(("model", "bold cyan"), what))
        elif node == "cancel":
            lines.append(
                Text.assemble(
                    ("cancel node", "bold red"),
                    ": queue drained, in-flight calls settled, run cancelled",
                )
            )
    return lines


__all__ = ["describe_progress", "describe_update", "progress_line"]

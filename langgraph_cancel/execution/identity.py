"""Which ledger record is a tool call's own: the "same step?" check.

A tool call is known by its thread and tool-call id. Some providers number ids
per message (``call_0`` every turn), so before acting on a record found under a
call's id the check asks whether it is this call (same tool, same arguments, or
the arguments an approved edit replaced). Another call's record is never
replayed as this call's answer: the call is recorded under an id of its own,
``<id>~<digest of tool and arguments>``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from langchain_core.messages import AIMessage, ToolCall, ToolMessage

from langgraph_cancel.errors import EffectConflictError
from langgraph_cancel.execution.drive import drive_ledger
from langgraph_cancel.execution.steps import Protocol, ledger_call
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import EffectRecord


def canonical(value: Any) -> str:
    """A stable text form of JSON-like arguments, for comparing two calls."""
    return json.dumps(value, default=str, sort_keys=True)


def as_tool_call(call: Any) -> ToolCall:
    """A call whose name is a string and whose id is a string or ``None``.

    ``Send`` payloads reach a tool node unvalidated: a missing id, or a name or
    id of another type, must be answered as a malformed call, not crash the batch.
    """
    if not isinstance(call, Mapping):
        return cast(ToolCall, {"name": "", "args": call, "id": None, "type": "tool_call"})
    name, call_id = call.get("name"), call.get("id")
    if isinstance(name, str) and "id" in call and (call_id is None or isinstance(call_id, str)):
        return cast(ToolCall, call)
    return cast(
        ToolCall,
        {
            **call,
            "name": name if isinstance(name, str) else "" if name is None else str(name),
            "id": call_id if call_id is None or isinstance(call_id, str) else str(call_id),
        },
    )


def recorded_call(call: Any) -> ToolCall:
    """A call as the ledger records it, malformed or not: the tool's name as text
    (``"(none)"`` when it has none) and arguments that are an object.

    Whoever records a call and whoever later looks for its record compare this
    form, so the same malformed call twice finds one record, not two.
    """
    raw_name = call.get("name")
    name = raw_name if isinstance(raw_name, str) else "" if raw_name is None else str(raw_name)
    args = call.get("args")
    return cast(
        ToolCall,
        {
            "name": name or "(none)",
            "args": args if isinstance(args, dict) else {"__raw__": repr(args)},
            "id": str(call.get("id")),
        },
    )


def reused_call_id(call: ToolCall) -> str:
    """The ledger id of a call whose tool-call id already names another call's record.

    The id plus a digest of the call's tool and arguments: the same call gets the
    same id again (a re-run records nothing twice), another call another one.
    """
    content = f"{call.get('name')}\0{canonical(call.get('args'))}"
    return f"{call['id']}~{hashlib.sha256(content.encode()).hexdigest()[:12]}"


def ensure_same_call(rec: EffectRecord, name: str, args: Any) -> None:
    """The check before acting on a found record: is it this call ("same step?")?

    Same tool and the recorded arguments, or the arguments an approved edit
    replaced. A re-run of the call (crash, interrupt, retry) always passes.

    Raises:
        EffectConflictError: The record is another call's: its tool-call id was
            reused (some providers number ids per message).
    """
    wanted = canonical(args)
    if rec.tool == name and canonical(rec.args) == wanted:
        return
    approval = rec.approval or {}
    if (
        rec.tool == name
        and approval.get("decision") == "edit"
        and canonical(approval.get("original_args")) == wanted
    ):
        return
    raise EffectConflictError(
        rec.effect_id,
        rec.tool_call_id,
        f"{rec.tool} with {canonical(rec.args)}, {rec.status.value}",
        f"{name} with {wanted}",
    )


def is_same_call(rec: EffectRecord, call: ToolCall) -> bool:
    """Whether ``rec`` records ``call`` (see ``ensure_same_call``)."""
    try:
        ensure_same_call(rec, str(call.get("name") or ""), call.get("args"))
    except EffectConflictError:
        return False
    return True


def own_record_steps(
    thread_id: str, call: ToolCall, *, moved: bool = False
) -> Protocol[tuple[str, EffectRecord | None]]:
    """The id this call is known by in the ledger, and its record if it has one.

    Its tool-call id, unless that names another call's record (a provider that
    numbers ids per message): then ``reused_call_id(call)``, unless an approved
    edit changed the arguments since the call was recorded: then its record is
    the one under this tool-call id that holds the edited arguments.

    ``moved``: the tool-call id is known to name another call's record.
    """
    call_id = str(call["id"])
    if not moved:
        rec = yield from ledger_call(Ledger.find_effect, thread_id, call_id)
        if rec is None or is_same_call(rec, call):
            return call_id, rec
    own = reused_call_id(call)
    rec = yield from ledger_call(Ledger.find_effect, thread_id, own)
    if rec is not None:
        return own, rec
    for found in (yield from ledger_call(Ledger.find_moved, thread_id, call_id)):
        if is_same_call(found, call):
            return found.tool_call_id, found
    return own, None


def find_own_record(
    ledger: Ledger, thread_id: str, call: ToolCall
) -> tuple[str, EffectRecord | None]:
    """``own_record_steps``, from sync code."""
    return drive_ledger(ledger, own_record_steps(thread_id, call))


def moved_record(ledger: Ledger, thread_id: str, call: ToolCall) -> tuple[str, EffectRecord | None]:
    """``own_record_steps`` for a call whose tool-call id names another call's record."""
    return drive_ledger(ledger, own_record_steps(thread_id, call, moved=True))


def dangling_tool_calls(messages: Sequence[Any]) -> list[ToolCall]:
    """Tool calls in a history that have no ToolMessage answering them.

    A ToolMessage answers the earliest unanswered call with its id before it: a
    provider that repeats ids across turns (``call_0`` each turn) leaves a later
    turn's call unanswered even though an earlier ``call_0`` was answered.
    """
    pending: list[ToolCall] = []
    for message in messages:
        if isinstance(message, AIMessage):
            pending.extend(c for c in message.tool_calls if c.get("id"))
        elif isinstance(message, ToolMessage):
            for position, call in enumerate(pending):
                if call["id"] == message.tool_call_id:
                    del pending[position]
                    break
    return pending


__all__ = [
    "as_tool_call",
    "canonical",
    "dangling_tool_calls",
    "ensure_same_call",
    "find_own_record",
    "is_same_call",
    "moved_record",
    "own_record_steps",
    "recorded_call",
    "reused_call_id",
]

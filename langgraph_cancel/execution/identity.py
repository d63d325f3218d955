"""Which ledger record is a tool call's own: the "same step?" check.

A tool call is known by its thread, its tool-call id and the model turn that
asked for it. Some providers number ids per message (``call_0`` every turn), and
a model may ask for the very same call again in a later turn: that is a new call.
So a call whose id an earlier model message in the history already asked for is
recorded under ``<id>~turn-<n>`` (``n`` such messages before it); a re-run of the
same step (an interrupt, a crash) finds the same history, so the same id.

Before acting on a record found under a call's id the check asks whether it is
this call (same tool, same arguments, or the arguments an approved edit
replaced). Another call's record is never replayed as this call's answer: the
call is recorded under an id of its own, ``<id>~<digest of tool and arguments>``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
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


def reused_call_id(call: ToolCall, base_id: str | None = None) -> str:
    """The ledger id of a call whose tool-call id already names another call's record.

    The id (``base_id``: the call's turn-aware id, see ``turn_call_id``) plus a
    digest of the call's tool and arguments: the same call gets the same id again
    (a re-run records nothing twice), another call another one.
    """
    content = f"{call.get('name')}\0{canonical(call.get('args'))}"
    base = base_id if base_id is not None else call["id"]
    return f"{base}~{hashlib.sha256(content.encode()).hexdigest()[:12]}"


def history_of(state: Any, messages_key: str = "messages") -> Sequence[Any]:
    """The messages of a tool node's input or a tool call's state (a list of
    messages, a mapping or an object with ``messages_key``); empty if it has none."""
    if isinstance(state, Sequence) and not isinstance(state, str):
        return state
    if isinstance(state, Mapping) and state.get("__type") == "tool_call_with_context":
        state = state.get("state")  # a Send's payload: the call and the sender's state
    found = (
        state.get(messages_key)
        if isinstance(state, Mapping)
        else getattr(state, messages_key, None)
    )
    return found if isinstance(found, Sequence) and not isinstance(found, str) else ()


def call_turn(messages: Sequence[Any], call_id: str) -> int:
    """How many model messages asked for ``call_id`` before the one that asks for it
    now (the last one that does): 0 for a call whose id is new to the history."""
    return CallTurns(messages).of(call_id)


class CallTurns:
    """``call_turn`` for every call of a batch, from one pass over the history.

    Args:
        messages: The history the batch's calls were asked in.
    """

    __slots__ = ("_asking",)

    def __init__(self, messages: Sequence[Any]) -> None:
        #: How many model messages ask for each tool-call id (a message that asks
        #: for one id twice counts once).
        self._asking: Counter[str] = Counter()
        for message in messages:
            if isinstance(message, AIMessage):
                ids = {call.get("id") for call in message.tool_calls}
                self._asking.update(call_id for call_id in ids if isinstance(call_id, str))

    def of(self, call_id: str) -> int:
        """``call_id``'s turn: 0 for an id new to the history."""
        return max(self._asking[call_id] - 1, 0)


def turn_call_id(call_id: str, turn: int) -> str:
    """The ledger id of the call ``call_id`` asked for in its ``turn``-th asking message."""
    return call_id if turn == 0 else f"{call_id}~turn-{turn}"


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
    thread_id: str, call: ToolCall, *, moved: bool = False, base_id: str | None = None
) -> Protocol[tuple[str, EffectRecord | None]]:
    """The id this call is known by in the ledger, and its record if it has one.

    Its tool-call id, unless that names another call's record (a provider that
    numbers ids per message): then ``reused_call_id(call)``, unless an approved
    edit changed the arguments since the call was recorded: then its record is
    the one under this tool-call id that holds the edited arguments.

    ``moved``: the tool-call id is known to name another call's record.
    ``base_id``: the call's turn-aware id (``turn_call_id``), if not its tool-call id.
    """
    call_id = base_id if base_id is not None else str(call["id"])
    if not moved:
        rec = yield from ledger_call(Ledger.find_effect, thread_id, call_id)
        if rec is None or is_same_call(rec, call):
            return call_id, rec
    own = reused_call_id(call, call_id)
    rec = yield from ledger_call(Ledger.find_effect, thread_id, own)
    if rec is not None:
        return own, rec
    for found in (yield from ledger_call(Ledger.find_moved, thread_id, call_id)):
        if is_same_call(found, call):
            return found.tool_call_id, found
    return own, None


def find_own_record(
    ledger: Ledger, thread_id: str, call: ToolCall, base_id: str | None = None
) -> tuple[str, EffectRecord | None]:
    """``own_record_steps``, from sync code."""
    return drive_ledger(ledger, own_record_steps(thread_id, call, base_id=base_id))


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
    "CallTurns",
    "as_tool_call",
    "call_turn",
    "canonical",
    "dangling_tool_calls",
    "ensure_same_call",
    "find_own_record",
    "history_of",
    "is_same_call",
    "moved_record",
    "own_record_steps",
    "recorded_call",
    "reused_call_id",
    "turn_call_id",
]

"""A tool call as the protocol acts on it: its tool, declaration, key and ledger id."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from langchain_core.messages import ToolCall
from langchain_core.tools import BaseTool

from langgraph_cancel.effects import EffectSpec
from langgraph_cancel.execution.identity import is_same_call, turn_call_id
from langgraph_cancel.execution.review import schema_problem
from langgraph_cancel.ledger import derive_idempotency_key
from langgraph_cancel.types import EffectKind, EffectRecord, NewEffect

MalformedReason = Literal["no_id", "not_object", "arguments", "key"]


@dataclass(frozen=True, slots=True)
class CallPlan:
    """One classified call.

    Attributes:
        index: Its position in the batch (the record's ``seq``).
        call: The call as the handler will get it.
        tool: The tool that runs it.
        spec: The tool's effect declaration.
        key: Its idempotency key.
        own_id: The id the ledger knows it by, when not its ``base_id`` (that
            names another call's record).
        turn: How many earlier model messages asked for its tool-call id.
    """

    index: int
    call: ToolCall
    tool: BaseTool
    spec: EffectSpec
    key: str
    own_id: str | None = None
    turn: int = 0

    @property
    def call_id(self) -> str:
        """The tool-call id (checked non-empty when the call was classified)."""
        return str(self.call["id"])

    @property
    def base_id(self) -> str:
        """The tool-call id, told apart from the same id asked in an earlier turn."""
        return turn_call_id(self.call_id, self.turn)

    @property
    def ledger_id(self) -> str:
        """The id of this call's ledger record: its ``base_id``, or ``own_id``."""
        return self.own_id or self.base_id

    @property
    def args(self) -> dict[str, Any]:
        """The call's arguments (an object: checked when classified)."""
        args: dict[str, Any] = self.call["args"]
        return args

    @property
    def needs_review(self) -> bool:
        """Whether the call must be approved before dispatch (a failing rule: yes)."""
        try:
            return self.spec.needs_approval(self.args)
        except Exception:
            return True

    @property
    def fast_read(self) -> bool:
        """A read-only call needing no approval: it runs without an intent record."""
        return self.spec.kind is EffectKind.READ_ONLY and not self.needs_review

    def needs_own_id(self, rec: EffectRecord) -> bool:
        """Whether ``rec``, found under this call's tool-call id, is another call's."""
        return self.own_id is None and not is_same_call(rec, self.call)

    def under_own_id(self, thread_id: str, own: str) -> CallPlan:
        """This call under the id of its own record.

        A key derived from the tool-call id is derived from the new id too; a
        declared key stays what the tool declares.
        """
        key = (
            self.key
            if self.spec.idempotency_key is not None
            else derive_idempotency_key(thread_id, own)
        )
        return replace(self, key=key, own_id=own)

    def with_args(self, args: dict[str, Any]) -> CallPlan:
        """This call with the arguments its record holds (an approved edit)."""
        if args == self.call.get("args"):
            return self
        call: ToolCall = {**self.call, "args": args}
        return replace(self, call=call)

    def new_effect(self, **fields: Any) -> NewEffect:
        """This call as a ledger row (``fields``: status, result, error, detail)."""
        return NewEffect(
            tool_call_id=self.ledger_id,
            tool=self.tool.name,
            kind=self.spec.kind,
            args=self.args,
            idempotency_key=self.key,
            seq=self.index,
            **fields,
        )


@dataclass(frozen=True, slots=True)
class Malformed:
    """A call that cannot be run as asked: why, in words for the model."""

    reason: MalformedReason
    text: str


def classify(
    index: int,
    call: ToolCall,
    tool: BaseTool,
    spec: EffectSpec,
    thread_id: str,
    *,
    check: bool = True,
    turn: int = 0,
) -> CallPlan | Malformed:
    """The plan of a call, or why it is malformed (no id, bad arguments, no key).

    ``check=False`` skips the schema check (the tool itself accepted the arguments).
    ``turn``: how many earlier model messages asked for the call's id
    (``identity.call_turn``).
    """
    name = tool.name
    call_id = call.get("id")
    if not call_id:
        return Malformed("no_id", "Error: tool call without an id cannot be tracked; not run.")
    args = call.get("args")
    if not isinstance(args, dict):
        # Not even ToolNode's injection can handle these (a Send may carry anything).
        return Malformed(
            "not_object",
            f"Error invoking tool {name!r}: arguments must be an object, got "
            f"{type(args).__name__}. Please fix the error and try again.",
        )
    problem = schema_problem(tool, args) if check else None
    if problem is not None:
        return Malformed("arguments", problem)
    try:
        key = (
            str(spec.idempotency_key(args))
            if spec.idempotency_key is not None
            else derive_idempotency_key(thread_id, turn_call_id(str(call_id), turn))
        )
    except Exception as exc:
        return Malformed("key", f"Error: cannot derive the idempotency key of {name!r}: {exc!r}")
    return CallPlan(index, call, tool, spec, key, turn=turn)


__all__ = ["CallPlan", "Malformed", "MalformedReason", "classify"]

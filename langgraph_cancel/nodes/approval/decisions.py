"""Reading the reviewer's answer: one decision per call asked about, checked before use.

A malformed resume value (wrong count, unknown type, an edit naming another
tool or with non-object args) is refused as a whole (``InvalidDecisionError``);
an edit whose arguments are off the tool's schema, or whose idempotency key
cannot be derived, is refused by position. Either way the gate asks again, and
nothing is decided meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph_cancel.errors import InvalidDecisionError
from langgraph_cancel.execution.review import DecisionType, schema_problem
from langgraph_cancel.nodes.approval.payload import ALLOWED_DECISIONS, GatedCall


@dataclass(slots=True)
class Decision:
    """One validated decision, not yet written to the ledger."""

    type: DecisionType
    args: dict[str, Any] | None = None
    message: str | None = None


@dataclass(slots=True)
class Answer:
    """A well-formed resume value: decisions in order, invalid edits by position."""

    decisions: list[Decision]
    errors: dict[int, str]
    reviewer: str | None


def parse_answer(answer: Any, asked: Sequence[GatedCall]) -> Answer:
    """Check a resume value; return the decisions and the invalid edits by position.

    Raises:
        InvalidDecisionError: The value is malformed (not a schema problem of an edit).
    """
    raw = _decision_list(answer)
    if len(raw) != len(asked):
        raise InvalidDecisionError(
            f"expected {len(asked)} decision(s), one per action request in order, got {len(raw)}"
        )
    decisions: list[Decision] = []
    errors: dict[int, str] = {}
    for position, (item, gated) in enumerate(zip(raw, asked, strict=True)):
        where = f"decision {position} ({gated.tool.name}, {gated.call.get('id')})"
        if not isinstance(item, Mapping):
            raise InvalidDecisionError(f"{where}: must be an object, got {type(item).__name__}")
        kind = item.get("type")
        if kind == "approve":
            decisions.append(Decision("approve"))
        elif kind in ("reject", "respond"):
            message = item.get("message")
            if message is not None and not isinstance(message, str):
                raise InvalidDecisionError(f"{where}: a {kind} message must be a string")
            if kind == "respond" and not message:
                raise InvalidDecisionError(f"{where}: respond needs the message to answer with")
            decisions.append(Decision(kind, message=message))
        elif kind == "edit":
            new_args = _edited_args(item, gated, where)
            problem = schema_problem(gated.tool, new_args) or _key_problem(gated, new_args)
            if problem is not None:
                errors[position] = problem
            decisions.append(Decision("edit", args=new_args))
        else:
            raise InvalidDecisionError(
                f"{where}: unknown decision type {kind!r}; expected one of "
                + ", ".join(ALLOWED_DECISIONS)
            )
    return Answer(decisions, errors, _named_reviewer(answer))


def _edited_args(item: Mapping[str, Any], gated: GatedCall, where: str) -> dict[str, Any]:
    """The arguments of an edit decision (same tool, an object of arguments).

    Raises:
        InvalidDecisionError: The edit is malformed.
    """
    edited = item.get("edited_action")
    if not isinstance(edited, Mapping):
        raise InvalidDecisionError(f"{where}: an edit needs edited_action {{name, args}}")
    name = edited.get("name", gated.tool.name)
    if name != gated.tool.name:
        raise InvalidDecisionError(
            f"{where}: an edit cannot change the tool ({gated.tool.name!r} -> {name!r}); "
            "reject the call instead"
        )
    args = edited.get("args")
    if not isinstance(args, Mapping):
        raise InvalidDecisionError(
            f"{where}: edited_action.args must be an object, got {type(args).__name__}"
        )
    return dict(args)


def _key_problem(gated: GatedCall, args: dict[str, Any]) -> str | None:
    """Why an edit cannot be taken: its idempotency key cannot be derived."""
    if gated.spec.idempotency_key is None:
        return None
    try:
        str(gated.spec.idempotency_key(args))
    except Exception as exc:
        return f"cannot derive the idempotency key of the edited call: {exc!r}"
    return None


def _decision_list(answer: Any) -> list[Any]:
    """The decisions of a resume value (``{"decisions": [...]}`` or a bare list).

    Raises:
        InvalidDecisionError: For any other shape.
    """
    if isinstance(answer, list):
        return answer
    if isinstance(answer, Mapping):
        decisions = answer.get("decisions")
        if isinstance(decisions, list):
            return decisions
        raise InvalidDecisionError(
            'the resume value must be {"decisions": [...]} (HITLResponse) or a list of '
            f"decisions; got an object with keys {sorted(map(str, answer))}"
        )
    raise InvalidDecisionError(
        'the resume value must be {"decisions": [...]} (HITLResponse) or a list of '
        f"decisions; got {type(answer).__name__}"
    )


def _named_reviewer(answer: Any) -> str | None:
    """The top-level ``"reviewer"`` of a resume value, if any.

    Raises:
        InvalidDecisionError: When it is present but not a non-empty string.
    """
    if not isinstance(answer, Mapping) or answer.get("reviewer") is None:
        return None
    reviewer = answer["reviewer"]
    if not isinstance(reviewer, str) or not reviewer.strip():
        raise InvalidDecisionError("reviewer must be a non-empty string")
    return reviewer


__all__ = ["Answer", "Decision", "parse_answer"]

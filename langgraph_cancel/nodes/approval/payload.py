"""What the approval gate asks: the HITL-shaped interrupt value and the resume value's shape.

The interrupt value has the shape of LangChain's ``HumanInTheLoopMiddleware``
request (``HITLRequest``: ``action_requests`` and ``review_configs``), with a few
extra fields per action (effect kind, why it is permanent, idempotency key,
tool-call id, the delay window), so an interface that renders HITL interrupts
renders this one. The resume value is ``HITLResponse``-shaped; its JSON schema is
published with each interrupt.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, cast

from langchain_core.messages import ToolCall
from langchain_core.tools import BaseTool
from pydantic import BaseModel, PlainValidator, TypeAdapter, WithJsonSchema
from typing_extensions import TypedDict

from langgraph_cancel.effects import DelayWindow, EffectSpec
from langgraph_cancel.execution.review import (
    DEFAULT_DESCRIPTION_PREFIX,
    REVIEW_DECISIONS,
    DecisionType,
)
from langgraph_cancel.ordering import OrderingNote
from langgraph_cancel.types import EffectRecord

#: The decisions the gate accepts: LangChain's four (``respond`` answers in the tool's place).
ALLOWED_DECISIONS: tuple[DecisionType, ...] = REVIEW_DECISIONS


# ------------------------------------------------- the HITL-shaped payloads
class ApprovalActionRequest(TypedDict):
    """One call to decide on: LangChain's ``ActionRequest`` plus the effect's facts."""

    name: str
    args: dict[str, Any]
    description: str
    tool_call_id: str
    effect_id: str
    effect_kind: str
    why_permanent: str
    idempotency_key: str
    delay_window: NotRequired[DelayWindow]
    """How long the effect stays revocable after it is made (delay-window tools only)."""
    error: NotRequired[str]
    """Why the last edit of this call was refused (only when asking again)."""


class ApprovalReviewConfig(TypedDict):
    """LangChain's ``ReviewConfig``: the decisions allowed for one action."""

    action_name: str
    allowed_decisions: list[DecisionType]
    args_schema: NotRequired[dict[str, Any]]


class ApprovalError(TypedDict):
    """An edit the gate refused, by position in ``action_requests``."""

    index: int
    tool_call_id: str
    error: str


class ApprovalRequest(TypedDict):
    """The interrupt value: LangChain's ``HITLRequest`` (plus ``errors`` when asking again)."""

    action_requests: list[ApprovalActionRequest]
    review_configs: list[ApprovalReviewConfig]
    errors: NotRequired[list[ApprovalError]]
    error: NotRequired[str]
    """Why the last answer as a whole was refused (only when asking again)."""
    ordering: NotRequired[OrderingNote]
    """Irreversible effects of this run that already went out although read-only or
    reversible work of the batch is still to come (the plan is not irreversible-last)."""


class ApproveDecision(TypedDict):
    """Approve the call as it is."""

    type: Literal["approve"]


class EditedAction(TypedDict):
    """The reviewer's version of the call (same tool, new arguments)."""

    name: str
    args: dict[str, Any]


class EditDecision(TypedDict):
    """Approve the call with new arguments."""

    type: Literal["edit"]
    edited_action: EditedAction


class RejectDecision(TypedDict):
    """Refuse the call; the model is told, with the message."""

    type: Literal["reject"]
    message: NotRequired[str]


class RespondDecision(TypedDict):
    """Answer in the tool's place: the tool does not run; the text is its answer."""

    type: Literal["respond"]
    message: str


class ApprovalResponse(TypedDict):
    """The resume value: LangChain's ``HITLResponse`` plus an optional reviewer."""

    decisions: list[ApproveDecision | EditDecision | RejectDecision | RespondDecision]
    reviewer: NotRequired[str]


@functools.cache
def response_json_schema() -> dict[str, Any]:
    """The JSON schema of ``ApprovalResponse`` (published with each interrupt).

    Made once, on first use: building it costs a pydantic schema walk.
    """
    schema = TypeAdapter(ApprovalResponse).json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(value) for value in node]
        return node

    # Self-contained: the interrupt publishes it on its own, with no "$defs" around.
    return cast(dict[str, Any], inline(schema))


def response_schema() -> type[Any]:
    """What LangGraph checks a resume value with: anything is saved (the gate itself
    asks again about an invalid answer); the published shape is ``ApprovalResponse``."""
    return cast(
        "type[Any]",
        Annotated[Any, PlainValidator(lambda value: value), WithJsonSchema(response_json_schema())],
    )


@dataclass(slots=True)
class GatedCall:
    """One tool call the gate asks (or asked) about."""

    index: int
    call: ToolCall
    tool: BaseTool
    spec: EffectSpec
    record: EffectRecord


def approval_request(
    asked: Sequence[GatedCall],
    errors: Mapping[int, str],
    refused: str | None = None,
    *,
    description_prefix: str = DEFAULT_DESCRIPTION_PREFIX,
) -> ApprovalRequest:
    """The interrupt value: a ``HITLRequest`` plus our fields per action.

    Args:
        asked: The calls asked about, in order.
        errors: Why an earlier edit was refused, by position in ``asked``.
        refused: Why the earlier answer as a whole was refused.
        description_prefix: The first line of each action's description.
    """
    actions = [
        _action_request(gated, errors.get(position), description_prefix)
        for position, gated in enumerate(asked)
    ]
    configs = [_review_config(gated.tool) for gated in asked]
    value: ApprovalRequest = {"action_requests": actions, "review_configs": configs}
    if refused is not None:
        value["error"] = refused
    if errors:
        value["errors"] = [
            {"index": index, "tool_call_id": str(asked[index].call.get("id")), "error": error}
            for index, error in sorted(errors.items())
        ]
    return value


def _action_request(
    gated: GatedCall, error: str | None, description_prefix: str
) -> ApprovalActionRequest:
    """One action of the request (``error``: why the last edit of it was refused)."""
    rec = gated.record
    # What will run is the record's args; show them in the model's key order.
    call_args = gated.call.get("args")
    args = dict(call_args) if call_args == rec.args else dict(rec.args)
    description = (
        f"{description_prefix}\n\nTool: {gated.tool.name}\nArgs: {args}\n"
        f"Effect: {rec.kind.value}. {gated.spec.why_permanent()}"
    )
    action: ApprovalActionRequest = {
        "name": gated.tool.name,
        "args": args,
        "description": description,
        "tool_call_id": str(gated.call.get("id")),
        "effect_id": rec.effect_id,
        "effect_kind": rec.kind.value,
        "why_permanent": gated.spec.why_permanent(),
        "idempotency_key": rec.idempotency_key,
    }
    window = gated.spec.window()
    if window is not None:
        action["delay_window"] = window
    if error is not None:
        action["error"] = error
        action["description"] = f"The edit was invalid: {error}. Decide again.\n\n{description}"
    return action


def _review_config(tool: BaseTool) -> ApprovalReviewConfig:
    """The decisions allowed for one action, and the schema an edit must meet."""
    config: ApprovalReviewConfig = {
        "action_name": tool.name,
        "allowed_decisions": list(ALLOWED_DECISIONS),
    }
    schema = args_schema_of(tool)
    if schema is not None:
        config["args_schema"] = schema
    return config


def args_schema_of(tool: BaseTool) -> dict[str, Any] | None:
    """The JSON schema of the arguments a reviewer may edit, when the tool has one."""
    schema = tool.tool_call_schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            return schema.model_json_schema()
        except Exception:  # pragma: no cover - exotic field types
            return None
    return dict(schema) if isinstance(schema, dict) else None


__all__ = [
    "ALLOWED_DECISIONS",
    "DEFAULT_DESCRIPTION_PREFIX",
    "ApprovalActionRequest",
    "ApprovalError",
    "ApprovalRequest",
    "ApprovalResponse",
    "ApprovalReviewConfig",
    "ApproveDecision",
    "EditDecision",
    "EditedAction",
    "GatedCall",
    "RejectDecision",
    "RespondDecision",
    "approval_request",
    "args_schema_of",
    "response_json_schema",
    "response_schema",
]

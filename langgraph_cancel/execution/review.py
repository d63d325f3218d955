"""Asking a person about one call, where it stands: LangChain's per-call review shape.

A call that needs approval (``EffectSpec.needs_approval``: by default every
irreversible call) and has no decision yet is asked about with one
``interrupt()``, in the shape of ``HumanInTheLoopMiddleware``'s per-call mode (a
``ToolApprovalRequest``: ``type: "tool_approval"``, the call's id, name, args and
a description), plus the effect's facts (kind, why it is permanent, idempotency
key, effect id). The answer is one decision:

- ``{"type": "approve"}``: the call runs as it is;
- ``{"type": "edit", "edited_action": {"name": ..., "args": {...}}}``: it runs
  with the new arguments (same tool, valid for its schema); when they change the
  call's idempotency key the edited call is a new effect under the new key, and the
  original is recorded as replaced by it;
- ``{"type": "reject", "message": "..."}``: it does not run; the model is told;
- ``{"type": "respond", "message": "..."}``: it does not run; the reviewer's text
  is the tool's answer.

A bare decision or a ``HITLResponse`` with one decision both work. An invalid
answer is not an error of the run: the question is asked again, its payload
saying what was wrong (``error``), and nothing runs meanwhile. A top-level
``"reviewer"`` names who decided; otherwise the user a LangGraph server
authenticated, otherwise ``"human"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, NotRequired, TypedDict, cast

from langchain_core.messages import ToolCall
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import BaseModel, PlainValidator, ValidationError, WithJsonSchema

from langgraph_cancel.effects import DelayWindow, EffectSpec
from langgraph_cancel.errors import DuplicateIdempotencyKeyError, IllegalTransitionError
from langgraph_cancel.execution.identity import reused_call_id
from langgraph_cancel.execution.steps import Protocol, ledger_call
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ordering import OrderingNote
from langgraph_cancel.types import EffectRecord, EffectStatus, TransitionRequest, utcnow

DecisionType = Literal["approve", "edit", "reject", "respond"]
#: The decisions a per-call review accepts (LangChain's four).
REVIEW_DECISIONS: tuple[DecisionType, ...] = ("approve", "edit", "reject", "respond")
DEFAULT_DESCRIPTION_PREFIX = "Tool execution requires approval"
DEFAULT_REVIEWER = "human"
#: Marks approval records written by a per-call review (``approval["source"]``).
REVIEW_SOURCE = "tool_review"
_CONFIG_KEY_AUTH_USER_ID = "langgraph_auth_user_id"
_CONFIG_KEY_AUTH_USER = "langgraph_auth_user"


class ToolReviewRequest(TypedDict):
    """The interrupt value: LangChain's ``ToolApprovalRequest`` plus the effect's facts."""

    type: Literal["tool_approval"]
    tool_call_id: str
    name: str
    args: dict[str, Any]
    description: str
    effect_id: str
    effect_kind: str
    why_permanent: str
    idempotency_key: str
    allowed_decisions: list[DecisionType]
    delay_window: NotRequired[DelayWindow]
    error: NotRequired[str]
    ordering: NotRequired[OrderingNote]
    """Irreversible effects of this run that already went out before this read-only or
    reversible call (the plan is not irreversible-last)."""


@dataclass(frozen=True, slots=True)
class Review:
    """One checked decision about one call.

    Attributes:
        decision: approve, edit, reject or respond.
        args: The edited arguments (``edit`` only).
        message: The reviewer's text (``reject``: why; ``respond``: the answer).
        reviewer: Who decided, when the answer names them.
    """

    decision: DecisionType
    args: dict[str, Any] | None = None
    message: str | None = None
    reviewer: str | None = None

    @property
    def runs(self) -> bool:
        """Whether the call goes out (approve, edit)."""
        return self.decision in ("approve", "edit")


def review_request(
    tool: BaseTool,
    spec: EffectSpec,
    rec: EffectRecord,
    call_id: str,
    *,
    description_prefix: str = DEFAULT_DESCRIPTION_PREFIX,
) -> ToolReviewRequest:
    """The interrupt value asking about ``rec``'s call."""
    args = dict(rec.args)
    description = (
        f"{description_prefix}\n\nTool: {tool.name}\nArgs: {args}\n"
        f"Effect: {rec.kind.value}. {spec.why_permanent()}"
    )
    request: ToolReviewRequest = {
        "type": "tool_approval",
        "tool_call_id": call_id,
        "name": tool.name,
        "args": args,
        "description": description,
        "effect_id": rec.effect_id,
        "effect_kind": rec.kind.value,
        "why_permanent": spec.why_permanent(),
        "idempotency_key": rec.idempotency_key,
        "allowed_decisions": list(REVIEW_DECISIONS),
    }
    window = spec.window()
    if window is not None:
        request["delay_window"] = window
    return request


def review_schema(tool: BaseTool) -> type[Any]:
    """The answer's published shape (LangChain's four decisions).

    Any answer is saved: an invalid one is answered with the same question again
    (``parse_review``), so the run never fails on it.
    """
    return cast(
        "type[Any]",
        Annotated[
            Any, PlainValidator(lambda value: value), WithJsonSchema(_decision_json_schema(tool))
        ],
    )


def parse_review(answer: Any, tool: BaseTool, spec: EffectSpec, rec: EffectRecord) -> Review:
    """Check an answer about ``rec``'s call.

    Raises:
        ValueError: The answer is not a valid decision for this call (pydantic
            turns it into the ``ValidationError`` LangGraph refuses to save).
    """
    reviewer = _named_reviewer(answer)
    item = _single_decision(answer)
    kind = item.get("type")
    if kind == "approve":
        return Review("approve", reviewer=reviewer)
    if kind in ("reject", "respond"):
        message = item.get("message")
        if message is not None and not isinstance(message, str):
            raise ValueError(f"a {kind} message must be a string")
        if kind == "respond" and not message:
            raise ValueError("a respond decision needs the message to answer with")
        return Review(kind, message=message, reviewer=reviewer)
    if kind == "edit":
        return Review("edit", args=_edited_args(item, tool, spec, rec), reviewer=reviewer)
    raise ValueError(
        f"unknown decision type {kind!r}; expected one of " + ", ".join(REVIEW_DECISIONS)
    )


def _single_decision(answer: Any) -> Mapping[str, Any]:
    if isinstance(answer, Mapping) and isinstance(answer.get("decisions"), list):
        decisions = answer["decisions"]
        if len(decisions) != 1:
            raise ValueError(f"expected one decision for this call, got {len(decisions)}")
        answer = decisions[0]
    if not isinstance(answer, Mapping):
        raise ValueError(
            'a decision must be an object such as {"type": "approve"}; '
            f"got {type(answer).__name__}"
        )
    return answer


def _edited_args(
    item: Mapping[str, Any], tool: BaseTool, spec: EffectSpec, rec: EffectRecord
) -> dict[str, Any]:
    edited = item.get("edited_action")
    if not isinstance(edited, Mapping):
        raise ValueError("an edit needs edited_action {name, args}")
    name = edited.get("name", tool.name)
    if name != tool.name:
        raise ValueError(
            f"an edit cannot change the tool ({tool.name!r} -> {name!r}); reject the call instead"
        )
    args = edited.get("args")
    if not isinstance(args, Mapping):
        raise ValueError(f"edited_action.args must be an object, got {type(args).__name__}")
    new_args = dict(args)
    problem = schema_problem(tool, new_args)
    if problem is not None:
        raise ValueError(problem)
    if spec.idempotency_key is not None:
        try:
            str(spec.idempotency_key(new_args))
        except Exception as exc:
            raise ValueError(
                f"cannot derive the idempotency key of the edited call: {exc!r}"
            ) from None
    return new_args


def schema_problem(tool: BaseTool, args: Any) -> str | None:
    """Why ``args`` do not fit the tool's schema as the model sees it, or None.

    The model's schema (``tool_call_schema``) holds fewer checks than the tool's
    own (no validator methods, no injected arguments): what it refuses, the tool
    refuses too.
    """
    if not isinstance(args, dict):
        return f"arguments must be an object, got {type(args).__name__}"
    if tool.args_schema is None:
        # A single-input ``Tool`` parses its own input when invoked.
        return None
    schema = tool.tool_call_schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            schema.model_validate(args)
        except ValidationError as exc:
            return "; ".join(
                f"{'.'.join(str(part) for part in error.get('loc', ()))}: {error.get('msg')}"
                for error in exc.errors()
            )
    return None


def edited_key(spec: EffectSpec, rec: EffectRecord, args: dict[str, Any]) -> str | None:
    """The idempotency key of an edited call, when the edit changes it (else None)."""
    if spec.idempotency_key is None:
        return None  # derived from thread and tool-call id: no argument changes it
    key = str(spec.idempotency_key(args))
    return None if key == rec.idempotency_key else key


def key_change(spec: EffectSpec, rec: EffectRecord, args: dict[str, Any]) -> str | None:
    """Why an edit may not be approved as this call: it would need another idempotency key.

    The record keeps the key it was planned with, and the external system
    deduplicates by key, so an edit that moves the call to another key (say,
    another order) would be sent under the old one.
    """
    key_of = spec.idempotency_key
    if key_of is None:
        return None  # derived from thread and tool-call id: no argument changes it
    try:
        key = str(key_of(args))
    except Exception as exc:
        return f"cannot derive the idempotency key of the edited call: {exc!r}"
    if key != rec.idempotency_key:
        return (
            f"the edit changes the call's idempotency key ({rec.idempotency_key!r} -> "
            f"{key!r}), so it would be a different effect; reject this call and ask for a "
            "new one instead"
        )
    return None


def decision_request(
    rec: EffectRecord,
    review: Review,
    reviewer: str,
    *,
    source: str = REVIEW_SOURCE,
    original_args: dict[str, Any] | None = None,
    replaced_by: str | None = None,
) -> TransitionRequest:
    """The ledger write that records ``review`` (from ``pending_approval``).

    Args:
        rec: The call's record.
        review: The decision.
        reviewer: Who decided.
        source: Which review decided (kept in ``approval["source"]``).
        original_args: For the new effect of an edit that changed the key: the
            arguments of the call it replaces.
        replaced_by: For that call: the effect that replaces it (it is recorded
            rejected, and never runs).
    """
    approval: dict[str, Any] = {
        "decision": review.decision,
        "reviewer": reviewer,
        "at": utcnow().isoformat(),
        "source": source,
    }
    if review.message is not None:
        approval["message"] = review.message
    if review.decision == "edit":
        approval["original_args"] = dict(original_args if original_args is not None else rec.args)
    if replaced_by is not None:
        approval["replaced_by"] = replaced_by
    runs = review.runs and replaced_by is None
    return TransitionRequest(
        effect_id=rec.effect_id,
        to=EffectStatus.APPROVED if runs else EffectStatus.REJECTED,
        expected=frozenset({EffectStatus.PENDING_APPROVAL}),
        actor=reviewer,
        approval=approval,
        args=review.args if review.decision == "edit" and replaced_by is None else None,
        detail={"decision": review.decision},
    )


def replacement_steps(
    rec: EffectRecord,
    call: ToolCall,
    review: Review,
    reviewer: str,
    key: str,
    *,
    ledger_id: str,
    seq: int,
) -> Protocol[EffectRecord | str]:
    """An edit that changes the call's idempotency key: a new effect under the new key.

    The edited call is recorded under an id of its own (the call's id and a digest of
    the new arguments), approved; the original is recorded rejected, replaced by it.

    Returns:
        The new effect's record, or why the edit cannot be taken (its key is another
        effect's), for the question asked again.
    """
    args = dict(review.args or {})
    edited: ToolCall = {**call, "args": args}
    own = f"{ledger_id}~edit-{reused_call_id(edited).rsplit('~', 1)[1]}"
    try:
        new, _created = yield from ledger_call(
            Ledger.plan,
            thread_id=rec.thread_id,
            run_id=rec.run_id,
            tool_call_id=own,
            tool=rec.tool,
            kind=rec.kind,
            args=args,
            idempotency_key=key,
            seq=seq,
            status=EffectStatus.PENDING_APPROVAL,
            owner=rec.owner,
            actor=reviewer,
            detail={"replaces": rec.effect_id},
        )
    except DuplicateIdempotencyKeyError:
        holder = yield from ledger_call(Ledger.effect_by_key, key)
        where = f"effect {holder.effect_id}" if holder is not None else "another effect"
        return (
            f"the edited call's idempotency key {key!r} already belongs to {where}; edit it "
            "otherwise, or reject it"
        )
    if new.status is EffectStatus.PENDING_APPROVAL:
        approve = decision_request(
            new, replace(review, decision="edit"), reviewer, original_args=rec.args
        )
        new = yield from _moved_or_now(approve)
    gone = decision_request(rec, replace(review, args=None), reviewer, replaced_by=new.effect_id)
    yield from _moved_or_now(gone)
    return new


def _moved_or_now(req: TransitionRequest) -> Protocol[EffectRecord]:
    """``req``'s compare-and-set; the record as it is when someone moved it first."""
    try:
        return (
            yield from ledger_call(
                Ledger.transition,
                req.effect_id,
                req.to,
                expected=req.expected,
                actor=req.actor,
                approval=req.approval,
                args=req.args,
                detail=req.detail,
            )
        )
    except IllegalTransitionError:
        return (yield from ledger_call(Ledger.get_effect, req.effect_id))


def reviewer_of(config: RunnableConfig | None, runtime: Any = None) -> str:
    """The authenticated user a LangGraph server passes, else ``"human"``."""
    conf = (config or {}).get("configurable") or {}
    user_id = conf.get(_CONFIG_KEY_AUTH_USER_ID)
    if user_id:
        return str(user_id)
    candidates: list[Any] = [conf.get(_CONFIG_KEY_AUTH_USER)]
    server_info = getattr(runtime, "server_info", None) if runtime is not None else None
    if server_info is not None:
        candidates.append(getattr(server_info, "user", None))
    for user in candidates:
        identity = _identity(user)
        if identity:
            return identity
    return DEFAULT_REVIEWER


def _identity(user: Any) -> str | None:
    if user is None:
        return None
    identity = getattr(user, "identity", None)
    if identity is None and isinstance(user, Mapping):
        identity = user.get("identity")
    return str(identity) if identity else None


def _named_reviewer(answer: Any) -> str | None:
    if not isinstance(answer, Mapping) or answer.get("reviewer") is None:
        return None
    reviewer = answer["reviewer"]
    if not isinstance(reviewer, str) or not reviewer.strip():
        raise ValueError("reviewer must be a non-empty string")
    return reviewer


def _decision_json_schema(tool: BaseTool) -> dict[str, Any]:
    """The published shape of an answer: one of LangChain's four decisions."""
    args_schema: dict[str, Any] = {"type": "object"}
    schema = tool.tool_call_schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            args_schema = schema.model_json_schema()
        except Exception:  # pragma: no cover - exotic field types
            args_schema = {"type": "object"}
    message = {"type": "string"}
    return {
        "oneOf": [
            {"type": "object", "properties": {"type": {"const": "approve"}}, "required": ["type"]},
            {
                "type": "object",
                "properties": {
                    "type": {"const": "edit"},
                    "edited_action": {
                        "type": "object",
                        "properties": {"name": {"const": tool.name}, "args": args_schema},
                        "required": ["args"],
                    },
                },
                "required": ["type", "edited_action"],
            },
            {
                "type": "object",
                "properties": {"type": {"const": "reject"}, "message": message},
                "required": ["type"],
            },
            {
                "type": "object",
                "properties": {"type": {"const": "respond"}, "message": message},
                "required": ["type", "message"],
            },
        ]
    }


__all__ = [
    "DEFAULT_DESCRIPTION_PREFIX",
    "DEFAULT_REVIEWER",
    "REVIEW_DECISIONS",
    "REVIEW_SOURCE",
    "DecisionType",
    "Review",
    "ToolReviewRequest",
    "decision_request",
    "edited_key",
    "key_change",
    "parse_review",
    "replacement_steps",
    "review_request",
    "review_schema",
    "reviewer_of",
    "schema_problem",
]

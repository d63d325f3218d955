"""``ApprovalGate``: a human decides before any call that needs approval is dispatched.

Place it between the model and ``EffectToolNode``::

    builder.add_node("approval", ApprovalGate(tools))
    builder.add_node("tools", EffectToolNode(tools))
    builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
    builder.add_edge("approval", "tools")

For the unanswered tool calls of the last ``AIMessage`` that need approval
(``EffectSpec.needs_approval``: by default every irreversible call), the gate
records each in the ledger as ``pending_approval`` and raises one
``interrupt()`` whose value has the shape of LangChain's
``HumanInTheLoopMiddleware`` request (``HITLRequest``: ``action_requests`` and
``review_configs``), with a few extra fields per action (effect kind, why it is
permanent, idempotency key, tool-call id), so an interface that renders HITL
interrupts renders this one.

The resume value is ``HITLResponse``-shaped (``{"decisions": [...]}``, or a bare
list), one decision per action request, in order:

- ``{"type": "approve"}``: the record becomes ``approved``; the tool node dispatches it.
- ``{"type": "edit", "edited_action": {"name": ..., "args": {...}}}``: the new
  arguments are validated against the tool's schema. Invalid: the whole batch is
  asked again (a new interrupt whose action carries ``error``); nothing is
  approved. Valid: the record becomes ``approved`` with the edited arguments,
  and the ``AIMessage`` in state is rewritten (same id) to show them. An edit
  that changes the call's idempotency key (another order, say) is a new effect
  under the new key; the original is recorded rejected, replaced by it.
- ``{"type": "reject", "message": "..."}``: the record becomes ``rejected``;
  the tool node answers the call with ``Rejected by reviewer: <message>``,
  marked as LangChain's HITL marks the answers it gives.
- ``{"type": "respond", "message": "..."}``: the tool does not run; the text is
  its answer (recorded ``rejected``, with the text).

A malformed resume value (wrong count, unknown type, an edit naming another
tool or with non-object args) is asked about again too: the new interrupt's
``error`` says what was wrong, and nothing is decided meanwhile.

A top-level ``"reviewer"`` names who decided; otherwise the authenticated user
a LangGraph server passes, otherwise ``"human"``.

The gate never calls a tool and writes no ``ToolMessage``: LangGraph re-runs the
whole node on resume, and everything the gate does before ``interrupt()`` is
idempotent (``Ledger.plan`` returns the existing row for the same tool call).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NotRequired, cast

from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool
from langgraph._internal._runnable import RunnableCallable
from langgraph.runtime import Runtime
from langgraph.types import interrupt
from pydantic import BaseModel, PlainValidator, TypeAdapter, WithJsonSchema
from typing_extensions import TypedDict

from langgraph_cancel.effects import DelayWindow, EffectSpec, spec_of
from langgraph_cancel.errors import (
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    InvalidDecisionError,
)
from langgraph_cancel.execution.drive import drive_ledger
from langgraph_cancel.execution.identity import (
    call_turn,
    find_own_record,
    is_same_call,
    turn_call_id,
)
from langgraph_cancel.execution.review import (
    DEFAULT_DESCRIPTION_PREFIX,
    REVIEW_DECISIONS,
    DecisionType,
    Review,
    decision_request,
    edited_key,
    replacement_steps,
    reviewer_of,
    schema_problem,
)
from langgraph_cancel.ledger import Ledger, derive_idempotency_key
from langgraph_cancel.ordering import OrderingNote, ordering_note
from langgraph_cancel.runtime import RunScope, scope_for
from langgraph_cancel.types import EffectRecord, EffectStatus

logger = logging.getLogger("langgraph_cancel.approval")

#: The decisions the gate accepts: LangChain's four (``respond`` answers in the tool's place).
ALLOWED_DECISIONS: tuple[DecisionType, ...] = REVIEW_DECISIONS
#: Marks approval records written by the gate (``approval["source"]``).
APPROVAL_SOURCE = "approval_gate"
_DECIDED = frozenset({EffectStatus.APPROVED, EffectStatus.REJECTED})


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


_RESPONSE_SCHEMA: dict[str, Any] | None = None


def _response_json_schema() -> dict[str, Any]:
    """The JSON schema of ``ApprovalResponse`` (published with each interrupt)."""
    global _RESPONSE_SCHEMA
    if _RESPONSE_SCHEMA is None:
        schema = TypeAdapter(ApprovalResponse).json_schema()
        defs = schema.pop("$defs", {})

        def inline(node: Any) -> Any:
            if isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str) and ref.startswith("#/$defs/"):
                    return inline(defs[ref.removeprefix("#/$defs/")])
                return {k: inline(v) for k, v in node.items()}
            if isinstance(node, list):
                return [inline(v) for v in node]
            return node

        # Self-contained: the interrupt publishes it on its own, with no "$defs" around.
        _RESPONSE_SCHEMA = cast(dict[str, Any], inline(schema))
    return _RESPONSE_SCHEMA


@dataclass(slots=True)
class _Gated:
    """One tool call the gate asks (or asked) about."""

    index: int
    call: ToolCall
    tool: BaseTool
    spec: EffectSpec
    record: EffectRecord


@dataclass(slots=True)
class _Decision:
    """One validated decision, not yet written to the ledger."""

    type: DecisionType
    args: dict[str, Any] | None = None
    message: str | None = None


@dataclass(slots=True)
class _Answer:
    """A well-formed resume value: decisions in order, invalid edits by position."""

    decisions: list[_Decision]
    errors: dict[int, str]
    reviewer: str | None


def _response_schema() -> type[Any]:
    """What LangGraph checks a resume value with: anything is saved (the gate itself
    asks again about an invalid answer); the published shape is ``ApprovalResponse``."""
    return cast(
        "type[Any]",
        Annotated[
            Any, PlainValidator(lambda value: value), WithJsonSchema(_response_json_schema())
        ],
    )


@dataclass(slots=True)
class _Batch:
    """What one pass of the gate found: the message, the calls to ask about, the rest."""

    scope: RunScope
    message: AIMessage | None
    asked: list[_Gated] = field(default_factory=list)
    #: Calls edited in an earlier pass, by tool-call id, with their approved args.
    decided_args: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The run's irreversible effects that went out before this batch's other work.
    ordering: OrderingNote | None = None

    @property
    def pending(self) -> list[_Gated]:
        """The asked calls whose records still wait for a decision."""
        return [g for g in self.asked if g.record.status is EffectStatus.PENDING_APPROVAL]


class ApprovalGate(RunnableCallable):
    """A node that interrupts for a human decision before calls that need approval.

    Args:
        tools: The tools of the ``EffectToolNode`` behind the gate (``BaseTool``
            or callables, classified with ``effect(...)``), or that node itself.
        name: Node name.
        messages_key: State key holding the messages.
        ledger: The ledger (or its URL); default: found through the run's config,
            exactly as ``EffectToolNode`` finds it.
        description_prefix: First line of each action request's description
            (as in ``HumanInTheLoopMiddleware``).
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]] | Any,
        *,
        name: str = "approval",
        messages_key: str = "messages",
        ledger: Ledger | str | None = None,
        description_prefix: str = DEFAULT_DESCRIPTION_PREFIX,
    ) -> None:
        super().__init__(self._func, self._afunc, name=name, trace=False)
        by_name: Mapping[str, BaseTool] | None = getattr(tools, "tools_by_name", None)
        items: list[BaseTool | Callable[..., Any]] = (
            list(by_name.values()) if by_name is not None else list(tools)
        )
        self.tools_by_name: dict[str, BaseTool] = {}
        for item in items:
            base = item if isinstance(item, BaseTool) else as_tool(item)
            if not isinstance(base, BaseTool):  # pragma: no cover - as_tool overloads
                raise TypeError(f"cannot make a tool of {item!r}")
            self.tools_by_name[base.name] = base
        self.specs: dict[str, EffectSpec] = {
            tool_name: spec_of(t) for tool_name, t in self.tools_by_name.items()
        }
        self.messages_key = messages_key
        self.ledger = ledger
        self.description_prefix = description_prefix

    # ------------------------------------------------------------ LangGraph
    def _func(self, input: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        scope = scope_for(config, ledger=self.ledger, new_run=False)
        batch = self._prepare(input, scope)
        answer = self._ask(batch)
        return self._finish(input, batch, answer, reviewer_of(config, runtime))

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        scope = await asyncio.to_thread(scope_for, config, ledger=self.ledger, new_run=False)
        batch = await asyncio.to_thread(self._prepare, input, scope)
        # interrupt() reads the node's config from a context variable: call it here,
        # in the node's own context, not in a worker thread.
        answer = self._ask(batch)
        reviewer = reviewer_of(config, runtime)
        return await asyncio.to_thread(self._finish, input, batch, answer, reviewer)

    # ------------------------------------------------------------- planning
    def _prepare(self, input: Any, scope: RunScope) -> _Batch:
        """Find the calls needing approval and record them ``pending_approval``."""
        messages = _messages_of(input, self.messages_key)
        at = next(
            (n for n in range(len(messages) - 1, -1, -1) if isinstance(messages[n], AIMessage)),
            -1,
        )
        message = cast(AIMessage, messages[at]) if at >= 0 else None
        batch = _Batch(scope=scope, message=message)
        if message is None or not message.tool_calls:
            return batch
        # Answers to this message's calls (ids may repeat across turns: look after it).
        answered = {m.tool_call_id for m in messages[at + 1 :] if isinstance(m, ToolMessage)}
        for index, call in enumerate(message.tool_calls):
            call_id = call.get("id")
            if not call_id or call_id in answered:
                continue
            turn = call_turn(messages[: at + 1], str(call_id))
            gated = self._gate(index, call, scope, turn)
            if gated is None:
                continue
            rec = gated.record
            if rec.status is EffectStatus.PENDING_APPROVAL or (
                rec.status in _DECIDED and _decided_by_gate(rec)
            ):
                batch.asked.append(gated)
            approval = rec.approval or {}
            runs = rec
            if approval.get("replaced_by"):
                runs = scope.ledger.get_effect(str(approval["replaced_by"]))
            if approval.get("decision") == "edit" and runs.args != call.get("args"):
                # Edited in an earlier pass whose state update was lost (a crash after
                # the ledger write): keep the message in step with what will run.
                batch.decided_args[call_id] = dict(runs.args)
        if batch.pending:
            upcoming = [
                self.specs[str(call.get("name"))].kind
                for call in message.tool_calls
                if call.get("id") not in answered and call.get("name") in self.specs
            ]
            batch.ordering = ordering_note(scope.ledger.run_effects(scope.run_id), upcoming)
        return batch

    def _gate(self, index: int, call: ToolCall, scope: RunScope, turn: int) -> _Gated | None:
        """The ledger record of one call that needs approval; None when it does not.

        ``turn``: how many earlier model messages asked for its tool-call id."""
        name = call.get("name") or ""
        tool = self.tools_by_name.get(name)
        if tool is None:
            return None  # unknown tool: the tool node answers it with an error
        args = call.get("args")
        if schema_problem(tool, args) is not None or not isinstance(args, dict):
            return None  # malformed: the tool node records it failed, never dispatched
        spec = self.specs[name]
        # Under an id of its own when its tool-call id names another call's record:
        # the tool node finds the call's record the same way.
        call_id, existing = find_own_record(
            scope.ledger, scope.thread_id, call, turn_call_id(str(call["id"]), turn)
        )
        if existing is not None and not is_same_call(existing, call):
            return None  # no record of its own to ask about: the tool node refuses it
        if existing is not None:
            if existing.status is EffectStatus.PLANNED and _needs_approval(spec, args, name):
                # Planned by someone else (an earlier, gate-less pass): ask about it now.
                try:
                    existing = scope.ledger.transition(
                        existing.effect_id,
                        EffectStatus.PENDING_APPROVAL,
                        expected=[EffectStatus.PLANNED],
                        actor=APPROVAL_SOURCE,
                    )
                except IllegalTransitionError:
                    existing = scope.ledger.get_effect(existing.effect_id)
            return _Gated(index, call, tool, spec, existing)
        if not _needs_approval(spec, args, name):
            return None
        try:
            key = (
                str(spec.idempotency_key(args))
                if spec.idempotency_key is not None
                else derive_idempotency_key(scope.thread_id, call_id)
            )
        except Exception:
            return None  # the tool node records the key error as a failed call
        try:
            rec, _created = scope.ledger.plan(
                thread_id=scope.thread_id,
                run_id=scope.run_id,
                tool_call_id=call_id,
                tool=name,
                kind=spec.kind,
                args=args,
                idempotency_key=key,
                seq=index,
                status=EffectStatus.PENDING_APPROVAL,
                owner=scope.owner,
                actor=APPROVAL_SOURCE,
                detail={"reason": "approval required"},
            )
        except DuplicateIdempotencyKeyError:
            # Another call (maybe this batch's) holds the key: this one can never run,
            # so nobody is asked; the tool node records it and tells the model why.
            return None
        return _Gated(index, call, tool, spec, rec)

    # ---------------------------------------------------------------- asking
    def _ask(self, batch: _Batch) -> _Answer | None:
        """Interrupt until the reviewer's answer is valid; None when nothing is pending.

        An invalid answer (a malformed value, an edit off the tool's schema) is asked
        about again: a new interrupt whose payload says what was wrong. On resume
        LangGraph re-runs the node and hands the earlier answers back in order, so
        this loop replays to the same point before reaching the new answer.
        """
        if not batch.pending:
            return None
        errors: dict[int, str] = {}
        refused: str | None = None
        schema = _response_schema()
        while True:
            request = self._request(batch.asked, errors, refused)
            if batch.ordering is not None:
                request["ordering"] = batch.ordering
            answer = interrupt(request, response_schema=schema)
            try:
                parsed = self._parse(answer, batch.asked)
            except InvalidDecisionError as exc:
                errors, refused = {}, str(exc)
                continue
            if not parsed.errors:
                return parsed
            errors, refused = parsed.errors, None

    def _request(
        self, asked: Sequence[_Gated], errors: Mapping[int, str], refused: str | None = None
    ) -> ApprovalRequest:
        """The interrupt value: a ``HITLRequest`` plus our fields per action."""
        actions: list[ApprovalActionRequest] = []
        configs: list[ApprovalReviewConfig] = []
        for position, g in enumerate(asked):
            rec = g.record
            # What will run is the record's args; show them in the model's key order.
            call_args = g.call.get("args")
            args = dict(call_args) if call_args == rec.args else dict(rec.args)
            description = (
                f"{self.description_prefix}\n\nTool: {g.tool.name}\nArgs: {args}\n"
                f"Effect: {rec.kind.value}. {g.spec.why_permanent()}"
            )
            action: ApprovalActionRequest = {
                "name": g.tool.name,
                "args": args,
                "description": description,
                "tool_call_id": str(g.call.get("id")),
                "effect_id": rec.effect_id,
                "effect_kind": rec.kind.value,
                "why_permanent": g.spec.why_permanent(),
                "idempotency_key": rec.idempotency_key,
            }
            window = g.spec.window()
            if window is not None:
                action["delay_window"] = window
            if position in errors:
                action["error"] = errors[position]
                action["description"] = (
                    f"The edit was invalid: {errors[position]}. Decide again.\n\n{description}"
                )
            actions.append(action)
            config: ApprovalReviewConfig = {
                "action_name": g.tool.name,
                "allowed_decisions": list(ALLOWED_DECISIONS),
            }
            schema = _args_schema(g.tool)
            if schema is not None:
                config["args_schema"] = schema
            configs.append(config)
        value: ApprovalRequest = {"action_requests": actions, "review_configs": configs}
        if refused is not None:
            value["error"] = refused
        if errors:
            value["errors"] = [
                {"index": i, "tool_call_id": str(asked[i].call.get("id")), "error": e}
                for i, e in sorted(errors.items())
            ]
        return value

    def _parse(self, answer: Any, asked: Sequence[_Gated]) -> _Answer:
        """Check a resume value; return the decisions and the invalid edits by position.

        Raises:
            InvalidDecisionError: The value is malformed (not a schema problem of an edit).
        """
        raw = _decision_list(answer)
        if len(raw) != len(asked):
            raise InvalidDecisionError(
                f"expected {len(asked)} decision(s), one per action request in order, "
                f"got {len(raw)}"
            )
        decisions: list[_Decision] = []
        errors: dict[int, str] = {}
        for position, (item, g) in enumerate(zip(raw, asked, strict=True)):
            where = f"decision {position} ({g.tool.name}, {g.call.get('id')})"
            if not isinstance(item, Mapping):
                raise InvalidDecisionError(f"{where}: must be an object, got {type(item).__name__}")
            kind = item.get("type")
            if kind == "approve":
                decisions.append(_Decision("approve"))
            elif kind in ("reject", "respond"):
                message = item.get("message")
                if message is not None and not isinstance(message, str):
                    raise InvalidDecisionError(f"{where}: a {kind} message must be a string")
                if kind == "respond" and not message:
                    raise InvalidDecisionError(f"{where}: respond needs the message to answer with")
                decisions.append(_Decision(kind, message=message))
            elif kind == "edit":
                edited = item.get("edited_action")
                if not isinstance(edited, Mapping):
                    raise InvalidDecisionError(
                        f"{where}: an edit needs edited_action {{name, args}}"
                    )
                name = edited.get("name", g.tool.name)
                if name != g.tool.name:
                    raise InvalidDecisionError(
                        f"{where}: an edit cannot change the tool ({g.tool.name!r} -> {name!r}); "
                        "reject the call instead"
                    )
                args = edited.get("args")
                if not isinstance(args, Mapping):
                    raise InvalidDecisionError(
                        f"{where}: edited_action.args must be an object, got {type(args).__name__}"
                    )
                new_args = dict(args)
                problem = schema_problem(g.tool, new_args) or _key_problem(g, new_args)
                if problem is not None:
                    errors[position] = problem
                decisions.append(_Decision("edit", args=new_args))
            else:
                raise InvalidDecisionError(
                    f"{where}: unknown decision type {kind!r}; expected one of "
                    + ", ".join(ALLOWED_DECISIONS)
                )
        return _Answer(decisions, errors, _named_reviewer(answer))

    # -------------------------------------------------------------- deciding
    def _finish(
        self,
        input: Any,
        batch: _Batch,
        answer: _Answer | None,
        default_reviewer: str,
    ) -> Any:
        """Record the decisions and rewrite the message with edited args."""
        edited = dict(batch.decided_args)
        if answer is not None:
            reviewer = answer.reviewer or default_reviewer
            for g, d in zip(batch.asked, answer.decisions, strict=True):
                rec = self._record(batch.scope, g, d, reviewer)
                if rec.status is EffectStatus.APPROVED:
                    edited[str(g.call.get("id"))] = dict(rec.args)
        return self._update(input, batch.message, edited)

    def _record(
        self, scope: RunScope, gated: _Gated, decision: _Decision, reviewer: str
    ) -> EffectRecord:
        if gated.record.status is not EffectStatus.PENDING_APPROVAL:
            return gated.record  # decided in an earlier pass: never asked twice
        review = Review(
            decision.type, args=decision.args, message=decision.message, reviewer=reviewer
        )
        key = (
            edited_key(gated.spec, gated.record, decision.args)
            if decision.args is not None
            else None
        )
        if key is not None:
            replaced = drive_ledger(
                scope.ledger,
                replacement_steps(
                    gated.record,
                    gated.call,
                    review,
                    reviewer,
                    key,
                    ledger_id=gated.record.tool_call_id,
                    seq=gated.index,
                ),
            )
            if isinstance(replaced, EffectRecord):
                return replaced
            # The new key is another effect's: the call stays as it was, and the tool
            # node answers it as refused.
            review = Review("reject", message=replaced, reviewer=reviewer)
        req = decision_request(gated.record, review, reviewer, source=APPROVAL_SOURCE)
        try:
            return scope.ledger.transition(
                req.effect_id,
                req.to,
                expected=req.expected,
                actor=req.actor,
                approval=req.approval,
                args=req.args,
                detail=req.detail,
            )
        except IllegalTransitionError:
            # Moved meanwhile (a cancel dropped it): the tool node replays what it is.
            return scope.ledger.get_effect(gated.record.effect_id)

    def _update(
        self, input: Any, message: AIMessage | None, args_by_call: Mapping[str, dict[str, Any]]
    ) -> Any:
        """A state update replacing the message (same id) when any call's args changed."""
        if message is None or not args_by_call:
            return None
        calls: list[ToolCall] = []
        changed = False
        for call in message.tool_calls:
            new_args = args_by_call.get(call.get("id") or "")
            if new_args is not None and new_args != call.get("args"):
                calls.append(cast(ToolCall, {**call, "args": new_args}))
                changed = True
            else:
                calls.append(call)
        if not changed:
            return None
        rewritten = message.model_copy(update={"tool_calls": calls})
        if isinstance(input, list):
            return [rewritten]
        return {self.messages_key: [rewritten]}


# ---------------------------------------------------------------- helpers
def _messages_of(input: Any, key: str) -> list[AnyMessage]:
    if isinstance(input, list):
        return input
    if isinstance(input, dict):
        return list(input.get(key) or [])
    if isinstance(input, BaseModel):
        return list(getattr(input, key, None) or [])
    return []


def _needs_approval(spec: EffectSpec, args: dict[str, Any], name: str) -> bool:
    try:
        return spec.needs_approval(args)
    except Exception:
        logger.warning(
            "requires_approval of %r raised; asking for approval (fail safe)", name, exc_info=True
        )
        return True


def _key_problem(gated: _Gated, args: dict[str, Any]) -> str | None:
    """Why an edit cannot be taken: its idempotency key cannot be derived."""
    if gated.spec.idempotency_key is None:
        return None
    try:
        str(gated.spec.idempotency_key(args))
    except Exception as exc:
        return f"cannot derive the idempotency key of the edited call: {exc!r}"
    return None


def _decided_by_gate(rec: EffectRecord) -> bool:
    return (rec.approval or {}).get("source") == APPROVAL_SOURCE


def _args_schema(tool: BaseTool) -> dict[str, Any] | None:
    schema = tool.tool_call_schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            return schema.model_json_schema()
        except Exception:  # pragma: no cover - exotic field types
            return None
    return dict(schema) if isinstance(schema, dict) else None


def _decision_list(answer: Any) -> list[Any]:
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


__all__ = [
    "ALLOWED_DECISIONS",
    "APPROVAL_SOURCE",
    "DEFAULT_DESCRIPTION_PREFIX",
    "ApprovalActionRequest",
    "ApprovalError",
    "ApprovalGate",
    "ApprovalRequest",
    "ApprovalResponse",
    "ApprovalReviewConfig",
    "ApproveDecision",
    "EditDecision",
    "EditedAction",
    "RejectDecision",
]

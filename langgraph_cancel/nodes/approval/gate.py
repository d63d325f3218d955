"""The approval gate node: records the calls that need a decision, asks, records the answer.

One pass of the node: find the unanswered tool calls of the last ``AIMessage``
that need approval and record each ``pending_approval`` (``Ledger.plan`` returns
the existing row for the same call, so a re-run on resume changes nothing);
raise one ``interrupt()`` for all of them (``payload.py``) until the answer is
valid (``decisions.py``); record each decision; rewrite the message (same id)
with edited arguments.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool
from langgraph.runtime import Runtime, get_runtime
from langgraph.types import interrupt
from pydantic import BaseModel

from langgraph_cancel.effects import EffectSpec, spec_of
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
    Review,
    decision_request,
    edited_key,
    replacement_steps,
    reviewer_of,
    schema_problem,
)
from langgraph_cancel.ledger import Ledger, derive_idempotency_key
from langgraph_cancel.nodes.approval.decisions import Answer, Decision, parse_answer
from langgraph_cancel.nodes.approval.payload import (
    GatedCall,
    approval_request,
    response_schema,
)
from langgraph_cancel.ordering import OrderingNote, ordering_note
from langgraph_cancel.runtime import RunScope, scope_for
from langgraph_cancel.types import EffectRecord, EffectStatus

logger = logging.getLogger("langgraph_cancel.approval")

#: Marks approval records written by the gate (``approval["source"]``).
APPROVAL_SOURCE = "approval_gate"
_DECIDED = frozenset({EffectStatus.APPROVED, EffectStatus.REJECTED})


@dataclass(slots=True)
class _GatePass:
    """What one pass of the gate found: the message, the calls to ask about, the rest."""

    scope: RunScope
    message: AIMessage | None
    asked: list[GatedCall] = field(default_factory=list)
    #: Calls edited in an earlier pass, by tool-call id, with their approved args.
    decided_args: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The run's irreversible effects that went out before this batch's other work.
    ordering: OrderingNote | None = None

    @property
    def pending(self) -> list[GatedCall]:
        """The asked calls whose records still wait for a decision."""
        return [
            gated for gated in self.asked if gated.record.status is EffectStatus.PENDING_APPROVAL
        ]


class ApprovalGate(RunnableLambda[Any, Any]):
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
        super().__init__(self._func, afunc=self._afunc, name=name)
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
    def _func(self, input: Any, config: RunnableConfig) -> Any:
        scope = scope_for(config, ledger=self.ledger, new_run=False)
        batch = self._prepare(input, scope)
        answer = self._ask(batch)
        return self._finish(input, batch, answer, reviewer_of(config, _graph_runtime()))

    async def _afunc(self, input: Any, config: RunnableConfig) -> Any:
        scope = await asyncio.to_thread(scope_for, config, ledger=self.ledger, new_run=False)
        batch = await asyncio.to_thread(self._prepare, input, scope)
        # interrupt() reads the node's config from a context variable: call it here,
        # in the node's own context, not in a worker thread.
        answer = self._ask(batch)
        reviewer = reviewer_of(config, _graph_runtime())
        return await asyncio.to_thread(self._finish, input, batch, answer, reviewer)

    # ------------------------------------------------------------- planning
    def _prepare(self, input: Any, scope: RunScope) -> _GatePass:
        """Find the calls needing approval and record them ``pending_approval``."""
        messages = _messages_of(input, self.messages_key)
        last_ai = next(
            (
                position
                for position in range(len(messages) - 1, -1, -1)
                if isinstance(messages[position], AIMessage)
            ),
            -1,
        )
        message = cast(AIMessage, messages[last_ai]) if last_ai >= 0 else None
        batch = _GatePass(scope=scope, message=message)
        if message is None or not message.tool_calls:
            return batch
        # Answers to this message's calls (ids may repeat across turns: look after it).
        answered = {
            later.tool_call_id
            for later in messages[last_ai + 1 :]
            if isinstance(later, ToolMessage)
        }
        for index, call in enumerate(message.tool_calls):
            call_id = call.get("id")
            if not call_id or call_id in answered:
                continue
            turn = call_turn(messages[: last_ai + 1], str(call_id))
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

    def _gate(self, index: int, call: ToolCall, scope: RunScope, turn: int) -> GatedCall | None:
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
                existing = _ask_about_planned(scope, existing)
            return GatedCall(index, call, tool, spec, existing)
        if not _needs_approval(spec, args, name):
            return None
        rec = _plan_pending(scope, spec, index, call_id, name, args)
        return None if rec is None else GatedCall(index, call, tool, spec, rec)

    # ---------------------------------------------------------------- asking
    def _ask(self, batch: _GatePass) -> Answer | None:
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
        schema = response_schema()
        while True:
            request = approval_request(
                batch.asked, errors, refused, description_prefix=self.description_prefix
            )
            if batch.ordering is not None:
                request["ordering"] = batch.ordering
            answer = interrupt(request, response_schema=schema)
            try:
                parsed = parse_answer(answer, batch.asked)
            except InvalidDecisionError as exc:
                errors, refused = {}, str(exc)
                continue
            if not parsed.errors:
                return parsed
            errors, refused = parsed.errors, None

    # -------------------------------------------------------------- deciding
    def _finish(
        self,
        input: Any,
        batch: _GatePass,
        answer: Answer | None,
        default_reviewer: str,
    ) -> Any:
        """Record the decisions and rewrite the message with edited args."""
        edited = dict(batch.decided_args)
        if answer is not None:
            reviewer = answer.reviewer or default_reviewer
            for gated, decision in zip(batch.asked, answer.decisions, strict=True):
                rec = self._record(batch.scope, gated, decision, reviewer)
                if rec.status is EffectStatus.APPROVED:
                    edited[str(gated.call.get("id"))] = dict(rec.args)
        return self._update(input, batch.message, edited)

    def _record(
        self, scope: RunScope, gated: GatedCall, decision: Decision, reviewer: str
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
def _graph_runtime() -> Runtime[Any] | None:
    """The graph run's ``Runtime`` (it knows a server's authenticated user); None
    outside a graph."""
    try:
        return get_runtime()
    except RuntimeError:
        return None


def _ask_about_planned(scope: RunScope, planned: EffectRecord) -> EffectRecord:
    """A call planned without approval, moved to ``pending_approval`` (or as it now is)."""
    try:
        return scope.ledger.transition(
            planned.effect_id,
            EffectStatus.PENDING_APPROVAL,
            expected=[EffectStatus.PLANNED],
            actor=APPROVAL_SOURCE,
        )
    except IllegalTransitionError:
        return scope.ledger.get_effect(planned.effect_id)


def _plan_pending(
    scope: RunScope,
    spec: EffectSpec,
    index: int,
    call_id: str,
    name: str,
    args: dict[str, Any],
) -> EffectRecord | None:
    """A new call's record, ``pending_approval``; None when it can never run.

    A key that cannot be derived, or that another call holds, is the tool node's
    to record and tell the model about: nobody is asked about such a call.
    """
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
    return rec


def _messages_of(input: Any, key: str) -> list[AnyMessage]:
    """The messages of the node's input (a list, a dict, or a pydantic state)."""
    if isinstance(input, list):
        return input
    if isinstance(input, dict):
        return list(input.get(key) or [])
    if isinstance(input, BaseModel):
        return list(getattr(input, key, None) or [])
    return []


def _needs_approval(spec: EffectSpec, args: dict[str, Any], name: str) -> bool:
    """Whether the call needs approval; a rule that raises asks (fail safe)."""
    try:
        return spec.needs_approval(args)
    except Exception:
        logger.warning(
            "requires_approval of %r raised; asking for approval (fail safe)", name, exc_info=True
        )
        return True


def _decided_by_gate(rec: EffectRecord) -> bool:
    """Whether the record's decision was made through this gate (not another reviewer)."""
    return (rec.approval or {}).get("source") == APPROVAL_SOURCE


__all__ = ["APPROVAL_SOURCE", "ApprovalGate"]

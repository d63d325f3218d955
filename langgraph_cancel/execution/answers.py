"""What a tool call's answer is, from its ledger record, without calling anything.

A re-run of a tool node (an interrupt, a crash, a retry policy) answers every
call the ledger already settled from the record: the same ``ToolMessage`` (or
the same ``Command`` a tool returned) the model was, or would have been, given.
Answers given late (a call an earlier run left unanswered, and new input since)
are placed right after their calls, where chat APIs require them.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Literal, cast

from langchain_core.messages import AIMessage, RemoveMessage, ToolCall, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from langgraph_cancel.types import EffectRecord, EffectStatus

NOT_RUN_CANCELLED = "Not run: the run was cancelled before this call was dispatched."
ABANDONED_READ = (
    "Not completed: the run was cancelled while this read-only call was in flight; "
    "it was abandoned (no side effect)."
)
#: The ``lc_source`` of an answer given in a reviewer's name (as LangChain's HITL sets it).
REVIEW_NOTICE_SOURCE = "hitl_interrupt_decision"
#: How a replayed output that is not a plain ``ToolMessage`` is kept in a record.
_OUTPUT_KEY = "output"
_SERDE = JsonPlusSerializer()
_ANSWERED = frozenset(
    {
        EffectStatus.COMMITTED,
        EffectStatus.COMPENSATING,
        EffectStatus.COMPENSATED,
        EffectStatus.COMPENSATION_FAILED,
        # A call its provider holds for a delay window answered with its handle.
        EffectStatus.SCHEDULED,
    }
)


def message_payload(message: ToolMessage) -> dict[str, Any]:
    """What the ledger keeps of a tool's answer, JSON-safe."""
    payload: dict[str, Any] = {"content": message.content, "status": message.status}
    if message.artifact is not None:
        payload["artifact"] = message.artifact
    return cast(dict[str, Any], json.loads(json.dumps(payload, default=str)))


def outcome_payload(output: Any) -> dict[str, Any]:
    """What the ledger keeps of a successful call's output (``replay_message`` reads it).

    A ``ToolMessage`` is kept as readable JSON. Anything else a tool may return
    through ``ToolNode`` (a ``Command``, a list of commands and messages) is kept
    whole, serialized as LangGraph serializes checkpoints, so a replay returns
    the same state update, not a placeholder.
    """
    if isinstance(output, ToolMessage):
        return message_payload(output)
    kind, data = _SERDE.dumps_typed(output)
    summary = _summary(output)
    return {
        "content": summary,
        "status": "success",
        _OUTPUT_KEY: {"serde": kind, "data": base64.b64encode(data).decode("ascii")},
    }


def _summary(output: Any) -> str:
    """A readable line for a report or the CLI: the tool's message text, if it has one."""
    items = output if isinstance(output, list) else [output]
    for item in items:
        if isinstance(item, ToolMessage):
            return _text(item.content)
        update = getattr(item, "update", None)
        messages = update.get("messages") if isinstance(update, dict) else update
        if isinstance(messages, list):
            for message in messages:
                if isinstance(message, ToolMessage):
                    return _text(message.content)
    return f"(tool returned {type(output).__name__})"


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, default=str)


def result_text(result: Any) -> str:
    """A reconcile hook's result as the text of the call's answer."""
    return result if isinstance(result, str) else json.dumps(result, default=str)


def replayed_output(rec: EffectRecord) -> Any | None:
    """The ``Command`` (or list) a committed call returned, if that is what it returned."""
    result = rec.result
    if rec.status not in _ANSWERED or not isinstance(result, dict):
        return None
    kept = result.get(_OUTPUT_KEY)
    if not isinstance(kept, dict):
        return None
    data = base64.b64decode(str(kept.get("data", "")))
    return _SERDE.loads_typed((str(kept.get("serde")), data))


def replay_message(rec: EffectRecord, call: ToolCall | None = None) -> ToolMessage:
    """The ToolMessage a recorded effect stands for, without calling anything."""
    tool_call_id = call["id"] if call is not None and call.get("id") else rec.tool_call_id
    status: Literal["success", "error"] = "success"
    content: Any
    artifact = None
    if rec.held:
        content = (
            f"Scheduled: held until {rec.release_at.isoformat() if rec.release_at else '?'}, "
            "then sent; a stop before then withdraws it."
        )
    elif rec.status in _ANSWERED:
        result = rec.result
        if isinstance(result, dict) and "content" in result:
            content = result["content"]
            artifact = result.get("artifact")
            status = "error" if result.get("status") == "error" else "success"
        else:
            content = result_text(result)
    elif rec.status is EffectStatus.FAILED:
        content, status = rec.error or "Error: the call failed.", "error"
    elif rec.status is EffectStatus.REJECTED:
        # A reviewer's "respond" answers in the tool's place: a success, as in LangChain.
        responded = (rec.approval or {}).get("decision") == "respond"
        content, status = rejection_text(rec), "success" if responded else "error"
    elif rec.status is EffectStatus.DROPPED:
        content, status = rec.error or NOT_RUN_CANCELLED, "error"
    elif rec.status is EffectStatus.UNKNOWN:
        content = (
            f"Outcome unknown: {rec.error or 'no answer from the external system'}. "
            f"Owner: {rec.owner}. Next action: {rec.next_action}. Do not retry this call."
        )
        status = "error"
    elif rec.status is EffectStatus.REVOKED:
        content = "Revoked inside its delay window: it never became permanent."
        status = "error"
    elif rec.status is EffectStatus.NOT_APPLIED:
        content, status = "Not applied: the external system has no record of this call.", "error"
    else:
        content, status = f"Call is {rec.status.value}.", "error"
    message = ToolMessage(
        content=content, name=rec.tool, tool_call_id=tool_call_id, status=status, artifact=artifact
    )
    if rec.status is EffectStatus.REJECTED:
        # The mark LangChain's HumanInTheLoopMiddleware puts on the answer it gives in
        # a reviewer's name (a client tells such answers from the tool's own by it).
        # (``add_notification_metadata`` sets these keys, but is typed for HumanMessage.)
        decision = str((rec.approval or {}).get("decision") or "reject")
        kwargs = {**message.additional_kwargs, "lc_source": REVIEW_NOTICE_SOURCE}
        kwargs["lc_data"] = {"decision": decision}
        message = message.model_copy(update={"additional_kwargs": kwargs})
    return message


def rejection_text(rec: EffectRecord) -> str:
    """The answer to a call a reviewer refused (or answered in the tool's place)."""
    approval = rec.approval or {}
    if approval.get("decision") == "respond":
        return str(approval.get("message") or "")
    note = approval.get("message")
    return f"Rejected by reviewer: {note}" if note else "Rejected by reviewer."


def replay(rec: EffectRecord, call: ToolCall | None = None) -> Any:
    """What a settled call answers on a re-run: its ``Command`` if it returned one."""
    output = replayed_output(rec)
    return output if output is not None else replay_message(rec, call)


def is_error_answer(answer: Any) -> bool:
    """True for a ``ToolMessage`` that reports an error (the tool's, or ``ToolNode``'s)."""
    return isinstance(answer, ToolMessage) and answer.status == "error"


def answer_text(answer: Any) -> str:
    """The words of an answer, for a record's ``error``."""
    if isinstance(answer, ToolMessage):
        return result_text(answer.content)
    return str(outcome_payload(answer)["content"])


def not_run(call: ToolCall, text: str = NOT_RUN_CANCELLED) -> ToolMessage:
    """The answer for a call the cancel stopped before it was dispatched."""
    return ToolMessage(
        text, name=call.get("name"), tool_call_id=str(call.get("id")), status="error"
    )


def answers_end(messages: list[Any], answers: list[ToolMessage]) -> int:
    """Where ``answers`` go: right after the message with their calls, and after the
    answers it already has."""
    answered = {answer.tool_call_id for answer in answers}
    at = max(
        (
            index
            for index, message in enumerate(messages)
            if isinstance(message, AIMessage)
            and any(call.get("id") in answered for call in message.tool_calls)
        ),
        default=len(messages) - 1,
    )
    end = at + 1
    while end < len(messages) and isinstance(messages[end], ToolMessage):
        end += 1
    return end


def with_answers(messages: list[Any], answers: list[ToolMessage]) -> list[Any]:
    """The history with ``answers`` right after the calls they answer."""
    end = answers_end(messages, answers)
    return [*messages[:end], *answers, *messages[end:]]


def placed_answers(
    messages: list[Any], answers: list[ToolMessage], reply: list[Any] | None = None
) -> list[Any]:
    """The ``add_messages`` update that puts ``answers`` right after their calls, and
    ``reply`` (a node's own new messages) after everything.

    Appended when that is their place; otherwise the history is rewritten in order
    (``add_messages`` keeps a message it has seen where it first was)."""
    after = list(reply or [])
    if not answers:
        return after
    if not after and answers_end(messages, answers) >= len(messages):
        return list(answers)
    return [RemoveMessage(id=REMOVE_ALL_MESSAGES), *with_answers(messages, answers), *after]


__all__ = [
    "ABANDONED_READ",
    "NOT_RUN_CANCELLED",
    "REVIEW_NOTICE_SOURCE",
    "answer_text",
    "answers_end",
    "is_error_answer",
    "message_payload",
    "not_run",
    "outcome_payload",
    "placed_answers",
    "rejection_text",
    "replay",
    "replay_message",
    "replayed_output",
    "result_text",
    "with_answers",
]

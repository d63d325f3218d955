"""Bad-input fuzzing: malformed tool calls never crash a graph.

Two doors a bad tool call comes through, each fuzzed with Hypothesis on a real
compiled graph (``add_cancellation``, ``ApprovalGate``, ``EffectToolNode``)
whose tools reach the refund agent's fake providers:

1. **A model's tool calls** (``AIMessage.tool_calls``, as LangChain parses them:
   a name string, an argument object, an optional id): unknown and empty
   names, missing, empty and duplicate ids, arguments off the schema (missing,
   extra, wrong types), huge strings and deep nesting.
2. **Raw ``Send`` payloads** (``{"__type": "tool_call_with_context", ...}``, the
   prebuilt agents' per-call fan-out), which nothing validates before the
   tool node: any JSON value in any field, arguments that are not an object,
   ids that are not strings, and a stop pressed before they run.

The graph must never fail with anything but our typed errors
(``LangGraphCancelError``); no ledger row is lost (every call with an id has
exactly one record, answered by a ToolMessage), the audit trail of every
record is one unbroken chain ending in its status, and nothing the reviewer
did not approve reached a provider. The answers a person gives are fuzzed in
``test_fuzz_answers.py``; the strategies and checks are in
``fuzz_inputs_helpers.py``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, Send

from chaos_harness import CallSpec, World, call_args
from fuzz_inputs_helpers import (
    _agent_graph,
    _empty_plan,
    _records,
    assert_audit_consistent,
    assert_left_resumable,
    assert_nothing_unapproved_ran,
    fresh,
    model_tool_calls,
    raw_payloads,
    run_graph,
)
from hypothesis_profiles import examples
from langgraph_cancel import EffectStatus, EffectToolNode, add_cancellation, request_cancel

# ---------------------------------------------------------------------------- 1. model calls
REFUND = call_args(CallSpec("cx_refund", 0), 0)
BIG_REFUND = call_args(CallSpec("cx_refund", 1), 0)  # needs approval


@pytest.mark.timeout(900)
@settings(max_examples=examples(ci=80, dev=25))
@given(
    batch=model_tool_calls(),
    backend=st.sampled_from(("memory", "sqlite")),
    approve=st.booleans(),
    cancel_first=st.booleans(),
)
# Found by this test: a stop pressed while the model answered crashed the cancel node
# (the run stayed "cancelling", its calls unanswered) when a call's idempotency-key
# function rejected its arguments, or when two calls shared the tool's key.
@example(
    batch=[
        {"name": "cx_refund", "args": {"order_id": "o-97", "amount": 5.0, "tag": "c0"}, "id": "x"}
    ],
    backend="memory",
    approve=True,
    cancel_first=True,
)
@example(
    batch=[
        {"name": "cx_refund", "args": REFUND, "id": "x1"},
        {"name": "cx_refund", "args": REFUND, "id": "x2"},
    ],
    backend="sqlite",
    approve=True,
    cancel_first=True,
)
# Found by this test: a tool-call id repeated in a batch, then another call with the
# same declared key, on a tool that needs approval: the approval gate's plan hit the
# key and the run ended in DuplicateIdempotencyKeyError.
@example(
    batch=[
        {"name": "cx_refund", "args": BIG_REFUND, "id": "call_a"},
        {"name": "cx_refund", "args": BIG_REFUND, "id": "call_a"},
        {"name": "cx_refund", "args": BIG_REFUND, "id": "call_b"},
    ],
    backend="memory",
    approve=False,
    cancel_first=False,
)
@example(
    batch=[
        {"name": "cx_refund", "args": BIG_REFUND, "id": "call_a"},
        {"name": "cx_refund", "args": BIG_REFUND, "id": "call_a"},
        {"name": "cx_refund", "args": BIG_REFUND, "id": "call_b"},
    ],
    backend="sqlite",
    approve=True,
    cancel_first=False,
)
# Found by this test when a reused id got a record of its own: the same id on a good
# call and a malformed one, in one batch. Each now has its record.
@example(
    batch=[
        {"name": "cx_lookup", "args": {}, "id": "call_e3e70682c209"},
        {"name": "cx_lookup", "args": {}, "id": "call_e3e70682c209"},
        {"name": "cx_lookup", "args": {"order_id": "o-93", "tag": "c2"}, "id": "c0"},
        {"name": "cx_lookup", "args": {}, "id": "c0"},
    ],
    backend="memory",
    approve=False,
    cancel_first=False,
)
# Found by a 200-example soak: the same nameless call twice in a cancelled run. The
# cancel recorded the first as tool "(none)", then compared the second's raw name ("")
# with that record and gave the copy a record of its own. Both sides now compare the
# call as recorded (``recorded_call``).
@example(
    batch=[
        {"name": "cx_lookup", "args": {}, "id": "call_e3e70682c209"},
        {"name": "cx_lookup", "args": {}, "id": "call_e3e70682c209"},
        {"name": "", "args": {}, "id": "call_f728b4fa4248"},
        {"name": "", "args": {}, "id": "call_f728b4fa4248"},
    ],
    backend="memory",
    approve=False,
    cancel_first=True,
)
# Found by this test: fuzzed arguments that name no order make the lookup raise its own
# error, which ToolNode's default error handling (and so the node's) lets through.
@example(
    batch=[
        {
            "name": "cx_lookup",
            "args": {"order_id": "a" * 10_000, "tag": "c0"},
            "id": "call_e3e70682c209",
        }
    ],
    backend="memory",
    approve=False,
    cancel_first=False,
)
def test_model_tool_calls_never_crash_nor_lose_a_row(
    batch: list[dict[str, Any]], backend: str, approve: bool, cancel_first: bool
) -> None:
    with fresh(backend) as (root, saver):
        world = World(root, plan=_empty_plan())
        graph = _agent_graph(world, saver, batch, cancel_first=cancel_first)
        cfg = {"configurable": {"thread_id": world.thread_id}}
        out = run_graph(graph, {"messages": [HumanMessage("go")]}, cfg)
        for _ in range(5):
            if "__interrupt__" not in out:
                break
            value = out["__interrupt__"][0].value
            decision = {"type": "approve"} if approve else {"type": "reject", "message": "no"}
            # The gate asks about its batch; a call that reached the tool node with no
            # decision (its key was another call's when the gate ran) is asked there.
            asked = (
                len(value.get("action_requests", [])) if value.get("type") != "tool_approval" else 1
            )
            out = run_graph(graph, Command(resume={"decisions": [decision] * asked}), cfg)
        assert "error" not in out, out["error"]
        assert "__interrupt__" not in out
        records = _records(saver.ledger, world.thread_id)
        if "tool_error" in out:
            # The fuzzed arguments name no order: the tool raised its own exception.
            assert not cancel_first
            assert_left_resumable(world, saver.ledger, records)
            return
        messages = graph.get_state(cfg).values["messages"]
        ai = next(m for m in messages if isinstance(m, AIMessage))
        with_ids = {c["id"] for c in ai.tool_calls if c.get("id")}
        # Every call with an id has a record: under its id, or under ``id~<digest>`` when
        # the id already names another call's (other tool or arguments). The same call
        # twice shares one ...
        owners = {r if r in with_ids else re.sub(r"~[0-9a-f]{12}$", "", r) for r in records}
        assert owners == with_ids, (sorted(records), with_ids)
        distinct = {
            (c["id"], c["name"], json.dumps(c["args"], sort_keys=True, default=str))
            for c in ai.tool_calls
            if c.get("id")
        }
        assert len(records) <= len(distinct), (sorted(records), distinct)
        # ... and is answered; a call without an id, which no answer can name, gets an
        # error message from the tool node (a cancelled run never reaches it).
        answered = [m for m in messages if isinstance(m, ToolMessage)]
        assert {m.tool_call_id for m in answered if m.tool_call_id} == with_ids
        if not cancel_first:
            assert len(answered) == len(ai.tool_calls)
        for message in answered:
            if not message.tool_call_id:
                assert message.status == "error"
        assert_audit_consistent(saver.ledger, records)
        assert_nothing_unapproved_ran(world, records)
        for rec in records.values():
            assert rec.settled or rec.status is EffectStatus.UNKNOWN, rec
            event(f"record: {rec.status.value}")
        run = saver.ledger.latest_run(world.thread_id)
        if cancel_first:
            assert run.status.value == "cancelled"
            assert all(r.status is EffectStatus.DROPPED for r in records.values()), records
            keys = world.providers.truth()["keys"]
            assert all(v["attempts"] == 0 for v in keys.values()), keys
        else:
            assert run.status.value == "completed"


# ---------------------------------------------------------------------------- 2. Send payloads
def _send_graph(world: World, saver: Any, payloads: list[Any], cancel_first: bool) -> Any:
    node = EffectToolNode(world.tools(), handle_tool_errors=True)

    def agent(state: MessagesState) -> dict[str, Any]:
        if cancel_first:
            request_cancel(saver, world.thread_id, reason="stop", requested_by="fuzz")
        return {"messages": [AIMessage("fanning out")]}

    def fan_out(state: MessagesState) -> Any:
        return [
            Send("tools", {"__type": "tool_call_with_context", "tool_call": p, "state": state})
            for p in payloads
        ]

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", fan_out, ["tools"])
    builder.add_edge("tools", END)
    return add_cancellation(builder).compile(checkpointer=saver)


@pytest.mark.timeout(900)
@settings(max_examples=examples(ci=80, dev=25))
@given(
    payloads=raw_payloads(),
    backend=st.sampled_from(("memory", "sqlite")),
    cancel_first=st.booleans(),
)
# Found by this test: a payload without an "id" key crashed the node (KeyError) before
# its "cannot be tracked" answer; a name that is not a string crashed it (unhashable
# lookup, ToolMessage validation), in the tool node and in the cancel path alike.
@example(payloads=[{"name": "cx_lookup"}], backend="memory", cancel_first=False)
@example(
    payloads=[{"name": {}, "id": "C"}, {"name": [None], "args": [], "id": "D"}, {"id": 7}],
    backend="sqlite",
    cancel_first=False,
)
@example(
    payloads=[{"name": ["x"], "args": {}, "id": "C"}, {"name": "cx_refund", "args": {}, "id": 5}],
    backend="memory",
    cancel_first=True,
)
def test_raw_send_payloads_never_crash_nor_lose_a_row(
    payloads: list[Any], backend: str, cancel_first: bool
) -> None:
    with fresh(backend) as (root, saver):
        world = World(root, plan=_empty_plan())
        graph = _send_graph(world, saver, payloads, cancel_first)
        cfg = {"configurable": {"thread_id": world.thread_id}}
        out = run_graph(graph, {"messages": [HumanMessage("go")]}, cfg)
        for _ in range(len(payloads) + 1):
            # A call that needs approval is asked about where it stands (one question per
            # Send task): the reviewer refuses each, and nothing unapproved runs.
            pending = out.get("__interrupt__") or ()
            if not pending:
                break
            refuse = {"type": "reject", "message": "fuzz"}
            out = run_graph(graph, Command(resume={i.id: refuse for i in pending}), cfg)
        assert "__interrupt__" not in out
        records = _records(saver.ledger, world.thread_id)
        string_ids = {p["id"] for p in payloads if isinstance(p.get("id"), str) and p["id"]}
        if "error" in out:
            # A typed refusal is allowed; rows written before it must still be whole.
            assert set(records) <= {str(p.get("id")) for p in payloads}
        else:
            # Every payload with a usable id has exactly one record.
            assert string_ids <= set(records), (sorted(string_ids), sorted(records))
        assert_audit_consistent(saver.ledger, records)
        assert_nothing_unapproved_ran(world, records)
        run = saver.ledger.latest_run(world.thread_id)
        if cancel_first:
            assert run.status.value == "cancelled"
            keys = world.providers.truth()["keys"]
            assert all(v["attempts"] == 0 for v in keys.values()), keys
            for rec in records.values():
                assert rec.status in (EffectStatus.DROPPED, EffectStatus.FAILED), rec
        for rec in records.values():
            event(f"record: {rec.status.value}")

"""Bad-input fuzzing: malformed tool calls and approval answers never crash a graph.

Three doors a bad input comes through, each fuzzed with Hypothesis on a real
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
3. **Approval resume values** given to ``ApprovalGate`` (``Command(resume=...)``):
   any JSON value, wrong counts, unknown decision types, edits of other tools,
   edits with off-schema or key-changing arguments, odd reviewers.

The graph must never fail with anything but our typed errors
(``LangGraphCancelError``, e.g. ``InvalidDecisionError``); no ledger row is
lost (every call with an id has exactly one record, answered by a
ToolMessage), the audit trail of every record is one unbroken chain ending in
its status, and nothing the reviewer did not approve reached a provider.

Inputs stay within what LangGraph's own checkpoint serializer can carry
(integers within 64 bits, nesting below ~250 levels): beyond that any
checkpointed graph fails in LangGraph before our nodes see the input.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, event, example, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command, Send

from chaos_harness import TOOL_NAMES, CallSpec, World, call_args, open_saver
from hypothesis_profiles import examples
from langgraph_cancel import (
    ApprovalGate,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    InvalidDecisionError,
    LangGraphCancelError,
    add_cancellation,
    request_cancel,
)
from langgraph_cancel.demo.providers.errors import ProviderError
from langgraph_cancel.ledger import Ledger, derive_effect_id
from langgraph_cancel.types import UNDISPATCHED_STATUSES, EffectRecord

INT64 = 2**63 - 1

# ---------------------------------------------------------------------------- strategies
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-INT64, INT64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)


def _nest(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


huge_strings = st.builds(
    lambda n, c: c * n, st.integers(10_000, 120_000), st.sampled_from(("a", "€", "\x00", "'\"{"))
)
deep_values = st.integers(20, 200).map(_nest)
odd_values = st.one_of(json_values, huge_strings, deep_values)


def _weighted(*options: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Pick one strategy by weight, then draw from it."""
    table = [strategy for weight, strategy in options for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


#: Mostly real tool names (so calls get past the name check), sometimes anything.
names = _weighted(
    (7, st.sampled_from(TOOL_NAMES)),
    (2, st.sampled_from(("", "nope", "cx_refund ", "CX_EMAIL", "cancel", "__end__"))),
    (1, st.text(max_size=12)),
)
#: Mostly usable ids (unique or deliberately repeated), sometimes none or empty.
ids = _weighted(
    (6, st.uuids().map(lambda u: f"call_{u.hex[:12]}")),
    (1, st.sampled_from(("dup", "c0", "c1"))),
    (1, st.text(min_size=1, max_size=40)),
    (1, st.none()),
    (1, st.just("")),
)


@st.composite
def argument_objects(draw: st.DrawFn, name: str, call_number: int) -> dict[str, Any]:
    """The arguments of a call: the tool's valid ones, mutated, or anything."""
    if name not in TOOL_NAMES or draw(st.integers(0, 4)) == 0:
        return draw(st.dictionaries(st.text(max_size=10), odd_values, max_size=5))
    args = call_args(CallSpec(name, draw(st.sampled_from((0, 1)))), call_number)
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.sampled_from(("drop", "retype", "extra", "nothing")))
        key = draw(st.sampled_from(sorted(args))) if args else None
        if how == "drop" and key is not None:
            args.pop(key)
        elif how == "retype" and key is not None:
            args[key] = draw(odd_values)
        elif how == "extra":
            args[draw(st.text(max_size=10))] = draw(odd_values)
    return args


@st.composite
def model_tool_calls(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A batch of tool calls as LangChain parses them from a model's answer."""
    out: list[dict[str, Any]] = []
    for call_number in range(draw(st.integers(1, 6))):
        if out and draw(st.integers(0, 3)) == 0:
            # The model repeats an earlier call: same arguments, same or another id.
            again = dict(draw(st.sampled_from(out)))
            again["id"] = draw(st.one_of(st.just(again["id"]), ids))
            out.append(again)
            continue
        name = draw(names)
        call_id = draw(ids)
        out.append({"name": name, "args": draw(argument_objects(name, call_number)), "id": call_id})
    return out


@st.composite
def raw_payloads(draw: st.DrawFn) -> list[Any]:
    """Tool calls as a hand-written Send fan-out might carry them: any value in any field."""
    out = []
    for call_number in range(draw(st.integers(1, 5))):
        call: dict[str, Any] = {}
        name = draw(st.one_of(names, json_values))
        if draw(st.booleans()) or name in TOOL_NAMES:
            call["name"] = name
        args: Any = (
            draw(argument_objects(name, call_number))
            if isinstance(name, str) and draw(st.booleans())
            else draw(odd_values)
        )
        if draw(st.integers(0, 5)):
            call["args"] = args
        call_id = draw(st.one_of(ids, json_values))
        if draw(st.integers(0, 5)):
            call["id"] = call_id
        if draw(st.booleans()):
            call["type"] = draw(st.sampled_from(("tool_call", "function", None)))
        out.append(call)
    return out


def _decision_for(name: str, call_number: int) -> st.SearchStrategy[Any]:
    edited = st.one_of(
        st.builds(dict, st.just(call_args(CallSpec(name, 1), call_number))),
        argument_objects(name, call_number),
        json_values,
    )
    return _weighted(
        (3, st.just({"type": "approve"})),
        (
            2,
            st.fixed_dictionaries(
                {"type": st.just("reject")},
                optional={"message": _weighted((3, st.text(max_size=30)), (1, json_values))},
            ),
        ),
        (
            3,
            st.fixed_dictionaries(
                {"type": st.just("edit")},
                optional={
                    "edited_action": _weighted(
                        (
                            5,
                            st.fixed_dictionaries(
                                {"args": edited},
                                optional={
                                    "name": _weighted(
                                        (4, st.just(name)), (1, names), (1, json_values)
                                    )
                                },
                            ),
                        ),
                        (1, json_values),
                    )
                },
            ),
        ),
        (
            1,
            st.fixed_dictionaries(
                {"type": st.one_of(st.sampled_from(("respond", "Approve")), json_values)}
            ),
        ),
        (1, json_values),
    )


#: The batch the approval fuzz asks about, by tool: three need approval, one does not.
GATED_BATCH = (
    CallSpec("cx_refund", 1),
    CallSpec("cx_post"),
    CallSpec("cx_email"),
    CallSpec("cx_check"),
)
ASKED = [(n, c.tool) for n, c in enumerate(GATED_BATCH) if c.tool != "cx_email"]


@st.composite
def resume_values(draw: st.DrawFn) -> Any:
    """A resume value: mostly near the HITL shape, sometimes anything at all."""
    shape = draw(st.sampled_from(("list3", "list3", "dict3", "dict3", "count", "any")))
    if shape == "any":
        # Not None: ``Command(resume=None)`` fails inside LangGraph 1.2.24 itself
        # (UnboundLocalError in ``_loop.py``), before any node runs.
        return draw(json_values.filter(lambda v: v is not None))
    if shape == "count":
        decisions: list[Any] = draw(st.lists(_decision_for("cx_post", 1), max_size=6))
    else:
        decisions = [draw(_decision_for(name, n)) for n, name in ASKED]
    if shape.startswith("list"):
        return decisions
    value: dict[str, Any] = {"decisions": decisions}
    if draw(st.booleans()):
        value["reviewer"] = draw(st.one_of(st.just("alice"), json_values))
    return value


# ---------------------------------------------------------------------------- checks
def _records(ledger: Ledger, thread_id: str) -> dict[str, EffectRecord]:
    return {e.tool_call_id: e for e in ledger.effects(thread_id)}


def assert_audit_consistent(ledger: Ledger, records: dict[str, EffectRecord]) -> None:
    """Each record's audit trail is one chain from its creation to its current status."""
    for rec in records.values():
        trail = ledger.history(rec.effect_id)
        assert trail, f"{rec.effect_id} has no audit row"
        assert trail[0].from_status is None, trail[0]
        for before, after in itertools.pairwise(trail):
            assert after.from_status is before.to_status, (rec.effect_id, trail)
        assert trail[-1].to_status is rec.status, (rec.effect_id, trail[-1], rec.status)
        dispatched = any(t.to_status is EffectStatus.DISPATCHED for t in trail)
        assert (rec.dispatched_at is not None) == dispatched, rec


def assert_nothing_unapproved_ran(world: World, records: dict[str, EffectRecord]) -> None:
    """A call that needed approval reached its provider only if a reviewer approved it."""
    keys = world.providers.truth()["keys"]
    for rec in records.values():
        if keys.get(rec.idempotency_key, {}).get("attempts", 0) == 0:
            continue
        spec = world_specs(world)[rec.tool]
        if spec.needs_approval(rec.args):
            assert rec.approval and rec.approval.get("decision") in ("approve", "edit"), rec


_SPECS: dict[int, Any] = {}


def world_specs(world: World) -> dict[str, Any]:
    from langgraph_cancel.effects import spec_of

    found = _SPECS.get(id(world))
    if found is None:
        found = _SPECS[id(world)] = {t.name: spec_of(t) for t in world.tools()}
    return found


@contextmanager
def fresh(backend: str) -> Iterator[tuple[Path, Any]]:
    with (
        tempfile.TemporaryDirectory(prefix="fuzz-") as tmp,
        open_saver(backend, Path(tmp)) as saver,
    ):
        yield Path(tmp), saver


def run_graph(graph: Any, inp: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Invoke; only our typed errors may surface (returned as ``{"error": exc}``), besides
    a tool's own exception, which ``ToolNode``'s default error handling lets through
    (returned as ``{"tool_error": exc}``)."""
    try:
        out: dict[str, Any] = graph.invoke(inp, cfg)
    except LangGraphCancelError as exc:
        event(f"typed error: {type(exc).__name__}")
        return {"error": exc}
    except ProviderError as exc:
        event(f"the tool's own error: {type(exc).__name__}")
        return {"tool_error": exc}
    return out


# ---------------------------------------------------------------------------- 1. model calls
def _agent_graph(
    world: World, saver: Any, batch: list[dict[str, Any]], *, cancel_first: bool = False
) -> Any:
    """agent -> approval -> tools -> agent; the agent answers ``batch`` once, then "done".

    ``cancel_first``: the stop is pressed while the model writes the batch.
    """
    tools = world.tools()
    node = EffectToolNode(tools)

    def agent(state: MessagesState) -> dict[str, Any]:
        n_ai = sum(isinstance(m, AIMessage) for m in state["messages"])
        if n_ai == 0:
            if cancel_first:
                request_cancel(saver, world.thread_id, reason="stop", requested_by="fuzz")
            return {"messages": [AIMessage("", tool_calls=batch)]}
        return {"messages": [AIMessage("done")]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("approval", ApprovalGate(node))
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
    builder.add_edge("approval", "tools")
    builder.add_edge("tools", "agent")
    return add_cancellation(builder).compile(checkpointer=saver)


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
            # A tool raised its own exception (the fuzzed arguments name no order), and
            # the node let it through as ToolNode does by default: the run stays live,
            # to be resumed, and nothing of the batch went out unrecorded.
            assert not cancel_first
            assert saver.ledger.latest_run(world.thread_id).status.value == "running"
            assert_audit_consistent(saver.ledger, records)
            assert_nothing_unapproved_ran(world, records)
            for rec in records.values():
                assert rec.settled or rec.status in UNDISPATCHED_STATUSES, rec
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


def _empty_plan() -> Any:
    from chaos_harness import Plan

    return Plan(turns=())


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


# ---------------------------------------------------------------------------- 3. approvals
def _gated_graph(world: World, saver: Any) -> Any:
    batch = [
        {"name": spec.tool, "args": call_args(spec, n), "id": f"c{n}"}
        for n, spec in enumerate(GATED_BATCH)
    ]
    return _agent_graph(world, saver, batch)


def _decided(records: dict[str, EffectRecord]) -> dict[str, Any]:
    return {k: (r.status, r.approval, r.args) for k, r in records.items()}


@pytest.mark.timeout(900)
@settings(max_examples=examples(ci=80, dev=25))
@given(
    answers=st.lists(resume_values(), min_size=1, max_size=4),
    backend=st.sampled_from(("memory", "sqlite")),
)
def test_approval_resume_values_never_crash_nor_lose_a_row(
    answers: list[Any], backend: str
) -> None:
    with fresh(backend) as (root, saver):
        world = World(root, plan=_empty_plan())
        graph = _gated_graph(world, saver)
        cfg = {"configurable": {"thread_id": world.thread_id}}
        ledger = saver.ledger
        out = run_graph(graph, {"messages": [HumanMessage("go")]}, cfg)
        assert "__interrupt__" in out
        asked = [a["tool_call_id"] for a in out["__interrupt__"][0].value["action_requests"]]
        assert asked == [f"c{n}" for n, _ in ASKED]
        for value in answers:
            if "__interrupt__" not in out:
                break
            before = _decided(_records(ledger, world.thread_id))
            out = run_graph(graph, Command(resume=value), cfg)
            if "error" in out:
                # A malformed answer is refused whole: nothing decided, the question stands.
                assert isinstance(out["error"], InvalidDecisionError), out["error"]
                assert _decided(_records(ledger, world.thread_id)) == before
                snapshot = graph.get_state(cfg)
                assert snapshot.next == ("approval",) and len(snapshot.interrupts) == 1
                out = {"__interrupt__": snapshot.interrupts}
                event("refused: InvalidDecisionError")
            elif "__interrupt__" in out:
                event("asked again")
            else:
                event("decided")
        if "__interrupt__" in out:  # a well-formed answer settles what is still open
            open_request_count = len(out["__interrupt__"][0].value["action_requests"])
            out = run_graph(graph, Command(resume=[{"type": "approve"}] * open_request_count), cfg)
        assert "error" not in out and "__interrupt__" not in out, out
        records = _records(ledger, world.thread_id)
        assert sorted(records) == [f"c{n}" for n in range(len(GATED_BATCH))]
        assert_audit_consistent(ledger, records)
        assert_nothing_unapproved_ran(world, records)
        keys = world.providers.truth()["keys"]
        for cid, rec in records.items():
            approval = rec.approval or {}
            if rec.status is EffectStatus.REJECTED:
                assert approval.get("decision") == "reject"
                assert keys.get(rec.idempotency_key, {}).get("attempts", 0) == 0
            if approval.get("decision") == "edit":
                assert approval["original_args"] == call_args(
                    GATED_BATCH[int(cid[1:])], int(cid[1:])
                )
            if rec.kind is not EffectKind.READ_ONLY:
                assert keys.get(rec.idempotency_key, {}).get("executions", 0) <= 1
            assert rec.settled, rec
        messages = graph.get_state(cfg).values["messages"]
        answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
        assert answered == set(records)
        # What the message history shows is what ran (edited args included).
        ai = next(m for m in messages if isinstance(m, AIMessage))
        for call in ai.tool_calls:
            assert call["id"] is not None
            rec = records[call["id"]]
            if rec.approval and rec.approval.get("decision") == "edit":
                assert _same(call["args"], rec.args), (call["args"], rec.args)
        assert derive_effect_id(world.thread_id, "c0") == records["c0"].effect_id


def _same(left: Any, right: Any) -> bool:
    """Equality that treats NaN as equal to itself (JSON round trips keep NaN)."""
    if (
        isinstance(left, float)
        and isinstance(right, float)
        and math.isnan(left)
        and math.isnan(right)
    ):
        return True
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(
            _same(x, y) for x, y in zip(left, right, strict=True)
        )
    return bool(left == right)


# ---------------------------------------------------------------------------- 4. reconcile answers
@st.composite
def reconcile_answers(draw: st.DrawFn, effect_id: str) -> Any:
    """A person's answer to "did these happen?": near the documented shape, or anything."""
    decision = st.fixed_dictionaries(
        {
            "effect_id": _weighted((4, st.just(effect_id)), (1, json_values)),
            "decision": _weighted(
                (4, st.sampled_from(("committed", "not_applied", "unknown"))), (1, json_values)
            ),
        },
        optional={
            "result": json_values,
            "owner": _weighted((3, st.just("ops")), (1, json_values)),
            "next_action": _weighted((3, st.just("call the bank")), (1, json_values)),
            "reviewer": json_values,
        },
    )
    decisions = _weighted((4, st.lists(decision, min_size=1, max_size=2)), (1, json_values))
    value = draw(_weighted((2, decisions), (2, st.fixed_dictionaries({"decisions": decisions}))))
    assume(value is not None)  # Command(resume=None) fails inside LangGraph itself
    return value


def _asked_about_an_unknown_post(
    world: World, saver: Any
) -> tuple[Any, dict[str, Any], EffectRecord, dict[str, Any]]:
    """A thread whose last run died with a chat post in flight, recorded unknown (the
    tool has no reconcile hook); a new message makes the graph ask a person about it."""
    graph = _agent_graph(world, saver, [])
    ledger = saver.ledger
    thread_id = world.thread_id
    run = ledger.start_run(thread_id)
    rec, _ = ledger.plan(
        thread_id=thread_id,
        run_id=run.run_id,
        tool_call_id="p1",
        tool="cx_post",
        kind=EffectKind.IRREVERSIBLE,
        args=call_args(CallSpec("cx_post"), 1),
    )
    ledger.transition(rec.effect_id, EffectStatus.DISPATCHED, actor="w", owner="w")
    ledger.transition(
        rec.effect_id, EffectStatus.UNKNOWN, actor="w", owner="operator", next_action="check"
    )
    ledger.finish_run(run.run_id, "failed")
    cfg = {"configurable": {"thread_id": thread_id}}
    out = run_graph(graph, {"messages": [HumanMessage("go")]}, cfg)
    assert "__interrupt__" in out, out
    return graph, cfg, rec, out


def test_reconcile_answer_naming_no_string_effect_id_is_asked_again() -> None:
    """Regression, found by the fuzz below: ``"effect_id": []`` crashed the subgraph
    (an unhashable set lookup) instead of asking again with the error."""
    with fresh("memory") as (root, saver):
        world = World(root, plan=_empty_plan())
        graph, cfg, rec, _ = _asked_about_an_unknown_post(world, saver)
        out = run_graph(graph, Command(resume=[{"effect_id": [], "decision": "committed"}]), cfg)
        assert "error" not in out and "__interrupt__" in out, out
        assert "not asked about" in out["__interrupt__"][0].value["error"]
        assert saver.ledger.get_effect(rec.effect_id).status is EffectStatus.UNKNOWN


@pytest.mark.timeout(900)
@settings(max_examples=examples(ci=40, dev=15))
@given(data=st.data(), backend=st.sampled_from(("memory", "sqlite")))
def test_reconcile_answers_never_crash_nor_lose_a_row(data: st.DataObject, backend: str) -> None:
    """An unknown outcome is put to a person on resume; whatever they answer, nothing breaks."""
    with fresh(backend) as (root, saver):
        world = World(root, plan=_empty_plan())
        graph, cfg, rec, out = _asked_about_an_unknown_post(world, saver)
        ledger = saver.ledger
        thread_id = world.thread_id
        for _ in range(data.draw(st.integers(1, 4))):
            if "__interrupt__" not in out:
                break
            out = run_graph(graph, Command(resume=data.draw(reconcile_answers(rec.effect_id))), cfg)
            assert "error" not in out, out["error"]  # a bad answer is asked again, never raised
            event("asked again" if "__interrupt__" in out else "settled")
        if "__interrupt__" in out:
            settle = [{"effect_id": rec.effect_id, "decision": "not_applied"}]
            out = run_graph(graph, Command(resume=settle), cfg)
        assert "error" not in out and "__interrupt__" not in out, out
        final = ledger.get_effect(rec.effect_id)
        assert final.status in (
            EffectStatus.COMMITTED,
            EffectStatus.NOT_APPLIED,
            EffectStatus.UNKNOWN,
        )
        if final.status is EffectStatus.UNKNOWN:
            assert final.owner and final.next_action
        assert_audit_consistent(ledger, {final.tool_call_id: final})
        assert ledger.latest_run(thread_id).status.value == "completed"

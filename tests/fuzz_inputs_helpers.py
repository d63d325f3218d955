"""Strategies and checks shared by the bad-input fuzz suites (``test_fuzz_inputs.py``,
``test_fuzz_answers.py``), and the agent graph most of them run on.

The strategies draw tool calls, ``Send`` payloads and approval resume values;
the checks hold what every example must leave behind (one unbroken audit chain
per record, nothing unapproved at a provider). Inputs stay within what
LangGraph's own checkpoint serializer can carry (integers within 64 bits,
nesting below ~250 levels): beyond that any checkpointed graph fails in
LangGraph before our nodes see the input.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from chaos_harness import TOOL_NAMES, CallSpec, World, call_args, open_saver
from langgraph_cancel import (
    ApprovalGate,
    EffectStatus,
    EffectToolNode,
    LangGraphCancelError,
    add_cancellation,
    request_cancel,
)
from langgraph_cancel.demo.providers.errors import ProviderError
from langgraph_cancel.ledger import Ledger
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


def assert_left_resumable(world: World, ledger: Ledger, records: dict[str, EffectRecord]) -> None:
    """A tool raised its own exception and the node let it through, as ``ToolNode`` does
    by default: the run stays live, to be resumed, and nothing of the batch went out
    unrecorded or unapproved."""
    run = ledger.latest_run(world.thread_id)
    assert run is not None and run.status.value == "running", run
    assert_audit_consistent(ledger, records)
    assert_nothing_unapproved_ran(world, records)
    for rec in records.values():
        assert rec.settled or rec.status in UNDISPATCHED_STATUSES, rec


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


# ---------------------------------------------------------------------------- graphs
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


def _empty_plan() -> Any:
    from chaos_harness import Plan

    return Plan(turns=())

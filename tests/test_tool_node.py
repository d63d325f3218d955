"""EffectToolNode: a drop-in ToolNode that never dispatches an effect twice.

Every test runs a real compiled graph with a scripted chat model on memory,
SQLite and PostgreSQL; tools count their real executions in a SQLite file
(``ExecutionLog`` and the refund agent's providers). Here: the swap itself,
malformed calls, tool errors, guards and idempotency keys; batch order and
concurrency are in ``test_tool_node_batches``, transient faults and re-runs
(kill -9 included) in ``test_tool_node_reruns``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool, Tool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Send

from graphs import (
    ExecutionLog,
    agent_builder,
    calls,
    cancellable,
    config_for,
    counting_tool,
    dangling_calls,
    new_thread,
    scripted,
    send_agent_builder,
)
from langgraph_cancel import (
    DurabilityError,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    effect,
    idempotency_key,
)
from langgraph_cancel.demo import tools as refund_tools
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.ledger import derive_idempotency_key
from langgraph_cancel.testing import tool_call
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)
from tool_node_helpers import assert_no_duplicate_keys, effects_by_tool, start, tool_messages

# ----------------------------------------------------------------------------- drop-in


def _agent_suite(
    graph: Any, log: ExecutionLog, model: Any, thread_id: str, use_async: bool
) -> None:
    """The agent's own tests: results in call order, errors to the model, one run per call."""
    inp = {"messages": [HumanMessage("please handle o-1")]}
    cfg = config_for(thread_id)
    out = asyncio.run(graph.ainvoke(inp, cfg)) if use_async else graph.invoke(inp, cfg)
    messages = out["messages"]
    answers = tool_messages(messages)
    assert [m.tool_call_id for m in answers] == ["c1", "c2", "c3", "c4"]
    assert [m.content for m in answers[:3]] == ["write(w) ok", "read(r) ok", "undoable(u) ok"]
    assert [m.status for m in answers] == ["success", "success", "success", "error"]
    assert "ValueError('bad item')" in str(answers[3].content)
    assert answers[3].name == "boom"
    assert isinstance(messages[-1], AIMessage) and messages[-1].content == "fin"
    assert not dangling_calls(messages)
    # tools_condition routed to END after the final answer; each tool ran exactly once.
    assert model.calls == 2
    assert sorted(r["tool"] for r in log.rows()) == ["boom", "read", "undoable", "write"]
    # The model's second call saw every answer.
    assert len(tool_messages(model.inputs[-1])) == 4


@pytest.mark.parametrize("shape", ["batch", "send"])
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("node", ["ToolNode", "EffectToolNode", "EffectToolNode+cancellation"])
def test_drop_in_swap(
    saver: Any, log: ExecutionLog, node: str, use_async: bool, shape: str
) -> None:
    tools = [
        counting_tool(log, "write", EffectKind.IRREVERSIBLE),
        counting_tool(log, "read", EffectKind.READ_ONLY),
        counting_tool(log, "undoable", EffectKind.REVERSIBLE),
        counting_tool(log, "boom", EffectKind.IRREVERSIBLE, fail=[ValueError("bad item")]),
    ]
    model = scripted(
        calls(
            ("write", "w", "c1"), ("read", "r", "c2"), ("undoable", "u", "c3"), ("boom", "b", "c4")
        ),
        "fin",
    )
    # The one line that changes (errors go to the model in both: ToolNode's own default
    # re-raises tool errors, EffectToolNode's default sends them to the model):
    node_cls = ToolNode if node == "ToolNode" else EffectToolNode
    tool_node = node_cls(tools, handle_tool_errors=True)
    build = agent_builder if shape == "batch" else send_agent_builder
    builder = build(model, tool_node, use_async=use_async)
    if node.endswith("+cancellation"):
        graph = cancellable(builder, saver)
    else:
        graph = builder.compile(checkpointer=saver)
    thread_id = new_thread()
    _agent_suite(graph, log, model, thread_id, use_async)
    if node != "ToolNode":
        effects = effects_by_tool(saver, thread_id)
        assert {t: e.status for t, e in effects.items()} == {
            "write": EffectStatus.COMMITTED,
            "read": EffectStatus.COMMITTED,
            "undoable": EffectStatus.COMMITTED,
            "boom": EffectStatus.FAILED,
        }
        assert_no_duplicate_keys(saver, thread_id)
    if node.endswith("+cancellation"):
        run = saver.ledger.latest_run(thread_id)
        assert run.status.value == "completed"


# ----------------------------------------------------------------------------- malformed calls


def test_malformed_calls_are_answered_and_recorded(saver: Any, log: ExecutionLog) -> None:
    good = counting_tool(log, "good", EffectKind.IRREVERSIBLE)
    model = scripted(
        AIMessage(
            "",
            tool_calls=[
                tool_call("no_such_tool", {"item": "x"}, id="m1"),
                tool_call("good", {}, id="m2"),  # missing required argument
                tool_call("good", {"item": {"not": "a string"}}, id="m3"),  # wrong type
                tool_call("good", {"item": "fine"}, id="m4"),
            ],
        ),
        "fin",
    )
    graph = cancellable(agent_builder(model, EffectToolNode([good])), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    assert answers["m1"].status == "error" and "no_such_tool" in str(answers["m1"].content)
    assert "is not a valid tool" in str(answers["m1"].content)
    for bad in ("m2", "m3"):
        assert answers[bad].status == "error"
        assert "item" in str(answers[bad].content)
    assert answers["m4"].status == "success" and answers["m4"].content == "good(fine) ok"
    # The run went on: the model answered and the run completed.
    assert out["messages"][-1].content == "fin"
    assert saver.ledger.latest_run(thread_id).status.value == "completed"
    # Only the well-formed call executed.
    assert [r["item"] for r in log.rows("good")] == ["fine"]
    ledger = saver.ledger
    for call_id in ("m1", "m2", "m3"):
        rec = ledger.find_effect(thread_id, call_id)
        assert rec is not None and rec.status is EffectStatus.FAILED, call_id
        assert rec.dispatched_at is None
        assert rec.error
    assert ledger.find_effect(thread_id, "m4").status is EffectStatus.COMMITTED


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_tool_body_is_the_one_toolnode_would_call(saver: Any, use_async: bool) -> None:
    # A sync graph calls a tool's function (tool.invoke), an async graph its coroutine,
    # exactly as ToolNode does: the execution is ToolNode's own. So a coroutine-only
    # tool fails a sync graph as it fails ToolNode's.
    def read_sync(item: str) -> str:
        return f"sync:{item}"

    async def read_async(item: str) -> str:
        return f"async:{item}"

    async def write_async(item: str) -> str:
        return f"async-only:{item}"

    async def note_async(text: str) -> str:
        return f"noted:{text}"

    both = effect(EffectKind.READ_ONLY)(
        StructuredTool.from_function(
            func=read_sync, coroutine=read_async, name="look", description="Look up."
        )
    )
    only_async = effect(EffectKind.IRREVERSIBLE, requires_approval=False)(
        StructuredTool.from_function(coroutine=write_async, name="send", description="Send.")
    )
    # Single-input Tools (no args schema: the tool parses its input) run too.
    note = effect(EffectKind.READ_ONLY)(
        Tool(name="note", func=None, coroutine=note_async, description="Take a note.")
    )
    shout = effect(EffectKind.READ_ONLY)(
        Tool(name="shout", func=str.upper, description="Say it loud.")
    )
    script = calls(
        ("look", "a", "l1"),
        ("send", "b", "s1"),
        {"name": "note", "args": {"__arg1": "c"}, "id": "n1"},
        {"name": "shout", "args": {"__arg1": "hey"}, "id": "h1"},
    )

    def run(node: Any, checkpointer: Any) -> Any:
        builder = agent_builder(scripted(script, "fin"), node, use_async=use_async)
        graph = (
            cancellable(builder, checkpointer)
            if isinstance(node, EffectToolNode)
            else builder.compile(checkpointer=checkpointer)
        )
        cfg = config_for(new_thread())
        inp = {"messages": [HumanMessage("go")]}
        try:
            out = asyncio.run(graph.ainvoke(inp, cfg)) if use_async else graph.invoke(inp, cfg)
        except Exception as exc:
            return type(exc), str(exc)
        return {m.tool_call_id: m.content for m in tool_messages(out["messages"])}, cfg

    tools = [both, only_async, note, shout]
    theirs = run(ToolNode(tools), InMemorySaver())
    ours = run(EffectToolNode(tools), saver)
    if use_async:
        assert (
            theirs[0]
            == ours[0]
            == {
                "l1": "async:a",
                "s1": "async-only:b",
                "n1": "noted:c",
                "h1": "HEY",
            }
        )
        thread_id = ours[1]["configurable"]["thread_id"]
        assert saver.ledger.find_effect(thread_id, "s1").status is EffectStatus.COMMITTED
    else:
        # Both fail on a coroutine-only tool (which one first follows each node's order).
        assert theirs[0] is ours[0] is NotImplementedError
        assert "does not support sync invocation" in ours[1]


def test_reads_sharing_a_declared_key_are_all_recorded(saver: Any) -> None:
    # Two read-only calls whose key function maps them to one key: both run and are
    # answered, and the second outcome is kept under a key derived from its own call.
    # The first call finishes last: call order, not completion order, keeps the key.
    started = itertools.count()

    @effect(EffectKind.READ_ONLY, idempotency_key=lambda a: f"quote:{a['item']}")
    @tool
    def quote(item: str) -> str:
        """Look a price up."""
        if next(started) == 0:
            time.sleep(0.2)
        return f"{item}: 10"

    model = scripted(calls(("quote", "o-1", "q1"), ("quote", "o-1", "q2")), "fin")
    graph = cancellable(agent_builder(model, EffectToolNode([quote])), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    assert {k: (m.status, m.content) for k, m in answers.items()} == {
        "q1": ("success", "o-1: 10"),
        "q2": ("success", "o-1: 10"),
    }
    first = saver.ledger.find_effect(thread_id, "q1")
    second = saver.ledger.find_effect(thread_id, "q2")
    assert first.idempotency_key == "quote:o-1" and first.status is EffectStatus.COMMITTED
    assert second.status is EffectStatus.COMMITTED
    assert second.idempotency_key == f"quote:o-1#duplicate:{thread_id}:q2"
    assert saver.ledger.history(second.effect_id)[0].detail == {"duplicate_key": "quote:o-1"}


def test_non_dict_arguments_via_send(saver: Any, log: ExecutionLog) -> None:
    """A Send payload may carry anything: non-dict arguments are refused, not dispatched."""
    good = counting_tool(log, "good", EffectKind.IRREVERSIBLE)

    def planner(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("planning")]}

    def route(state: MessagesState) -> Any:
        if any(isinstance(m, ToolMessage) for m in state["messages"]):
            return END
        raw = [
            {"name": "good", "args": "item=oops", "id": "n1", "type": "tool_call"},
            {"name": "good", "args": ["x"], "id": "n2", "type": "tool_call"},
            {"name": "good", "args": {"item": "ok"}, "id": "n3", "type": "tool_call"},
        ]
        return [
            Send("tools", {"__type": "tool_call_with_context", "tool_call": c, "state": state})
            for c in raw
        ]

    builder = StateGraph(MessagesState)
    builder.add_node("planner", planner)
    builder.add_node("tools", EffectToolNode([good]))
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", route, ["tools", END])
    builder.add_edge("tools", "planner")
    graph = cancellable(builder, saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    assert answers["n1"].status == "error" and "object" in str(answers["n1"].content)
    assert answers["n2"].status == "error"
    assert answers["n3"].status == "success"
    assert [r["item"] for r in log.rows("good")] == ["ok"]
    for call_id in ("n1", "n2"):
        rec = saver.ledger.find_effect(thread_id, call_id)
        assert rec.status is EffectStatus.FAILED
        assert "__raw__" in rec.args
    assert saver.ledger.latest_run(thread_id).status.value == "completed"


# ----------------------------------------------------------------------------- tool errors


def test_tool_exceptions_become_error_messages(saver: Any, log: ExecutionLog) -> None:
    tools = [
        counting_tool(log, "bad_write", EffectKind.IRREVERSIBLE, fail=[KeyError("nope")]),
        counting_tool(log, "bad_read", EffectKind.READ_ONLY, fail=[ValueError("no rows")]),
        counting_tool(log, "ok", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(calls(("bad_write", "a", "e1"), ("bad_read", "b", "e2"), ("ok", "c", "e3")))
    graph = cancellable(agent_builder(model, EffectToolNode(tools, handle_tool_errors=True)), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    assert answers["e1"].status == "error" and "KeyError('nope')" in str(answers["e1"].content)
    assert answers["e2"].status == "error" and "ValueError('no rows')" in str(answers["e2"].content)
    assert answers["e3"].status == "success"
    assert out["messages"][-1].content == "done"
    eff = effects_by_tool(saver, thread_id)
    assert eff["bad_write"].status is EffectStatus.FAILED
    assert "nope" in (eff["bad_write"].error or "")
    assert eff["bad_read"].status is EffectStatus.FAILED
    # Permanent (non-transient) failures are not retried.
    assert log.attempts("bad_write") == 1 and log.attempts("bad_read") == 1


@pytest.mark.parametrize("failing", ["write", "read"])
def test_tool_exceptions_propagate_without_handling(
    saver: Any, log: ExecutionLog, failing: str
) -> None:
    kind = EffectKind.IRREVERSIBLE if failing == "write" else EffectKind.READ_ONLY
    tools = [counting_tool(log, "bad", kind, reconcile=False, fail=[KeyError("nope")])]
    model = scripted(calls(("bad", "a", "p1")))
    graph = cancellable(
        agent_builder(model, EffectToolNode(tools, handle_tool_errors=False)), saver
    )
    thread_id = new_thread()
    with pytest.raises(KeyError, match="nope"):
        start(graph, thread_id)
    assert log.attempts("bad") == 1
    rec = saver.ledger.find_effect(thread_id, "p1")
    if failing == "write":
        # The call raised: nothing applied, and the ledger says so (not left "dispatched").
        assert rec is not None
        assert rec.status is EffectStatus.NOT_APPLIED
        assert "nope" in (rec.error or "")


def test_an_unhandled_read_error_keeps_its_siblings_outcomes(saver: Any, log: ExecutionLog) -> None:
    # One read raises what handle_tool_errors does not cover: the node raises it, and
    # the reads of the batch that did answer are still recorded.
    tools = [
        counting_tool(log, "bad_read", EffectKind.READ_ONLY, fail=[KeyError("nope")]),
        counting_tool(log, "good_read", EffectKind.READ_ONLY),
    ]
    model = scripted(calls(("bad_read", "a", "u1"), ("good_read", "b", "u2")))
    graph = cancellable(
        agent_builder(model, EffectToolNode(tools, handle_tool_errors=ValueError)), saver
    )
    thread_id = new_thread()
    with pytest.raises(KeyError, match="nope"):
        start(graph, thread_id)
    good = saver.ledger.find_effect(thread_id, "u2")
    assert good is not None and good.status is EffectStatus.COMMITTED
    assert saver.ledger.find_effect(thread_id, "u1") is None  # a re-run runs it again


# ----------------------------------------------------------------------------- guards and keys


def test_durability_exit_is_refused(saver: Any, log: ExecutionLog) -> None:
    tool_w = counting_tool(log, "w", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("w", "a", "d1")), "fin")
    graph = cancellable(agent_builder(model, EffectToolNode([tool_w])), saver)
    thread_id = new_thread()
    with pytest.raises(DurabilityError, match="exit"):
        start(graph, thread_id, durability="exit")
    # Refused when the graph starts: no model call, no dispatch, no run.
    assert model.calls == 0 and log.attempts("w") == 0
    assert saver.ledger.latest_run(thread_id) is None
    with pytest.raises(DurabilityError):
        asyncio.run(
            graph.ainvoke(
                {"messages": [HumanMessage("go")]}, config_for(thread_id), durability="exit"
            )
        )
    assert model.calls == 0
    # A tool node used without add_cancellation refuses too, before dispatching anything.
    plain = agent_builder(scripted(calls(("w", "a", "d2"))), EffectToolNode([tool_w]))
    with pytest.raises(DurabilityError):
        start(plain.compile(checkpointer=saver), new_thread(), durability="exit")
    assert log.attempts("w") == 0
    # The other modes run.
    out = start(graph, new_thread(), durability="sync")
    assert out["messages"][-1].content == "fin"


def test_idempotency_key_inside_tool_matches_ledger(
    saver: Any, log: ExecutionLog, providers_path: str
) -> None:
    seen: list[str] = []
    tool_w = counting_tool(log, "w", EffectKind.IRREVERSIBLE, seen_keys=seen)
    tool_u = counting_tool(log, "u", EffectKind.REVERSIBLE, seen_keys=seen)
    model = scripted(
        AIMessage(
            "",
            tool_calls=[
                tool_call("w", {"item": "a"}, id="q1"),
                tool_call("u", {"item": "b"}, id="q2"),
                tool_call("issue_refund", {"order_id": "o-93", "amount": 5}, id="q3"),
            ],
        ),
        "fin",
    )
    graph = cancellable(
        agent_builder(model, EffectToolNode([tool_w, tool_u, refund_tools.issue_refund])), saver
    )
    thread_id = new_thread()
    start(graph, thread_id)
    ledger = saver.ledger
    w_rec, u_rec = ledger.find_effect(thread_id, "q1"), ledger.find_effect(thread_id, "q2")
    # Default keys: derived from thread and tool-call id; the tool saw the ledger's key.
    assert seen == [u_rec.idempotency_key, w_rec.idempotency_key]
    assert w_rec.idempotency_key == derive_idempotency_key(thread_id, "q1")
    assert [r["key"] for r in log.rows("w")] == [w_rec.idempotency_key]
    # A declared key function: the provider received exactly the ledger's key.
    refund = ledger.find_effect(thread_id, "q3")
    assert refund.idempotency_key == "refund:o-93:5.00"
    systems = Providers(providers_path)
    assert systems.executions("refund:o-93:5.00") == 1
    # Outside a dispatched call there is no key.
    with pytest.raises(RuntimeError, match="only available inside"):
        idempotency_key()


@pytest.mark.parametrize("use_async", [False, True])
def test_a_tool_a_wrapper_serves_runs_as_classified_by_name(use_async: bool) -> None:
    """``effects=`` classifies by name what a ``wrap_tool_call`` serves: it runs, and a
    name it does not give still waits for approval."""
    ran: list[str] = []

    @tool
    def weather(city: str) -> str:
        """The weather in a city (served by the wrapper, not given to the node)."""
        ran.append(city)
        return f"sunny in {city}"

    @tool
    def wire(amount: int) -> str:
        """Wire money (served by the wrapper, not classified)."""
        ran.append(f"wire {amount}")
        return "wired"

    served = {"weather": weather, "wire": wire}

    def serve(request: Any, execute: Any) -> Any:
        return execute(request.override(tool=served[request.tool_call["name"]]))

    async def aserve(request: Any, execute: Any) -> Any:
        return await execute(request.override(tool=served[request.tool_call["name"]]))

    node = EffectToolNode(
        [],
        wrap_tool_call=serve,
        awrap_tool_call=aserve,
        effects={"weather": effect(EffectKind.READ_ONLY)},
    )
    graph = (
        StateGraph(MessagesState)
        .add_node("tools", node)
        .add_edge(START, "tools")
        .compile(checkpointer=InMemorySaver())
    )

    def run(call: Any, thread: str) -> Any:
        message: Any = {"messages": [AIMessage("", tool_calls=[call])]}
        config = config_for(thread)
        if use_async:
            return asyncio.run(graph.ainvoke(message, config))
        return graph.invoke(message, config)

    out = run(tool_call("weather", {"city": "Oslo"}, id="c-weather"), new_thread())
    assert out["messages"][-1].content == "sunny in Oslo"
    assert "__interrupt__" not in out
    out = run(tool_call("wire", {"amount": 5}, id="c-wire"), new_thread())
    assert out["__interrupt__"][0].value["effect_kind"] == "irreversible"
    assert ran == ["Oslo"]

"""EffectMiddleware: the package's guarantees for agents built with create_agent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool

from langgraph_cancel import EffectKind, effect, get_report, idempotency_key, request_cancel
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.testing.fake_model import ScriptedChatModel, tool_call

agents = pytest.importorskip("langchain.agents")
from langgraph_cancel.middleware import EffectMiddleware  # noqa: E402


class Counter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def add(self, name: str, arg: str, key: str) -> None:
        with self.lock:
            self.calls.append((name, arg, key))

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)


def _tools(counter: Counter, delay: float = 0.0) -> list[Any]:
    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        counter.add("refund", order_id, idempotency_key())
        time.sleep(delay)
        return f"refunded {order_id}"

    @effect(EffectKind.READ_ONLY)
    @tool
    def lookup(order_id: str) -> str:
        """Look an order up."""
        counter.add("lookup", order_id, "")
        return f"order {order_id}"

    return [refund, lookup]


@pytest.fixture(params=["memory", "sqlite"])
def saver(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryCancelSaver()
    else:
        with SqliteCancelSaver.from_conn_string(str(tmp_path / "agent.db")) as sqlite_saver:
            sqlite_saver.setup()
            yield sqlite_saver


def test_completed_run_records_every_effect(saver: Any) -> None:
    counter = Counter()
    model = ScriptedChatModel(
        [
            AIMessage(
                "",
                tool_calls=[
                    tool_call("lookup", {"order_id": "o1"}),
                    tool_call("refund", {"order_id": "o1"}),
                ],
            ),
            AIMessage("all done"),
        ]
    )
    agent = agents.create_agent(
        model, _tools(counter), middleware=[EffectMiddleware(approval=False)], checkpointer=saver
    )
    out = agent.invoke(
        {"messages": [HumanMessage("refund o1")]}, {"configurable": {"thread_id": "mw-done"}}
    )
    assert out["messages"][-1].content == "all done"
    effects = {e.tool: e for e in saver.ledger.effects("mw-done")}
    assert effects["refund"].status.value == "committed"
    assert effects["lookup"].status.value == "committed"
    # The tool saw the ledger's key.
    assert counter.calls[-1][2] == effects["refund"].idempotency_key or any(
        c[2] == effects["refund"].idempotency_key for c in counter.calls
    )
    assert saver.ledger.latest_run("mw-done").status.value == "completed"


def test_cancel_stops_before_the_next_model_call(saver: Any) -> None:
    counter = Counter()
    model = ScriptedChatModel(
        [
            AIMessage("", tool_calls=[tool_call("refund", {"order_id": "o1"})]),
            AIMessage("", tool_calls=[tool_call("refund", {"order_id": "o2"})]),
            AIMessage("never said"),
        ]
    )
    agent = agents.create_agent(
        model,
        _tools(counter, delay=0.3),
        middleware=[EffectMiddleware(approval=False)],
        checkpointer=saver,
    )
    thread = "mw-cancel"

    def stop() -> None:
        deadline = time.monotonic() + 10
        while counter.count("refund") == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        request_cancel(saver, thread, reason="user pressed stop", requested_by="test")

    stopper = threading.Thread(target=stop)
    stopper.start()
    out = agent.invoke(
        {"messages": [HumanMessage("refund")]}, {"configurable": {"thread_id": thread}}
    )
    stopper.join()
    # The in-flight refund finished and was recorded; no second model call happened.
    assert counter.count("refund") == 1
    assert model.calls == 1
    report = get_report(saver, thread)
    assert report.status == "cancelled"
    assert [e.args for e in report.permanent] == [{"order_id": "o1"}]
    assert report.dispatched_after_cancel == 0
    assert out["cancellation_report"]["status"] == "cancelled"
    # Every tool call has its answer.
    answered = {m.tool_call_id for m in out["messages"] if isinstance(m, ToolMessage)}
    asked = {c["id"] for m in out["messages"] if isinstance(m, AIMessage) for c in m.tool_calls}
    assert asked <= answered


async def test_a_repeated_tool_call_is_replayed_not_redispatched(saver: Any) -> None:
    """create_agent re-running a call (retry middleware, resume) gets the recorded answer."""
    from langgraph.prebuilt.tool_node import ToolCallRequest, ToolRuntime

    counter = Counter()
    refund = _tools(counter)[0]
    middleware = EffectMiddleware(approval=False)
    call = tool_call("refund", {"order_id": "o9"}, id="c-o9")
    config: RunnableConfig = {
        "configurable": {"thread_id": "mw-replay", "langgraph_cancel_ledger": saver.ledger}
    }
    runtime: ToolRuntime[None, dict[str, Any]] = ToolRuntime(
        state={"messages": []},
        context=None,
        config=config,
        stream_writer=lambda _: None,
        tool_call_id="c-o9",
        store=None,
    )
    request = ToolCallRequest(tool_call=call, tool=refund, state={"messages": []}, runtime=runtime)
    handled: list[str] = []

    async def handler(req: ToolCallRequest) -> ToolMessage:
        handled.append(str(req.tool_call["id"]))
        return ToolMessage(refund.invoke(req.tool_call["args"]), tool_call_id=req.tool_call["id"])

    first = await middleware.awrap_tool_call(request, handler)
    second = await middleware.awrap_tool_call(request, handler)
    assert handled == ["c-o9"]  # the second time, nothing was dispatched
    assert counter.count("refund") == 1
    assert isinstance(first, ToolMessage) and isinstance(second, ToolMessage)
    assert second.content == first.content == "refunded o9"
    rec = saver.ledger.find_effect("mw-replay", "c-o9")
    assert rec is not None and rec.status.value == "committed"


def test_approval_interrupt_then_one_dispatch(saver: Any) -> None:
    from langgraph.types import Command

    counter = Counter()

    @effect(EffectKind.IRREVERSIBLE)  # irreversible: approval required by default
    @tool
    def wire(amount: int) -> str:
        """Wire money."""
        counter.add("wire", str(amount), idempotency_key())
        return f"wired {amount}"

    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[tool_call("wire", {"amount": 500})]), AIMessage("sent")]
    )
    agent = agents.create_agent(model, [wire], middleware=[EffectMiddleware()], checkpointer=saver)
    config = {"configurable": {"thread_id": "mw-approve"}}
    out = agent.invoke({"messages": [HumanMessage("wire 500")]}, config)
    request = out["__interrupt__"][0].value
    # LangChain's per-call review shape (HumanInTheLoopMiddleware, interrupt_mode="per_call").
    assert request["type"] == "tool_approval" and request["name"] == "wire"
    assert counter.count("wire") == 0
    rec = saver.ledger.effects("mw-approve")[0]
    assert rec.status.value == "pending_approval"
    out = agent.invoke(
        Command(resume={"decisions": [{"type": "approve"}], "reviewer": "ops"}), config
    )
    assert out["messages"][-1].content == "sent"
    assert counter.count("wire") == 1
    rec = saver.ledger.get_effect(rec.effect_id)
    assert rec.status.value == "committed"
    assert (rec.approval or {}).get("reviewer") == "ops"


async def test_a_sync_invoke_without_a_thread_inside_async_code_never_blocks_the_loop() -> None:
    # Without a thread the hooks have no run to start, check or close; they do no work,
    # so a sync invoke from async code (on the loop's thread) blocks on nothing of ours.
    from blockbuster import blockbuster_ctx

    counter = Counter()
    model = ScriptedChatModel(["no tools needed"])
    agent = agents.create_agent(model, _tools(counter), middleware=[EffectMiddleware()])
    with blockbuster_ctx():
        out = agent.invoke({"messages": [HumanMessage("hi")]})
    assert out["messages"][-1].content == "no tools needed"


def test_the_agent_graph_is_create_agents_own(saver: Any) -> None:
    """No node of the middleware's own: the graph, and so the steps a run takes (its
    ``recursion_limit``), are what ``create_agent`` builds for the same tools."""
    counter = Counter()
    plain = agents.create_agent(ScriptedChatModel(["x"]), _tools(counter))
    guarded = agents.create_agent(
        ScriptedChatModel(["x"]), _tools(counter), middleware=[EffectMiddleware()]
    )
    assert set(guarded.get_graph().nodes) == set(plain.get_graph().nodes)

    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[tool_call("lookup", {"order_id": "o1"})]), "found it"]
    )
    agent = agents.create_agent(
        model, _tools(counter), middleware=[EffectMiddleware()], checkpointer=saver
    )
    # model, tools, model: the recursion limit the same agent without the middleware needs.
    config: RunnableConfig = {"configurable": {"thread_id": "mw-steps"}, "recursion_limit": 4}
    out = agent.invoke({"messages": [HumanMessage("look o1 up")]}, config)
    assert out["messages"][-1].content == "found it"
    assert saver.ledger.latest_run("mw-steps").status.value == "completed"


def test_each_turn_is_one_run_completed_once(saver: Any) -> None:
    counter = Counter()
    model = ScriptedChatModel(
        [
            AIMessage("", tool_calls=[tool_call("refund", {"order_id": "o1"})]),
            "refunded",
            "nothing else to do",
        ]
    )
    agent = agents.create_agent(
        model, _tools(counter), middleware=[EffectMiddleware()], checkpointer=saver
    )
    config: RunnableConfig = {"configurable": {"thread_id": "mw-turns"}}
    agent.invoke({"messages": [HumanMessage("refund o1")]}, config)
    agent.invoke({"messages": [HumanMessage("thanks")]}, config)
    runs = saver.ledger.runs("mw-turns")
    assert [run.status.value for run in runs] == ["completed", "completed"]
    (refund,) = saver.ledger.effects("mw-turns")
    assert refund.run_id == runs[0].run_id


def test_a_return_direct_turn_completes_its_run(saver: Any) -> None:
    counter = Counter()

    @effect(EffectKind.READ_ONLY)
    @tool(return_direct=True)
    def quote(order_id: str) -> str:
        """Quote an order, straight to the user."""
        counter.add("quote", order_id, "")
        return f"quote for {order_id}"

    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[tool_call("quote", {"order_id": "o1"})]), "never said"]
    )
    agent = agents.create_agent(model, [quote], middleware=[EffectMiddleware()], checkpointer=saver)
    out = agent.invoke(
        {"messages": [HumanMessage("quote o1")]}, {"configurable": {"thread_id": "mw-direct"}}
    )
    assert out["messages"][-1].content == "quote for o1"
    assert model.calls == 1
    assert saver.ledger.latest_run("mw-direct").status.value == "completed"


async def test_a_task_cancelled_mid_model_call_ends_cancelled_on_the_next_turn(
    saver: Any,
) -> None:
    import asyncio

    counter = Counter()
    model = ScriptedChatModel(["a first answer that takes a while", "second"], delay_per_token=0.1)
    agent = agents.create_agent(
        model, _tools(counter), middleware=[EffectMiddleware()], checkpointer=saver
    )
    config: RunnableConfig = {"configurable": {"thread_id": "mw-model-stop"}}
    task = asyncio.ensure_future(agent.ainvoke({"messages": [HumanMessage("hi")]}, config))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stopped = saver.ledger.latest_run("mw-model-stop")
    out = await agent.ainvoke({"messages": [HumanMessage("still there?")]}, config)
    assert out["messages"][-1].content == "second"
    assert saver.ledger.get_run(stopped.run_id).status.value == "cancelled"
    assert get_report(saver, "mw-model-stop", run_id=stopped.run_id).status == "cancelled"
    assert saver.ledger.latest_run("mw-model-stop").status.value == "completed"


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_tool_added_per_request_runs_as_classified_by_name(
    saver: Any, use_async: bool
) -> None:
    """A middleware adds a tool to the model request and serves it: ``effects=`` on
    ``EffectMiddleware`` classifies it by name, as ``effect(...)`` would have."""
    from langchain.agents.middleware import AgentMiddleware

    ran: list[str] = []

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    class WeatherMiddleware(AgentMiddleware[Any, Any, Any]):
        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            return handler(request.override(tools=[*request.tools, weather]))

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            return await handler(request.override(tools=[*request.tools, weather]))

        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            served = weather if request.tool_call["name"] == "weather" else request.tool
            return handler(request.override(tool=served))

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            served = weather if request.tool_call["name"] == "weather" else request.tool
            return await handler(request.override(tool=served))

    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[tool_call("weather", {"city": "Oslo"})]), "sunny"]
    )
    agent = agents.create_agent(
        model,
        [],
        middleware=[WeatherMiddleware(), EffectMiddleware(effects={"weather": "read_only"})],
        checkpointer=saver,
    )
    config: RunnableConfig = {"configurable": {"thread_id": f"mw-served-{use_async}"}}
    message = {"messages": [HumanMessage("weather in Oslo?")]}
    out = await agent.ainvoke(message, config) if use_async else agent.invoke(message, config)
    assert "__interrupt__" not in out
    assert out["messages"][-1].content == "sunny"
    assert ran == ["Oslo"]
    (rec,) = saver.ledger.effects(f"mw-served-{use_async}")
    assert rec.kind is EffectKind.READ_ONLY

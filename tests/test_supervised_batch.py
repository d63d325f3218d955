"""A sync graph's side effects run in the batch's worker thread, under a supervisor.

The node's own thread waits for the batch and watches the cancel signal while a
call is in flight. These tests pin what that must keep: a stop still stops waiting
for a hung call after its grace (and nothing queued behind it goes out, not even
once the hung call returns), a caller that dies while it waits stops the batch,
and a tool runs as it would in ``ToolNode``'s worker threads (no event loop).
"""

from __future__ import annotations

import _thread
import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph

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
    wait_until,
)
from langgraph_cancel import (
    EffectKind,
    EffectStatus,
    EffectToolNode,
    effect,
    get_report,
    request_cancel,
)
from langgraph_cancel.errors import BatchSuperseded
from langgraph_cancel.execution import supervision
from langgraph_cancel.testing import tool_call
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)

GRACE = 0.3


@pytest.fixture(scope="module")
def server_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop that keeps running, as a LangGraph server's does.

    In an async graph a sync tool runs in the loop's default executor, as in
    ``ToolNode``; ``asyncio.run`` joins that executor when it ends, so a call the run
    gave up on would hold it. A server's loop does not end.
    """
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="server-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _on(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def _run_in_thread(fn: Any) -> tuple[threading.Thread, list[Any], list[BaseException]]:
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the test
            error.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result, error


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_hung_call_is_given_up_and_nothing_behind_it_goes_out(
    saver: Any, log: ExecutionLog, use_async: bool, server_loop: asyncio.AbstractEventLoop
) -> None:
    tools = [
        counting_tool(log, "sb_first", EffectKind.IRREVERSIBLE),
        counting_tool(log, "sb_hung", EffectKind.IRREVERSIBLE, reconcile=False),
        counting_tool(log, "sb_queued", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(
        calls(("sb_first", "a", "f1"), ("sb_hung", "b", "h1"), ("sb_queued", "c", "q1"))
    )
    graph = cancellable(
        agent_builder(model, EffectToolNode(tools, cancel_timeout=GRACE), use_async=use_async),
        saver,
        cancel_timeout=GRACE,
    )
    thread_id = new_thread()
    inp = {"messages": [HumanMessage("go")]}
    log.arm("sb_hung")
    runner, result, error = _run_in_thread(
        (lambda: _on(server_loop, graph.ainvoke(inp, config_for(thread_id))))
        if use_async
        else (lambda: graph.invoke(inp, config_for(thread_id)))
    )
    try:
        wait_until(lambda: log.started("sb_hung"), timeout=30, what="the hung call to start")
        request_cancel(saver, thread_id, reason="stop", requested_by="test")
        runner.join(10.0)
        returned = not runner.is_alive()
        hung = saver.ledger.find_effect(thread_id, "h1")
    finally:
        log.release("sb_hung")
    assert returned, "the stop waited past the hung call's grace"
    assert not error, error
    assert hung is not None and hung.status is EffectStatus.UNKNOWN and hung.owner
    # The worker, free again, records the late outcome and dispatches nothing more.
    wait_until(
        lambda: saver.ledger.find_effect(thread_id, "h1").status is EffectStatus.COMMITTED,
        timeout=10,
        what="the late outcome",
    )
    time.sleep(0.3)
    assert log.attempts("sb_queued") == 0
    assert log.applied("sb_first") == 1 and log.applied("sb_hung") == 1
    assert saver.ledger.find_effect(thread_id, "q1").status is EffectStatus.DROPPED
    messages = result[0]["messages"]
    assert dangling_calls(messages) == []
    report = get_report(saver, thread_id)
    assert report.status == "cancelled"
    assert [e.tool_call_id for e in report.permanent] == ["f1"]
    assert [e.tool_call_id for e in report.not_run] == ["q1"]
    assert report.dispatched_after_cancel == 0


def test_a_caller_gone_while_a_call_is_in_flight_stops_the_batch(
    saver: Any, log: ExecutionLog
) -> None:
    # Ctrl-C in the thread that invoked the graph: the call in flight finishes and
    # its outcome is recorded; the calls behind it never go out.
    tools = [
        counting_tool(log, "sb_interrupted", EffectKind.IRREVERSIBLE),
        counting_tool(log, "sb_after", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(calls(("sb_interrupted", "a", "i1"), ("sb_after", "b", "i2")))
    graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
    thread_id = new_thread()
    log.arm("sb_interrupted")
    interrupted = False

    def interrupt_the_caller() -> None:
        wait_until(lambda: log.started("sb_interrupted"), timeout=30, what="the call to start")
        _thread.interrupt_main()  # KeyboardInterrupt in the supervising (main) thread
        time.sleep(0.2)
        log.release("sb_interrupted")

    # A process started in the background by a shell ignores SIGINT, and Python then
    # leaves it ignored (interrupt_main does nothing): this test is about a process
    # that handles Ctrl-C, so it installs Python's handler for its duration.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    helper = threading.Thread(target=interrupt_the_caller, daemon=True)
    helper.start()
    try:
        graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        log.release("sb_interrupted")
        helper.join(30)
        signal.signal(signal.SIGINT, previous)
    assert interrupted
    wait_until(
        lambda: saver.ledger.find_effect(thread_id, "i1").status is EffectStatus.COMMITTED,
        timeout=10,
        what="the outcome of the call in flight",
    )
    time.sleep(0.3)
    assert log.applied("sb_interrupted") == 1
    assert log.attempts("sb_after") == 0
    behind = saver.ledger.find_effect(thread_id, "i2")
    assert behind.dispatched_at is None  # planned, or dropped by the interrupted run's end
    assert behind.status in (EffectStatus.PLANNED, EffectStatus.DROPPED)


def test_a_sync_tool_may_start_its_own_event_loop(saver: Any) -> None:
    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def sb_loopy(item: str) -> str:
        """Runs a coroutine with asyncio.run, as sync wrappers of async clients do."""

        async def work() -> str:
            await asyncio.sleep(0)
            return f"done {item}"

        return asyncio.run(work())

    model = scripted(calls(("sb_loopy", "a", "l1"), ("sb_loopy", "b", "l2")))
    graph = cancellable(agent_builder(model, EffectToolNode([sb_loopy])), saver)
    thread_id = new_thread()
    out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    answers = [m.content for m in out["messages"] if getattr(m, "tool_call_id", None)]
    assert answers == ["done a", "done b"]
    assert saver.ledger.find_effect(thread_id, "l2").status is EffectStatus.COMMITTED


def test_the_supervisor_gives_up_only_on_the_call_still_in_flight() -> None:
    sup = supervision.Supervisor()
    first = supervision.InFlight(scope=None, grace=0.0, give_up=lambda: None)  # type: ignore[arg-type]
    second = supervision.InFlight(scope=None, grace=0.0, give_up=lambda: None)  # type: ignore[arg-type]
    sup.begin(first)
    assert sup.end(first) is False
    assert sup.give_up(first) is False  # it returned already: nothing to give up
    sup.begin(second)
    assert sup.give_up(second) is True
    assert sup.end(second) is True
    with pytest.raises(BatchSuperseded):
        sup.check()


# ----------------------------------------------------------------------------- async graphs
# An async graph whose batch calls only tools with a sync body runs it in a worker too;
# its task may be cancelled (a server's runs.cancel) while a call is in flight there.


def _sync_charge_agent(
    saver: Any, seconds: float, started: threading.Event, done: list[str], cancel_timeout: float
) -> Any:
    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def sb_charge(amount: int) -> str:
        """Charge a card (a blocking client)."""
        started.set()
        time.sleep(seconds)
        done.append(f"charged {amount}")
        return f"charged {amount}"

    model = scripted(
        AIMessage(
            "",
            tool_calls=[
                tool_call("sb_charge", {"amount": 5}, id="c5"),
                tool_call("sb_charge", {"amount": 7}, id="c7"),
            ],
        ),
        "after cancel",
    )
    builder = agent_builder(
        model, EffectToolNode([sb_charge], cancel_timeout=cancel_timeout), use_async=True
    )
    return cancellable(builder, saver, cancel_timeout=cancel_timeout)


async def _cancel_the_task_in_flight(graph: Any, thread_id: str, started: threading.Event) -> None:
    task = asyncio.create_task(
        graph.ainvoke({"messages": [HumanMessage("charge")]}, config_for(thread_id))
    )
    await asyncio.to_thread(started.wait, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancelled_task_waits_for_the_call_in_the_worker_and_records_it(
    saver: Any,
) -> None:
    started, done = threading.Event(), list[str]()
    graph = _sync_charge_agent(saver, 0.3, started, done, cancel_timeout=5)
    thread_id = new_thread()
    await _cancel_the_task_in_flight(graph, thread_id, started)
    await asyncio.sleep(0.3)
    assert done == ["charged 5"]  # the call behind it never went out
    first = saver.ledger.find_effect(thread_id, "c5")
    assert first.status is EffectStatus.COMMITTED
    second = saver.ledger.find_effect(thread_id, "c7")
    assert second is None or second.dispatched_at is None
    report = get_report(saver, thread_id)
    assert report.status == "cancelled"
    assert [e.tool_call_id for e in report.permanent] == ["c5"] and report.unknown == []
    out = await graph.ainvoke({"messages": [HumanMessage("and now?")]}, config_for(thread_id))
    assert dangling_calls(out["messages"]) == []
    assert out["messages"][-1].content == "after cancel"
    assert done == ["charged 5"]


async def test_a_cancelled_task_records_a_call_outliving_its_grace_unknown_then_settles_it(
    saver: Any,
) -> None:
    started, done = threading.Event(), list[str]()
    graph = _sync_charge_agent(saver, 1.5, started, done, cancel_timeout=0.2)
    thread_id = new_thread()
    t0 = time.monotonic()
    await _cancel_the_task_in_flight(graph, thread_id, started)
    assert time.monotonic() - t0 < 1.4, "the cancelled task waited past the call's grace"
    rec = saver.ledger.find_effect(thread_id, "c5")
    assert rec.status is EffectStatus.UNKNOWN and rec.owner and rec.next_action
    assert [e.effect_id for e in get_report(saver, thread_id).unknown] == [rec.effect_id]
    await asyncio.to_thread(
        wait_until,
        lambda: saver.ledger.find_effect(thread_id, "c5").status is EffectStatus.COMMITTED,
        timeout=10,
        what="the late outcome",
    )
    await asyncio.sleep(0.2)
    assert done == ["charged 5"]
    second = saver.ledger.find_effect(thread_id, "c7")
    assert second is None or second.dispatched_at is None


async def test_an_async_graph_keeps_a_batch_with_an_async_tool_on_its_own_loop(
    saver: Any, log: ExecutionLog
) -> None:
    # An async tool may use what belongs to the graph's event loop (a client, an
    # asyncio.Event): such a batch is not moved to a worker thread.
    ready = asyncio.Event()
    ready.set()

    @effect(EffectKind.READ_ONLY)
    @tool
    async def sb_loop_bound(item: str) -> str:
        """Reads through something bound to the graph's event loop."""
        await asyncio.wait_for(ready.wait(), 5)
        return f"read {item}"

    write = counting_tool(log, "sb_write_next_to_async", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("sb_loop_bound", "a", "r1"), ("sb_write_next_to_async", "b", "w1")))
    graph = cancellable(
        agent_builder(model, EffectToolNode([sb_loop_bound, write]), use_async=True), saver
    )
    thread_id = new_thread()
    out = await graph.ainvoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    answers = {m.tool_call_id: m.content for m in out["messages"] if isinstance(m, ToolMessage)}
    assert answers["r1"] == "read a"
    assert log.applied("sb_write_next_to_async") == 1


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_batch_in_the_worker_makes_no_blocking_call_a_server_would_flag(
    tmp_path: Any, log: ExecutionLog, concurrency: int
) -> None:
    # A LangGraph server (langgraph dev) fails any blocking call made while an event
    # loop runs in the calling thread (BlockBuster). The worker runs the batch on a
    # private loop: its ledger I/O, waits and calls must not count as that loop's.
    from blockbuster import BlockBuster

    from graphs import open_saver

    tools = [
        counting_tool(log, "bb_read", EffectKind.READ_ONLY),
        counting_tool(log, "bb_write", EffectKind.IRREVERSIBLE),
        counting_tool(log, "bb_undoable", EffectKind.REVERSIBLE),
    ]
    model = scripted(
        calls(
            ("bb_read", "a", "b1"),
            ("bb_write", "b", "b2"),
            ("bb_undoable", "c", "b3"),
            ("bb_write", "d", "b4"),
        )
    )
    url = "sqlite:///" + str(tmp_path / "ledger.db")
    with open_saver(url) as saver:
        graph = cancellable(
            agent_builder(
                model, EffectToolNode(tools, effect_concurrency=concurrency), use_async=True
            ),
            saver,
        )
        thread_id = new_thread()
        bb = BlockBuster(excluded_modules=[])
        for module, func in (("logging/__init__.py", "emit"), ("logging/__init__.py", "flush")):
            bb.functions["io.TextIOWrapper.write"].can_block_in(module, func)
        nodes_seen: list[str] = []

        async def run() -> Any:
            bb.activate()
            try:
                async for chunk in graph.astream(
                    {"messages": [HumanMessage("go")]}, config_for(thread_id)
                ):
                    nodes_seen.extend(chunk)
            finally:
                bb.deactivate()

        asyncio.run(run())
        assert "tools" in nodes_seen
        assert log.applied("bb_write") == 2 and log.applied("bb_undoable") == 1
        assert log.applied("bb_read") == 1


def test_a_run_interrupted_after_its_tool_node_finished_keeps_its_answers(
    saver: Any, log: ExecutionLog
) -> None:
    # The run is interrupted (Ctrl-C, a server's runs.cancel) after the tool node
    # returned but before LangGraph saved the step: its answers are the step's pending
    # writes. The cancel is then finished outside the graph, and its update of the
    # state must keep them: no call left unanswered, none answered "not run".
    write = counting_tool(log, "sb_late_stop", EffectKind.IRREVERSIBLE)

    def interrupt_once_answered(state: MessagesState) -> dict[str, Any]:
        wait_until(
            lambda: (
                (rec := saver.ledger.find_effect(thread_id, "ls1")) is not None
                and rec.status is EffectStatus.COMMITTED
            ),
            timeout=30,
            what="the tool node's answer",
        )
        time.sleep(0.2)  # the tool node's task has returned and its writes are put
        raise KeyboardInterrupt

    builder = StateGraph(MessagesState)
    builder.add_node(
        "agent",
        lambda s: {
            "messages": [scripted(calls(("sb_late_stop", "a", "ls1"))).invoke(s["messages"])]
        },
    )
    builder.add_node("tools", EffectToolNode([write]))
    builder.add_node("bystander", interrupt_once_answered)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tools")
    builder.add_edge("agent", "bystander")
    graph = cancellable(builder, saver)
    thread_id = new_thread()
    with pytest.raises(KeyboardInterrupt):
        graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    messages = graph.get_state(config_for(thread_id)).values["messages"]
    assert dangling_calls(messages) == []
    answers = [m for m in messages if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.status) for m in answers] == [("ls1", "success")]
    report = get_report(saver, thread_id)
    assert report.status == "cancelled"
    assert [e.tool_call_id for e in report.permanent] == ["ls1"] and report.not_run == []
    assert log.applied("sb_late_stop") == 1


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_call_still_running_here_is_never_reconciled_not_applied(
    saver: Any, log: ExecutionLog, use_async: bool, server_loop: asyncio.AbstractEventLoop
) -> None:
    # The stop gave up waiting for a hung call (unknown); the thread's next input
    # reconciles, and the provider has no record of the key yet: the request is still
    # on its way from this process, so the call stays unknown (not not_applied, which
    # would free its key), and its outcome is kept when it arrives.
    tools = [counting_tool(log, "sb_slow_refund", EffectKind.IRREVERSIBLE)]
    model = scripted(calls(("sb_slow_refund", "a", "sr1")))
    graph = cancellable(
        agent_builder(model, EffectToolNode(tools, cancel_timeout=GRACE), use_async=use_async),
        saver,
        cancel_timeout=GRACE,
    )
    thread_id = new_thread()

    def invoke(inp: Any) -> Any:
        if use_async:
            return _on(server_loop, graph.ainvoke(inp, config_for(thread_id)))
        return graph.invoke(inp, config_for(thread_id))

    log.arm("sb_slow_refund")
    runner, _result, error = _run_in_thread(lambda: invoke({"messages": [HumanMessage("go")]}))
    try:
        wait_until(lambda: log.started("sb_slow_refund"), timeout=30, what="the call to start")
        request_cancel(saver, thread_id, reason="stop", requested_by="test")
        runner.join(10.0)
        assert not runner.is_alive() and not error, error
        assert saver.ledger.find_effect(thread_id, "sr1").status is EffectStatus.UNKNOWN
        invoke({"messages": [HumanMessage("where do things stand?")]})  # reconciles first
        held = saver.ledger.find_effect(thread_id, "sr1")
        assert held.status is EffectStatus.UNKNOWN, held
        assert "still in flight in this process" in (held.error or "")
    finally:
        log.release("sb_slow_refund")
    wait_until(
        lambda: saver.ledger.find_effect(thread_id, "sr1").status is EffectStatus.COMMITTED,
        timeout=10,
        what="the late outcome",
    )
    rec = saver.ledger.find_effect(thread_id, "sr1")
    trail = [h.to_status for h in saver.ledger.history(rec.effect_id)]
    assert EffectStatus.NOT_APPLIED not in trail, trail
    assert log.applied("sb_slow_refund") == 1

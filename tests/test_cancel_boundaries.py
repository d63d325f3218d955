"""Where the stop reaches: a second process, the queued Send tasks, every node and dispatch.

The stop is pressed from another process while a worker's call is in flight;
during the fan-out step, so the queued Send tasks never dispatch; from inside
each node of a chain and from the first tool of a batch, so nothing after it
runs. A call the stop dropped runs, once, when the user asks again.
"""

from __future__ import annotations

import itertools
import json
import operator
import subprocess
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import tools_condition

import langgraph_cancel
from cancel_helpers import (
    TIMEOUT,
    state_report,
    url_ledgers_fixture,  # noqa: F401 (a fixture, found by name)
)
from graphs import (
    ExecutionLog,
    agent_builder,
    backend_params,
    calls,
    cancellable,
    config_for,
    counting_tool,
    dangling_calls,
    module_database,
    new_thread,
    open_saver,
    scripted,
    send_agent_builder,
    wait_until,
    worker_command,
    worker_env,
)
from langgraph_cancel import (
    CancellationReport,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    add_cancellation,
    effect,
    get_report,
    request_cancel,
)
from langgraph_cancel.runtime import ledger_for_url
from langgraph_cancel.testing import tool_call
from langgraph_cancel.types import RunStatus
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)

# ----------------------------------------------------------------------------- second process


@pytest.fixture(scope="module", params=backend_params(durable_only=True))
def durable_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """SQLite and PostgreSQL only: what survives the death of a process."""
    with module_database(request) as url:
        yield url


@pytest.mark.slow
def test_cancel_from_a_second_process(
    durable_url: str, providers_path: str, log: ExecutionLog, url_ledgers: list[str]
) -> None:
    thread_id = new_thread()
    with open_saver(durable_url):
        pass  # schema ready before the worker starts
    log.arm("slow")
    proc = subprocess.Popen(
        worker_command("slow", durable_url, providers_path, [thread_id], f"w-{thread_id}"),
        env=worker_env(providers_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def slow_started() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited early: {proc.communicate()[1][-3000:]}")
            return log.started("slow")

        wait_until(slow_started, timeout=90, what="the worker's slow call")
        url_ledgers.append(durable_url)
        answer = langgraph_cancel.request_cancel(
            durable_url, thread_id, reason="ops pressed stop", requested_by="ops"
        )
        assert answer.accepted and answer.first
        # The busy worker notices the request from this process while its call is
        # still in flight (PostgreSQL: LISTEN/NOTIFY; SQLite: a cheap poll).
        watcher = ledger_for_url(durable_url)
        wait_until(
            lambda: getattr(watcher.latest_run(thread_id), "observed_at", None) is not None,
            timeout=TIMEOUT,
            what="the worker to observe the cancel",
        )
        assert log.applied("slow") == 0
        log.release("slow")
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "cancelled"
    assert result["dangling"] == []
    report = CancellationReport.model_validate(result["report"])
    assert report.status == "cancelled" and report.reason == "ops pressed stop"
    assert len(report.not_run) == 3 and report.dispatched_after_cancel == 0
    assert report.cancel_latency_ms is not None
    assert [e.tool_call_id for e in report.reversible_committed] == ["x0"]
    # The world: slow happened once, the three queued writes never did.
    assert log.applied("slow") == 1
    assert [log.attempts(t) for t in ("w1", "w2", "w3")] == [0, 0, 0]
    # Any process reads the same report from the database alone.
    assert get_report(ledger_for_url(durable_url), thread_id) == report


# ----------------------------------------------------------------------------- the queue


def test_queued_sends_are_drained(saver: Any, log: ExecutionLog) -> None:
    """Stop pressed during the fan-out step: the queued Send tasks never dispatch."""
    tools = [
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE),
        counting_tool(log, "w2", EffectKind.IRREVERSIBLE),
        counting_tool(log, "u1", EffectKind.REVERSIBLE),
    ]
    model = scripted(calls(("w1", "a", "q1"), ("w2", "b", "q2"), ("u1", "c", "q3")))
    thread_id = new_thread()

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        reply = model.invoke(state["messages"])
        if reply.tool_calls:  # the stop button is pressed while the model answers
            request_cancel(saver, thread_id, reason="stop", requested_by="t")
        return {"messages": [reply]}

    graph = cancellable(send_agent_builder(model, EffectToolNode(tools), agent=agent), saver)
    cfg = config_for(thread_id)
    graph.invoke({"messages": [HumanMessage("go")]}, cfg)
    assert log.rows() == []
    ledger = saver.ledger
    assert {e.tool_call_id: e.status for e in ledger.effects(thread_id)} == {
        "q1": EffectStatus.DROPPED,
        "q2": EffectStatus.DROPPED,
        "q3": EffectStatus.DROPPED,
    }
    snapshot = graph.get_state(cfg)
    assert snapshot.next == ()
    assert dangling_calls(snapshot.values["messages"]) == []
    report = state_report(graph, thread_id)
    assert sorted(e.tool_call_id for e in report.not_run) == ["q1", "q2", "q3"]
    assert report.dispatched_after_cancel == 0
    assert model.calls == 1


# ----------------------------------------------------------------------------- every check


class ChainState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    trace: Annotated[list[str], operator.add]


def test_every_node_checks_the_signal(saver: Any) -> None:
    """A chain of plain nodes: whichever node presses stop, no later node runs."""
    node_count = 5
    for stop_at in range(node_count):
        thread_id = new_thread()

        def make(
            node_index: int, thread_id: str = thread_id, stop_at: int = stop_at
        ) -> Callable[..., Any]:
            def node(state: ChainState) -> dict[str, Any]:
                if node_index == stop_at:
                    request_cancel(saver, thread_id, reason=f"stop at {stop_at}", requested_by="t")
                return {"trace": [f"n{node_index}"]}

            return node

        builder = StateGraph(ChainState)
        for node_index in range(node_count):
            builder.add_node(f"n{node_index}", make(node_index))
        builder.add_edge(START, "n0")
        for node_index in range(node_count - 1):
            builder.add_edge(f"n{node_index}", f"n{node_index + 1}")
        graph = cancellable(builder, saver)
        cfg = config_for(thread_id)
        graph.invoke({"messages": [HumanMessage("go")], "trace": []}, cfg)
        values = graph.get_state(cfg).values
        assert values["trace"] == [f"n{i}" for i in range(stop_at + 1)], stop_at
        assert values["cancellation_report"]["status"] == "cancelled"
        assert saver.ledger.latest_run(thread_id).status is RunStatus.CANCELLED


def test_every_dispatch_checks_the_signal(saver: Any, log: ExecutionLog) -> None:
    """The first tool of a batch presses stop: no later call of the batch is dispatched."""
    thread_id = new_thread()

    def stop(_item: str) -> None:
        request_cancel(saver, thread_id, reason="stop", requested_by="t")

    tools = [
        counting_tool(log, "first", EffectKind.REVERSIBLE, before=stop),
        counting_tool(log, "u2", EffectKind.REVERSIBLE),
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE),
        counting_tool(log, "w2", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(
        calls(("w1", "a", "e1"), ("first", "b", "e2"), ("w2", "c", "e3"), ("u2", "d", "e4"))
    )
    graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
    graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    # The call in flight when stop was pressed finished and is recorded; nothing after it.
    assert log.order() == ["first"]
    ledger = saver.ledger
    assert ledger.find_effect(thread_id, "e2").status is EffectStatus.COMMITTED
    for call_id in ("e1", "e3", "e4"):
        assert ledger.find_effect(thread_id, call_id).status is EffectStatus.DROPPED
    report = state_report(graph, thread_id)
    assert [e.tool_call_id for e in report.reversible_committed] == ["e2"]
    assert sorted(e.tool_call_id for e in report.not_run) == ["e1", "e3", "e4"]
    assert report.dispatched_after_cancel == 0


def test_a_call_the_cancel_dropped_runs_when_asked_again(saver: Any) -> None:
    # The stop drops refund(o-2) before dispatch; the declared key never left the
    # process. Asked again in the next turn, the refund runs, once.
    charged: list[str] = []

    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        charged.append(order_id)
        return f"refunded {order_id}"

    declared = effect(
        EffectKind.IRREVERSIBLE,
        idempotency_key=lambda args: f"refund:{args['order_id']}",
        requires_approval=False,
    )(refund)
    thread_id = new_thread()
    turns = itertools.count(1)

    def agent(state: MessagesState) -> dict[str, Any]:
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage("done")]}
        turn = next(turns)
        if turn == 1:  # the user presses stop while the model answers
            request_cancel(saver, thread_id, reason="stop", requested_by="user")
        call = tool_call("refund", {"order_id": "o-2"}, id=f"c{turn}")
        return {"messages": [AIMessage("", tool_calls=[call])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectToolNode([declared]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = add_cancellation(builder).compile(checkpointer=saver)
    graph.invoke({"messages": [HumanMessage("refund o-2")]}, config_for(thread_id))
    report = get_report(saver, thread_id)
    assert [e.tool_call_id for e in report.not_run] == ["c1"] and charged == []

    out = graph.invoke({"messages": [HumanMessage("please try again")]}, config_for(thread_id))
    answer = [m for m in out["messages"] if isinstance(m, ToolMessage)][-1]
    assert answer.tool_call_id == "c2" and answer.content == "refunded o-2"
    assert charged == ["o-2"]
    ledger = saver.ledger
    assert ledger.find_effect(thread_id, "c2").idempotency_key == "refund:o-2"
    assert ledger.find_effect(thread_id, "c1").status is EffectStatus.DROPPED

"""A stop's progress as custom stream events: compensations, ``create_agent``, the graph view.

The seed scenario's events (requested, observed, waiting, settled, dropped,
cancelled) are checked in ``test_cancel.py`` and, through ``langgraph dev``, in
``test_server_e2e.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph

from graphs import (
    ExecutionLog,
    agent_builder,
    calls,
    cancellable,
    collect_custom,
    config_for,
    counting_tool,
    new_thread,
    progress_events,
    scripted,
)
from langgraph_cancel import (
    CancellationReport,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    effect,
    request_cancel,
)
from langgraph_cancel.cli import render
from langgraph_cancel.graph import CANCEL_NODE, RECONCILE_NODE
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.progress import ProgressKind
from langgraph_cancel.runtime.scope import RunScope
from langgraph_cancel.runtime.signal import CancelSignal
from langgraph_cancel.testing.fake_model import ScriptedChatModel, tool_call
from ledger_util import make_effect, running_thread
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_compensations_are_streamed_newest_first(
    saver: Any, log: ExecutionLog, use_async: bool
) -> None:
    """compensate_on_cancel: each undo is an event, then the report that says so."""
    thread_id = new_thread()

    def stop(_item: str) -> None:
        request_cancel(saver, thread_id, reason="too late", requested_by="alice")

    tools = [
        counting_tool(log, "u1", EffectKind.REVERSIBLE),
        counting_tool(log, "u2", EffectKind.REVERSIBLE, after=stop),
        counting_tool(log, "w3", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(calls(("u1", "a", "c1"), ("u2", "b", "c2"), ("w3", "c", "c3")))
    graph = cancellable(
        agent_builder(model, EffectToolNode(tools)), saver, compensate_on_cancel=True
    )
    chunks = collect_custom(
        graph, {"messages": [HumanMessage("go")]}, config_for(thread_id), use_async=use_async
    )
    progress = progress_events(chunks)
    # The stop is asked from inside u2: the run may see it while c2 is still in flight
    # (then c2 is waited for, and settled, right after the observation) or only once
    # c2 returned. Either way the events after those two are the same.
    in_flight = [(ProgressKind.WAITING, "c2"), (ProgressKind.SETTLED, "c2")]
    if [(p.event, p.effect.tool_call_id if p.effect else None) for p in progress[2:4]] == (
        in_flight
    ):
        del progress[2:4]
    steps = [(p.event, p.effect.tool_call_id if p.effect else None) for p in progress]
    assert steps == [
        (ProgressKind.REQUESTED, None),
        (ProgressKind.OBSERVED, None),
        (ProgressKind.DROPPED, "c3"),
        (ProgressKind.COMPENSATED, "c2"),
        (ProgressKind.COMPENSATED, "c1"),
        (ProgressKind.CANCELLED, None),
    ]
    assert all(p.thread_id == thread_id for p in progress)
    assert progress[0].reason == "too late" and progress[0].requested_by == "alice"
    assert progress[1].observed_at is not None and progress[0].requested_at is not None
    assert progress[1].observed_at >= progress[0].requested_at
    for undone in progress[3:5]:
        assert undone.effect is not None and undone.effect.status is EffectStatus.COMPENSATED
    # What the events say is what happened.
    assert log.applied("undo:u1") == 1 and log.applied("undo:u2") == 1
    assert log.attempts("w3") == 0
    final = progress[-1].report
    assert final is not None
    report = CancellationReport.model_validate(final)
    assert sorted(e.tool_call_id for e in report.compensated) == ["c1", "c2"]
    assert [e.tool_call_id for e in report.not_run] == ["c3"]
    # Each event has a line a client can print.
    assert all(render.describe_progress(p.model_dump(mode="json")) is not None for p in progress)


def test_a_stop_that_notices_a_call_after_it_ended_streams_no_wait() -> None:
    """``waiting`` is always followed by ``settled``: a stop's watcher that reaches a
    call only after the call ended (its outcome already looked at) says nothing of it.

    The two orders a watcher thread and the call's own end can take, played out one
    after the other in a real graph's stream.
    """
    ledger = Ledger.from_url("memory://")
    thread_id, run_id = running_thread(ledger)
    scope = RunScope(
        ledger=ledger,
        thread_id=thread_id,
        run=ledger.get_run(run_id),
        owner="test",
        signal=CancelSignal(ledger, run_id, poll_interval=1.0),
    )
    ended_first = make_effect(
        ledger, EffectStatus.COMMITTED, thread_id=thread_id, run_id=run_id, tool_call_id="e1"
    )
    noticed_first = make_effect(
        ledger, EffectStatus.DISPATCHED, thread_id=thread_id, run_id=run_id, tool_call_id="e2"
    )
    answers: list[bool] = []

    def race(state: MessagesState) -> dict[str, Any]:
        assert state["messages"] == []
        answers.append(scope.conclude(ended_first.effect_id))
        scope.await_effect(ended_first, 5.0)
        scope.await_effect(noticed_first, 5.0)
        scope.await_effect(noticed_first, 5.0)
        answers.append(scope.conclude(noticed_first.effect_id))
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("race", race)
    builder.add_edge(START, "race")
    graph = builder.compile()
    chunks = list(graph.stream({"messages": []}, stream_mode="custom"))
    steps = [
        (p.event, p.effect.tool_call_id if p.effect else None) for p in progress_events(chunks)
    ]
    assert steps == [(ProgressKind.WAITING, "e2")]
    assert answers == [False, True]
    assert scope.awaited == set()


def test_a_run_outside_a_stream_emits_nothing_and_stops_the_same(
    saver: Any, log: ExecutionLog
) -> None:
    """Plain invoke(): the events go nowhere; the stop is handled as ever."""
    thread_id = new_thread()

    def stop(_item: str) -> None:
        request_cancel(saver, thread_id, reason="stop", requested_by="test")

    tools = [
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE, after=stop),
        counting_tool(log, "w2", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(calls(("w1", "a", "d1"), ("w2", "b", "d2")))
    graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
    out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    assert out["cancellation_report"]["status"] == "cancelled"
    assert log.attempts("w2") == 0


def test_create_agent_streams_the_stop(saver: Any) -> None:
    """``EffectMiddleware``: a stop between two model calls streams its steps too."""
    agents = pytest.importorskip("langchain.agents")
    from langgraph_cancel.middleware import EffectMiddleware

    thread = new_thread()
    refunded = threading.Event()
    stopped = threading.Event()

    @effect(EffectKind.IRREVERSIBLE)
    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        time.sleep(0.2)
        refunded.set()
        # The user presses stop while this refund is out: it returns only once the stop
        # is recorded, so the stop lands between the two model calls however loaded
        # the machine is.
        stopped.wait(timeout=10)
        return f"refunded {order_id}"

    model = ScriptedChatModel(
        [
            AIMessage("", tool_calls=[tool_call("refund", {"order_id": "o1"})]),
            AIMessage("", tool_calls=[tool_call("refund", {"order_id": "o2"})]),
            AIMessage("never said"),
        ]
    )
    agent = agents.create_agent(
        model, [refund], middleware=[EffectMiddleware(approval=False)], checkpointer=saver
    )

    def stop() -> None:
        deadline = time.monotonic() + 10
        while not refunded.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)
        request_cancel(saver, thread, reason="user pressed stop", requested_by="test")
        stopped.set()

    stopper = threading.Thread(target=stop)
    stopper.start()
    chunks = list(
        agent.stream(
            {"messages": [HumanMessage("refund")]},
            {"configurable": {"thread_id": thread}},
            stream_mode="custom",
        )
    )
    stopper.join()
    kinds = [p.event for p in progress_events(chunks)]
    assert kinds[:2] == [ProgressKind.REQUESTED, ProgressKind.OBSERVED]
    assert kinds[-1] is ProgressKind.CANCELLED
    final = progress_events(chunks)[-1].report
    assert final is not None
    assert [e.args for e in CancellationReport.model_validate(final).permanent] == [
        {"order_id": "o1"}
    ]


def test_the_graph_view_draws_where_a_stop_goes(saver: Any, log: ExecutionLog) -> None:
    """Every node may divert to the cancel node, and the reconcile node may too: drawn."""
    tools = [counting_tool(log, "w1", EffectKind.IRREVERSIBLE)]
    graph = cancellable(agent_builder(scripted("hi"), EffectToolNode(tools)), saver)
    edges = {(e.source, e.target) for e in graph.get_graph().edges}
    user_nodes = {"agent", "tools"}
    assert {(node, CANCEL_NODE) for node in user_nodes} <= edges
    assert (RECONCILE_NODE, CANCEL_NODE) in edges
    assert (CANCEL_NODE, "__end__") in edges
    # The declared destinations only draw: a run that is not stopped goes as before.
    out = graph.invoke({"messages": [HumanMessage("hello")]}, config_for(new_thread()))
    assert out["messages"][-1].content == "hi"
    assert out.get("cancellation_report") is None

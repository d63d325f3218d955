"""Runs with no lease of their own hold the thread's lease while their calls are in flight.

A ``create_agent`` agent with ``EffectMiddleware``, or an ``EffectToolNode`` in a graph
without ``add_cancellation``, has no invocation lease. A sweeper, or an operator's
``reconcile --all``, running meanwhile in another process must leave a call in flight
to its worker: settled from outside, it would be recorded ``unknown`` (or
``not_applied`` by a hook asked before the provider saw the request), and the worker's
own outcome refused. A worker killed mid-call still leaves the call to the sweeper.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph

import langgraph_cancel.execution.call_lease as call_lease
from cli_util import run_cli
from langgraph_cancel import EffectKind, Outcome, effect, get_report, request_cancel, sweep
from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.execution.call_lease import CALL_LEASES
from langgraph_cancel.middleware import EffectMiddleware
from langgraph_cancel.nodes.tool_node import EffectToolNode
from langgraph_cancel.runtime import worker_id
from langgraph_cancel.sweep_summary import SweepActionKind
from langgraph_cancel.testing import ScriptedChatModel, tool_call
from langgraph_cancel.types import RunStatus

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class Provider:
    """A refund provider whose requests the test holds in flight."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.applied: list[str] = []

    def tool(self) -> BaseTool:
        applied = self.applied

        def ask(key: str, args: dict[str, Any]) -> Outcome:
            return Outcome.committed("found") if key in applied else Outcome.not_applied()

        @effect(
            EffectKind.IRREVERSIBLE,
            idempotency_key=lambda a: f"refund:{a['order_id']}",
            reconcile=ask,
            requires_approval=False,
        )
        @tool
        def issue_refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            self.started.set()
            assert self.release.wait(60), "the test never let the refund through"
            applied.append(f"refund:{order_id}")
            return f"refunded {amount} on {order_id}"

        return issue_refund


def _model(*order_ids: str) -> ScriptedChatModel:
    calls = [
        tool_call("issue_refund", {"order_id": order, "amount": 5.0}, id=f"c-{order}")
        for order in order_ids
    ]
    return ScriptedChatModel([AIMessage("", tool_calls=calls), "done"], on_exhausted="repeat_last")


@contextmanager
def _saver(backend: str, url: str) -> Iterator[Any]:
    if backend == "sqlite":
        saver = SqliteCancelSaver(
            sqlite3.connect(url.removeprefix("sqlite:///"), check_same_thread=False)
        )
        saver.setup()
        yield saver
        return
    with PostgresCancelSaver.from_conn_string(url) as pg_saver:
        pg_saver.setup()
        yield pg_saver


@pytest.fixture(params=BACKENDS)
def database(request: pytest.FixtureRequest) -> tuple[str, str]:
    backend: str = request.param
    return backend, request.getfixturevalue("pg_url" if backend == "postgres" else "sqlite_url")


def _statuses(saver: Any, thread_id: str) -> dict[str, str]:
    return {rec.tool_call_id: rec.status.value for rec in saver.ledger.effects(thread_id)}


def _in_flight(provider: Provider, worker: threading.Thread) -> None:
    deadline = time.monotonic() + 30
    while not provider.started.wait(0.05):
        assert worker.is_alive() and time.monotonic() < deadline, "the refund never started"


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_sweep_and_a_reconcile_in_another_process_leave_a_create_agent_call_in_flight(
    database: tuple[str, str],
    mode: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend, url = database
    provider = Provider()
    thread_id = f"agent-{mode}"
    cfg: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    with _saver(backend, url) as saver:
        agent = create_agent(
            _model("o-1"),
            [provider.tool()],
            middleware=[EffectMiddleware(approval=False)],
            checkpointer=saver,
        )
        out: dict[str, Any] = {}

        def run() -> None:
            message: Any = {"messages": [HumanMessage("refund o-1")]}
            if mode == "invoke":
                out["state"] = agent.invoke(message, cfg)
            else:
                out["state"] = asyncio.run(agent.ainvoke(message, cfg))

        worker = threading.Thread(target=run)
        worker.start()
        try:
            _in_flight(provider, worker)
            swept = run_cli(["sweep", "--db", url, "--json"], tmp_path)
            reconciled = run_cli(["reconcile", "--all", "--db", url, "--json"], tmp_path)
            assert swept.returncode == 0, swept.stderr
            assert reconciled.returncode == 0, reconciled.stderr
            assert _statuses(saver, thread_id) == {"c-o-1": "dispatched"}
            lease = saver.ledger.lease(thread_id)
            assert lease is not None and lease.owner == worker_id(), lease
            (looked_at,) = json.loads(reconciled.stdout)
            assert looked_at["busy"] == worker_id(), looked_at
        finally:
            provider.release.set()
            worker.join(60)
        assert out["state"]["messages"][-1].content == "done"
        assert provider.applied == ["refund:o-1"]
        assert _statuses(saver, thread_id) == {"c-o-1": "committed"}
        assert saver.ledger.lease(thread_id) is None, "the call lease was let go"
        assert CALL_LEASES.held() == 0
        assert "could not record the outcome" not in caplog.text


def test_a_turns_calls_share_one_lease_until_the_last_is_recorded(sqlite_url: str) -> None:
    provider = Provider()
    thread_id = "two-calls"
    cfg: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    with _saver("sqlite", sqlite_url) as saver:
        agent = create_agent(
            _model("o-1", "o-2"),
            [provider.tool()],
            middleware=[EffectMiddleware(approval=False)],
            checkpointer=saver,
        )
        worker = threading.Thread(
            target=agent.invoke, args=({"messages": [HumanMessage("refund both")]}, cfg)
        )
        worker.start()
        try:
            _in_flight(provider, worker)
            assert CALL_LEASES.held() == 1
            assert sweep(saver, tools=[provider.tool()]).actions == ()
        finally:
            provider.release.set()
            worker.join(60)
        assert sorted(provider.applied) == ["refund:o-1", "refund:o-2"]
        assert _statuses(saver, thread_id) == {"c-o-1": "committed", "c-o-2": "committed"}
        assert saver.ledger.lease(thread_id) is None
        assert CALL_LEASES.held() == 0


def test_an_effect_tool_node_without_add_cancellation_holds_the_lease_over_its_batch(
    sqlite_url: str, tmp_path: Path
) -> None:
    provider = Provider()
    refund = provider.tool()
    model = _model("o-7")
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", EffectToolNode([refund]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges(
        "agent", lambda state: "tools" if state["messages"][-1].tool_calls else END
    )
    builder.add_edge("tools", "agent")
    thread_id = "bare-node"
    cfg: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    with _saver("sqlite", sqlite_url) as saver:
        graph = builder.compile(checkpointer=saver)
        worker = threading.Thread(
            target=graph.invoke, args=({"messages": [HumanMessage("refund o-7")]}, cfg)
        )
        worker.start()
        try:
            _in_flight(provider, worker)
            reconciled = run_cli(["reconcile", "--all", "--db", sqlite_url, "--json"], tmp_path)
            assert reconciled.returncode == 0, reconciled.stderr
            assert _statuses(saver, thread_id) == {"c-o-7": "dispatched"}
        finally:
            provider.release.set()
            worker.join(60)
        assert _statuses(saver, thread_id) == {"c-o-7": "committed"}
        assert saver.ledger.lease(thread_id) is None


def test_a_call_waits_for_a_lease_another_owner_holds_then_is_refused(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = Provider()
    provider.release.set()
    thread_id = "held-elsewhere"
    cfg: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    with _saver("sqlite", sqlite_url) as saver:
        model = ScriptedChatModel(
            [
                AIMessage(
                    "",
                    tool_calls=[
                        tool_call("issue_refund", {"order_id": "o-3", "amount": 5.0}, id="c-o-3")
                    ],
                ),
                "done",
                AIMessage(
                    "",
                    tool_calls=[
                        tool_call("issue_refund", {"order_id": "o-4", "amount": 5.0}, id="c-o-4")
                    ],
                ),
                "done",
            ]
        )
        agent = create_agent(
            model,
            [provider.tool()],
            middleware=[EffectMiddleware(approval=False)],
            checkpointer=saver,
        )
        saver.ledger.start_run(thread_id, owner="someone")
        saver.ledger.acquire_lease(thread_id, "sweeper-elsewhere", ttl=60)
        # Let go after a short while: the call waits for it and then goes out.
        threading.Timer(0.5, saver.ledger.release_lease, (thread_id, "sweeper-elsewhere")).start()
        out = agent.invoke({"messages": [HumanMessage("refund o-3")]}, cfg)
        assert out["messages"][-1].content == "done"
        assert provider.applied == ["refund:o-3"]

        saver.ledger.acquire_lease(thread_id, "sweeper-elsewhere", ttl=60)
        monkeypatch.setattr(call_lease, "CALL_LEASE_WAIT", 0.3)
        with pytest.raises(ThreadBusyError) as refused:
            agent.invoke({"messages": [HumanMessage("and o-4")]}, cfg)
        assert refused.value.owner == "sweeper-elsewhere"
        assert provider.applied == ["refund:o-3"], "nothing went out without the lease"
        assert CALL_LEASES.held() == 0


WORKER = """
import sys, sqlite3
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph_cancel import EffectKind, effect
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.middleware import EffectMiddleware
from langgraph_cancel.testing import ScriptedChatModel, tool_call
from langgraph_cancel.types import RunStatus

path, started = sys.argv[1], sys.argv[2]

@effect(EffectKind.IRREVERSIBLE, idempotency_key=lambda a: f"refund:{a['order_id']}")
@tool
def issue_refund(order_id: str, amount: float) -> str:
    '''Refund an order.'''
    open(started, "w").write("in flight")
    import time
    time.sleep(600)
    return "never"

saver = SqliteCancelSaver(sqlite3.connect(path, check_same_thread=False))
saver.setup()
call = tool_call("issue_refund", {"order_id": "o-9", "amount": 5.0}, id="c-o-9")
model = ScriptedChatModel([AIMessage("", tool_calls=[call]), "done"], on_exhausted="repeat_last")
agent = create_agent(model, [issue_refund], middleware=[EffectMiddleware(approval=False)],
                     checkpointer=saver)
agent.invoke({"messages": [HumanMessage("refund o-9")]}, {"configurable": {"thread_id": "killed"}})
"""


def test_a_create_agent_worker_killed_mid_call_leaves_the_call_to_the_sweeper(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    started = tmp_path / "started"
    child = subprocess.Popen(
        [sys.executable, "-c", WORKER, path, str(started)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert child.poll() is None and time.monotonic() < deadline, "no call went out"
            time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    provider = Provider()  # the provider never saw the dead worker's request
    with _saver("sqlite", sqlite_url) as saver, caplog.at_level(logging.INFO):
        lease = saver.ledger.lease("killed")
        assert lease is not None and lease.owner != worker_id(), lease
        summary = sweep(saver, tools=[provider.tool()])
        kinds = {action.kind for action in summary.actions}
        assert SweepActionKind.TOOK_OVER_LEASE in kinds, summary.actions
        assert SweepActionKind.RECONCILED in kinds, summary.actions
        assert _statuses(saver, "killed") == {"c-o-9": "not_applied"}
        assert saver.ledger.lease("killed") is None


FORKED = """
import os, sys
from langgraph_cancel.execution.call_lease import CALL_LEASES
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.runtime.scope import RunScope
from langgraph_cancel.runtime.signal import CancelSignal

ledger = Ledger.from_url(sys.argv[1])
run = ledger.start_run("forked", owner="parent")
scope = RunScope(ledger=ledger, thread_id="forked", run=run, owner="parent",
                 signal=CancelSignal(ledger, run.run_id, poll_interval=1.0))
with CALL_LEASES.holding(scope, "parent"):
    assert CALL_LEASES.held() == 1
    child = os.fork()
    if child == 0:
        os._exit(0 if CALL_LEASES.held() == 0 else 3)
    _, status = os.waitpid(child, 0)
print("child", os.waitstatus_to_exitcode(status), "parent after", CALL_LEASES.held())
"""


def test_a_forked_child_holds_none_of_its_parents_call_leases(
    sqlite_url: str, tmp_path: Path
) -> None:
    # Celery prefork and gunicorn --preload fork workers from a parent that may be in
    # the middle of a call: the child is another worker, with nothing to let go.
    proc = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", FORKED, sqlite_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["child", "0", "parent", "after", "0"], proc.stdout


def test_a_stop_asked_for_during_a_model_call_is_left_to_the_live_worker(
    sqlite_url: str,
) -> None:
    # A model that thinks longer than the sweeper's grace: the stop is the worker's to
    # finish at its next step, with every call the model then asked for in its report.
    provider = Provider()
    provider.release.set()
    thinking, answer = threading.Event(), threading.Event()
    follow_up = tool_call("issue_refund", {"order_id": "o-6", "amount": 5.0}, id="c-o-6")

    def slow_turn(messages: list[BaseMessage]) -> AIMessage:
        thinking.set()
        assert answer.wait(60), "the test never let the model answer"
        return AIMessage("", tool_calls=[follow_up])

    first = tool_call("issue_refund", {"order_id": "o-5", "amount": 5.0}, id="c-o-5")
    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[first]), slow_turn, "done"], on_exhausted="repeat_last"
    )
    thread_id = "thinking"
    cfg: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    with _saver("sqlite", sqlite_url) as saver:
        agent = create_agent(
            model,
            [provider.tool()],
            middleware=[EffectMiddleware(approval=False)],
            checkpointer=saver,
        )
        out: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda: out.update(
                state=agent.invoke({"messages": [HumanMessage("refund o-5")]}, cfg)
            )
        )
        worker.start()
        try:
            assert thinking.wait(30), "the model was never asked again"
            assert request_cancel(saver, thread_id, reason="user", requested_by="test").accepted
            swept = sweep(saver, tools=[provider.tool()], cancel_grace=0)
            assert swept.actions == (), swept.actions
            assert saver.ledger.require_latest_run(thread_id).status is not RunStatus.CANCELLED
        finally:
            answer.set()
            worker.join(60)
        report = get_report(saver, thread_id)
        assert report.status == "cancelled"
        assert [e.tool_call_id for e in report.permanent] == ["c-o-5"]
        assert [e.tool_call_id for e in report.not_run] == ["c-o-6"]
        assert out["state"]["cancellation_report"] == report.model_dump(mode="json")
        assert provider.applied == ["refund:o-5"]
        assert saver.ledger.lease(thread_id) is None

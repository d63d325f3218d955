"""Delay windows held by the package: the intent is written with a release time and the
outbox sends the call once the window has passed, exactly once, across kill -9 of the
graph's process and of the outbox worker; a stop inside the window revokes it and the
call never goes out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import BaseTool, StructuredTool

from cli_util import cli_env
from graphs import agent_builder, config_for, new_thread, scripted, wait_until
from langgraph_cancel import EffectKind, EffectToolNode, add_cancellation, effect
from langgraph_cancel.api import request_cancel
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.effects import idempotency_key
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.outbox import Outbox
from langgraph_cancel.report import CancellationReport
from langgraph_cancel.testing import tool_call
from langgraph_cancel.types import EffectStatus, RunStatus, utcnow
from module_fixtures import db_url_fixture, saver_fixture  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "outbox_worker.py"


@pytest.fixture
def providers(tmp_path: Path) -> Providers:
    return Providers(tmp_path / "providers.db")


def held_tool(providers: Providers, window: timedelta) -> BaseTool:
    def send_later(to: str, subject: str) -> str:
        return str(providers.send_email(to, subject, "body", idempotency_key())["email_id"])

    return effect(EffectKind.IRREVERSIBLE, delay=window, retry_safe=True, requires_approval=False)(
        StructuredTool.from_function(send_later, name="send_later", description="Email later.")
    )


def _turn(call_id: str, to: str) -> AIMessage:
    return AIMessage(
        "", tool_calls=[tool_call("send_later", {"to": to, "subject": "s"}, id=call_id)]
    )


def test_a_held_call_goes_out_once_after_its_window(saver: Any, providers: Providers) -> None:
    tool = held_tool(providers, timedelta(seconds=0.5))
    builder = agent_builder(scripted(_turn("h1", "a@x.io")), EffectToolNode([tool]))
    graph = add_cancellation(builder).compile(checkpointer=saver)
    thread_id = new_thread()
    out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    answer = out["messages"][2]
    assert "Scheduled: held until" in answer.content
    (held,) = saver.ledger.effects(thread_id)
    assert held.status is EffectStatus.SCHEDULED and held.held and held.dispatched_at is None
    assert providers.truth()["emails"] == []  # the run completed; nothing went out
    outbox = Outbox(saver.ledger, [tool], worker="w1")
    assert outbox.drain().total == 0  # not yet due
    wait_until(lambda: utcnow() >= held.release_at, timeout=5, what="the window to pass")
    result = outbox.drain()
    assert [e.effect_id for e in result.sent] == [held.effect_id]
    assert result.sent[0].status is EffectStatus.COMMITTED
    assert outbox.drain().total == 0
    assert providers.executions(held.idempotency_key) == 1
    assert [e["key"] for e in providers.truth()["emails"]] == [held.idempotency_key]
    history = [h.to_status for h in saver.ledger.history(held.effect_id)]
    assert history[-3:] == [EffectStatus.SCHEDULED, EffectStatus.DISPATCHED, EffectStatus.COMMITTED]


def test_a_stop_inside_the_window_drops_the_held_call(saver: Any, providers: Providers) -> None:
    tool = held_tool(providers, timedelta(seconds=0.5))
    model = scripted(_turn("h1", "a@x.io"), _turn("h2", "b@x.io"))
    graph = add_cancellation(agent_builder(model, EffectToolNode([tool]))).compile(
        checkpointer=saver, interrupt_before=["tools"]
    )
    thread_id = new_thread()
    cfg = config_for(thread_id)
    graph.invoke({"messages": [HumanMessage("go")]}, cfg)
    graph.invoke(None, cfg)  # h1 is held; the graph pauses before h2
    assert request_cancel(saver, thread_id, reason="stop", requested_by="test").accepted
    graph.invoke(None, cfg)
    report = CancellationReport.model_validate(graph.get_state(cfg).values["cancellation_report"])
    assert [e.tool_call_id for e in report.revoked] == ["h1"]
    assert [e.tool_call_id for e in report.not_run] == ["h2"]
    time.sleep(0.6)
    assert Outbox(saver.ledger, [tool]).drain().total == 0
    assert providers.truth()["emails"] == []


def _cli_outbox(db_url: str, providers: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "langgraph_cancel.cli",
            "outbox",
            "--watch",
            "--interval",
            "0.1",
            "--stale-after",
            "1",
            "--db",
            db_url,
            "--graph",
            f"{WORKER}:TOOLS",
            *extra,
        ],
        env=cli_env({"REFUND_AGENT_PROVIDERS_DB": str(providers), "LGC_TEST_HOLD_SECONDS": "1"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.version_neutral
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_kill9_of_the_graph_and_of_the_outbox_worker_sends_the_call_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db_url = (
        f"sqlite:///{tmp_path / 'agent.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    providers_path = tmp_path / "providers.db"
    providers = Providers(providers_path)
    # The outbox's first request hangs, so the worker is mid-drain when it is killed.
    providers.set_fault("send_email", "hang:4", times=1)
    marker = tmp_path / "held"
    env = cli_env({"REFUND_AGENT_PROVIDERS_DB": str(providers_path), "LGC_TEST_HOLD_SECONDS": "1"})
    graph_proc = subprocess.Popen(
        [sys.executable, str(WORKER), "graph", db_url, "t-held", str(marker)],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: marker.exists() or graph_proc.poll() is not None,
            timeout=120,
            what="the held call's intent",
        )
        assert marker.exists(), f"the graph's process ended first ({graph_proc.returncode})"
        os.kill(graph_proc.pid, signal.SIGKILL)
        graph_proc.wait(30)
    finally:
        if graph_proc.poll() is None:
            graph_proc.kill()
    with Ledger.from_url(db_url) as ledger:
        (held,) = [e for e in ledger.effects("t-held") if e.tool == "send_later"]
        assert held.status is EffectStatus.SCHEDULED and held.dispatched_at is None
        key = held.idempotency_key
        assert providers.attempts(key) == 0
        first = _cli_outbox(db_url, providers_path)
        try:
            wait_until(lambda: providers.attempts(key) == 1, timeout=60, what="the release")
            # The call is in flight at the provider: kill the worker mid-drain.
            assert ledger.get_effect(held.effect_id).status is EffectStatus.DISPATCHED
            assert held.release_at is not None and utcnow() >= held.release_at
            os.kill(first.pid, signal.SIGKILL)
            first.wait(30)
        finally:
            if first.poll() is None:
                first.kill()
        assert providers.executions(key) == 0
        second = _cli_outbox(db_url, providers_path)
        try:
            wait_until(
                lambda: ledger.get_effect(held.effect_id).status is EffectStatus.COMMITTED,
                timeout=90,
                what="the second worker to settle the released call",
            )
        finally:
            second.send_signal(signal.SIGTERM)
            _out, err = second.communicate(timeout=30)
        assert second.returncode == 0, err
        assert providers.executions(key) == 1
        assert [e["key"] for e in providers.truth()["emails"]] == [key]
        trail = ledger.history(held.effect_id)
        assert [h.to_status for h in trail][-4:] == [
            EffectStatus.SCHEDULED,
            EffectStatus.DISPATCHED,
            EffectStatus.DISPATCHED,
            EffectStatus.COMMITTED,
        ]


def test_the_sweeper_leaves_a_call_the_outbox_is_sending_to_the_outbox(
    saver: Any, providers: Providers
) -> None:
    from langgraph_cancel.sweeper import Sweeper

    tool = held_tool(providers, timedelta(seconds=0.05))
    thread_id = new_thread()
    ledger = saver.ledger
    run = ledger.start_run(thread_id)
    rec, _ = ledger.plan(
        thread_id=thread_id,
        run_id=run.run_id,
        tool_call_id="h1",
        tool="send_later",
        kind=EffectKind.IRREVERSIBLE,
        args={"to": "a@x.io", "subject": "s"},
    )
    ledger.transition(rec.effect_id, EffectStatus.SCHEDULED)
    ledger.finish_run(run.run_id, RunStatus.COMPLETED)
    # An outbox worker has released it and is waiting for the provider's answer.
    ledger.transition(
        rec.effect_id,
        EffectStatus.DISPATCHED,
        owner="outbox:busy-worker",
        require_active_run=False,
    )
    Sweeper(ledger, tools=[tool]).sweep_once()
    assert ledger.get_effect(rec.effect_id).status is EffectStatus.DISPATCHED

"""``langgraph-cancel stats`` and the OpenTelemetry export, over real stopped runs.

Six stops of real LangGraph graphs on each backend (memory, SQLite,
PostgreSQL): a refund committed before the stop, undos that succeed, an undo
that fails, a write that outlives the stop's grace (unknown, then committed),
a sub-agent posting in its own thread when its parent is stopped, and a model
streaming tokens through the real ChatOpenAI client. The command line's
numbers and the numbers the OpenTelemetry SDK's in-memory reader collects
must be the same, and each must be what the stops really did.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cli_util import cli_env, ok, run_main
from graphs import (
    ExecutionLog,
    agent_builder,
    calls,
    cancellable,
    config_for,
    counting_tool,
    new_thread,
    scripted,
    wait_until,
)
from langgraph_cancel import (
    EffectKind,
    EffectStatus,
    EffectToolNode,
    add_cancellation,
    effect,
    get_report,
    request_cancel,
)
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.queries import cancelled_trees
from langgraph_cancel.metrics import CancellationStats, read_stats, stopped_roots
from langgraph_cancel.nodes.model import CancellableModelNode
from langgraph_cancel.subagents import child_config
from langgraph_cancel.telemetry import (
    CANCELLATIONS,
    COMPENSATIONS,
    DISPATCHED_IN_WINDOW,
    ORPHANS,
    PERMANENT_EFFECTS,
    QUIESCENCE,
    RUN_SPAN,
    TOKENS_AFTER_SIGNAL,
    TRANSITION_SPAN,
    UNKNOWN_OUTCOMES,
    CancellationTelemetry,
)
from langgraph_cancel.testing.fake_model import ScriptedChatModel, tool_call
from langgraph_cancel.types import utcnow
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)
from openai_stub import OpenAIStub

TIMEOUT = 30.0


# ------------------------------------------------------------------ the stops
def stop_after_a_refund(saver: Any, log: ExecutionLog) -> str:
    """The refund commits, then stop: it is permanent, the email queued behind it never runs."""
    thread_id = new_thread()

    def stop(_item: str) -> None:
        request_cancel(saver, thread_id, reason="user pressed stop", requested_by="alice")

    tools = [
        counting_tool(log, "refund", EffectKind.IRREVERSIBLE, after=stop),
        counting_tool(log, "email", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(calls(("refund", "o-1", "r1"), ("email", "dana", "r2")))
    graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
    graph.invoke({"messages": [HumanMessage("refund o-1")]}, config_for(thread_id))
    return thread_id


def stop_and_undo(saver: Any, log: ExecutionLog) -> str:
    """Two holds committed, then stop with compensate_on_cancel: both undone."""
    thread_id = new_thread()

    def stop(_item: str) -> None:
        request_cancel(saver, thread_id, reason="changed my mind", requested_by="bob")

    tools = [
        counting_tool(log, "hold", EffectKind.REVERSIBLE),
        counting_tool(log, "hold_room", EffectKind.REVERSIBLE, after=stop),
        counting_tool(log, "charge", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(calls(("hold", "a", "u1"), ("hold_room", "b", "u2"), ("charge", "c", "u3")))
    graph = cancellable(
        agent_builder(model, EffectToolNode(tools)), saver, compensate_on_cancel=True
    )
    graph.invoke({"messages": [HumanMessage("book")]}, config_for(thread_id))
    return thread_id


def stop_and_fail_an_undo(saver: Any) -> str:
    """A seat held, then stop: its release is refused by the provider (compensation failed)."""
    thread_id = new_thread()

    def refuse_release(_key: str, _args: dict[str, Any], _result: Any) -> None:
        raise RuntimeError("the airline refuses to release the seat")

    @effect(EffectKind.REVERSIBLE, compensate=refuse_release)
    @tool
    def hold_seat(flight: str) -> str:
        """Hold a seat on a flight."""
        request_cancel(saver, thread_id, reason="trip cancelled", requested_by="carol")
        return f"seat held on {flight}"

    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[tool_call("hold_seat", {"flight": "LH400"}, id="f1")])]
    )
    graph = cancellable(
        agent_builder(model, EffectToolNode([hold_seat])), saver, compensate_on_cancel=True
    )
    graph.invoke({"messages": [HumanMessage("hold a seat")]}, config_for(thread_id))
    return thread_id


def stop_past_the_grace(saver: Any, log: ExecutionLog) -> str:
    """A write in flight outlives the stop's grace: unknown when stopped, committed later."""
    thread_id = new_thread()
    tools = [counting_tool(log, "slow_write", EffectKind.IRREVERSIBLE, reconcile=False)]
    model = scripted(calls(("slow_write", "a", "s1")))
    graph = cancellable(
        agent_builder(model, EffectToolNode(tools, cancel_timeout=0.3)), saver, cancel_timeout=0.3
    )
    log.arm("slow_write")
    errors: list[BaseException] = []

    def invoke() -> None:
        try:
            graph.invoke({"messages": [HumanMessage("write")]}, config_for(thread_id))
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    worker = threading.Thread(target=invoke, daemon=True)
    worker.start()
    try:
        wait_until(lambda: log.started("slow_write"), timeout=TIMEOUT, what="the write to start")
        request_cancel(saver, thread_id, reason="stop", requested_by="dave")
        worker.join(TIMEOUT)
    finally:
        log.release("slow_write")
    assert not worker.is_alive() and not errors, errors
    wait_until(
        lambda: saver.ledger.find_effect(thread_id, "s1").status is EffectStatus.COMMITTED,
        timeout=TIMEOUT,
        what="the late outcome",
    )
    return thread_id


def stop_the_parent_of_a_sub_agent(saver: Any) -> tuple[str, list[str]]:
    """A sub-agent posts on its own thread; the parent is stopped while it does."""
    thread_id = new_thread()
    child_thread = f"{thread_id}-child"
    posted: list[str] = []
    started = threading.Event()

    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def post(text: str) -> str:
        """Post a message."""
        posted.append(text)
        started.set()
        time.sleep(0.2)
        return f"posted {text}"

    turns = [AIMessage("", tool_calls=[tool_call("post", {"text": f"m{i}"})]) for i in range(8)]
    child_model = ScriptedChatModel([*turns, AIMessage("child done")])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [child_model.invoke(state["messages"])]}

    child_builder = StateGraph(MessagesState)
    child_builder.add_node("agent", agent)
    child_builder.add_node("tools", EffectToolNode([post]))
    child_builder.add_edge(START, "agent")
    child_builder.add_conditional_edges("agent", tools_condition)
    child_builder.add_edge("tools", "agent")
    child = add_cancellation(child_builder).compile(checkpointer=saver)

    def delegate(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        out = child.invoke({"messages": [HumanMessage("post")]}, child_config(config, child_thread))
        return {"messages": [AIMessage(f"child said: {out['messages'][-1].content}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("delegate", delegate)
    builder.add_edge(START, "delegate")
    builder.add_edge("delegate", END)
    parent = add_cancellation(builder).compile(checkpointer=saver)

    def stop() -> None:
        assert started.wait(TIMEOUT)
        request_cancel(saver, thread_id, reason="user pressed stop", requested_by="erin")

    stopper = threading.Thread(target=stop)
    stopper.start()
    parent.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
    stopper.join()
    return thread_id, posted


def stop_the_token_bill(saver: Any) -> str:
    """The real ChatOpenAI client streaming from a local server, stopped mid-answer."""
    thread_id = new_thread()
    with OpenAIStub(tokens=400, delay=0.01) as stub:
        # Its constructor's aliases (model, api_key, base_url) are not in its stubs.
        client: dict[str, Any] = {
            "base_url": stub.base_url,
            "api_key": "test-key",
            "model": "stub",
            "streaming": True,
            "max_retries": 0,
        }
        model = ChatOpenAI(**client)
        builder = StateGraph(MessagesState)
        builder.add_node("agent", CancellableModelNode(model))
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        graph = add_cancellation(builder).compile(checkpointer=saver)

        def stop() -> None:
            wait_until(lambda: stub.state.sent >= 20, timeout=TIMEOUT, what="tokens to flow")
            request_cancel(saver, thread_id, reason="too long", requested_by="frank")

        stopper = threading.Thread(target=stop)
        stopper.start()
        graph.invoke({"messages": [HumanMessage("write a lot")]}, config_for(thread_id))
        stopper.join()
    return thread_id


# ------------------------------------------------------------------ reading OpenTelemetry
class Collected:
    """What the OpenTelemetry SDK's in-memory reader and exporter hold."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.points: dict[str, list[Any]] = {}

    def collect(self) -> None:
        data = self.reader.get_metrics_data()
        assert data is not None
        self.points = {
            metric.name: list(metric.data.data_points)
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }

    def total(self, name: str) -> float:
        points = self.points.get(name, [])
        assert all(isinstance(p, NumberDataPoint) for p in points)
        return float(sum(p.value for p in points))

    def by_tool(self, name: str, **match: str) -> dict[str, int]:
        out: Counter[str] = Counter()
        for point in self.points.get(name, []):
            attributes = dict(point.attributes or {})
            if all(attributes.get(k) == v for k, v in match.items()) and point.value:
                out[str(attributes["tool"])] += int(point.value)
        return dict(out)

    def histogram(self, name: str) -> HistogramDataPoint:
        (point,) = self.points[name]
        assert isinstance(point, HistogramDataPoint)
        return point

    def spans(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()


def attribute(span: ReadableSpan, name: str) -> str:
    """A ``langgraph_cancel.*`` attribute of a span, as text."""
    return str((span.attributes or {})[f"langgraph_cancel.{name}"])


def tools_with(stats: CancellationStats, field: str) -> dict[str, int]:
    return {
        tool: getattr(numbers, field)
        for tool, numbers in stats.tools.items()
        if getattr(numbers, field)
    }


def stats_of(db_url: str, ledger: Ledger, since: datetime, cwd: Path) -> CancellationStats:
    """What ``langgraph-cancel stats --json`` prints (in-process ledgers: what it computes)."""
    if db_url.startswith("memory"):
        # Another process cannot see an in-process ledger: the function the command calls.
        return read_stats(ledger, since=since)
    proc = run_main(["stats", "--db", db_url, "--json", "--since", since.isoformat()], cwd)
    return CancellationStats.model_validate_json(ok(proc))


# ------------------------------------------------------------------ the test
def test_stats_and_the_opentelemetry_export_agree_on_real_stops(
    saver: Any, log: ExecutionLog, db_url: str, tmp_path: Path
) -> None:
    since = utcnow()
    refunded = stop_after_a_refund(saver, log)
    undone = stop_and_undo(saver, log)
    refused = stop_and_fail_an_undo(saver)
    late = stop_past_the_grace(saver, log)
    delegated, posted = stop_the_parent_of_a_sub_agent(saver)
    billed = stop_the_token_bill(saver)
    threads = [refunded, undone, refused, late, delegated, billed]
    reports = {thread: get_report(saver, thread) for thread in threads}
    assert all(report.status == "cancelled" for report in reports.values())

    stats = stats_of(db_url, saver.ledger, since, tmp_path)

    # --- what the stops did, counted
    assert stats.cancellations == 6 and stats.quiesced == 6  # the sub-agent is its parent's
    assert stats.quiescence_ms.count == 6
    assert stats.quiescence_ms.max == max(r.quiescence_ms or 0.0 for r in reports.values())
    assert stats.dispatched_in_window == 0  # nothing left the process after a stop
    assert stats.unknown == 1 and tools_with(stats, "unknown") == {"slow_write": 1}
    assert stats.orphans == 0
    assert tools_with(stats, "permanent") == {
        "refund": 1,
        "slow_write": 1,  # unknown when stopped, committed since: it survived
        "post": len(posted),  # in the child's thread, counted in the parent's stop
    }
    assert tools_with(stats, "compensations_succeeded") == {"hold": 1, "hold_room": 1}
    assert tools_with(stats, "compensations_failed") == {"hold_seat": 1}
    assert stats.compensation_success_rate == pytest.approx(2 / 3, abs=1e-4)
    assert stats.tokens_after_signal == reports[billed].tokens_after_cancel
    # The report of each stop and its numbers say the same.
    by_thread = {numbers.thread_id: numbers for numbers in stats.runs}
    assert set(by_thread) == set(threads)
    for thread, report in reports.items():
        assert by_thread[thread].quiescence_ms == report.quiescence_ms
        assert sum(by_thread[thread].unknown.values()) == len(report.unknown)
    if not db_url.startswith("memory"):
        # The command and the library compute the same numbers.
        direct = read_stats(saver.ledger, since=since, now=stats.until)
        assert direct.model_dump(exclude={"until"}) == stats.model_dump(exclude={"until"})

    # --- the same runs through OpenTelemetry
    otel = Collected()
    telemetry = CancellationTelemetry(tracer_provider=otel.tracers, meter_provider=otel.meters)
    exported = telemetry.export(saver.ledger, since=since)
    assert {numbers.thread_id for numbers in exported} == set(threads)
    otel.collect()
    assert otel.total(CANCELLATIONS) == stats.cancellations
    quiescence = otel.histogram(QUIESCENCE)
    assert quiescence.count == stats.quiescence_ms.count
    assert quiescence.max == stats.quiescence_ms.max
    assert quiescence.sum == pytest.approx(stats.quiescence_ms.total, abs=1e-3)
    assert otel.total(DISPATCHED_IN_WINDOW) == stats.dispatched_in_window
    assert otel.by_tool(DISPATCHED_IN_WINDOW) == tools_with(stats, "dispatched_in_window")
    assert otel.total(UNKNOWN_OUTCOMES) == stats.unknown
    assert otel.by_tool(UNKNOWN_OUTCOMES) == tools_with(stats, "unknown")
    assert otel.total(ORPHANS) == stats.orphans
    assert otel.total(PERMANENT_EFFECTS) == stats.permanent
    assert otel.by_tool(PERMANENT_EFFECTS) == tools_with(stats, "permanent")
    succeeded = otel.by_tool(COMPENSATIONS, outcome="succeeded")
    failed = otel.by_tool(COMPENSATIONS, outcome="failed")
    assert succeeded == tools_with(stats, "compensations_succeeded")
    assert failed == tools_with(stats, "compensations_failed")
    tried = sum(succeeded.values()) + sum(failed.values())
    assert round(sum(succeeded.values()) / tried, 4) == stats.compensation_success_rate
    assert otel.total(TOKENS_AFTER_SIGNAL) == stats.tokens_after_signal

    # --- a span per run (the sub-agent's under its parent's), one per effect transition
    trees = stopped_roots(cancelled_trees(saver.ledger, since))
    spans = otel.spans()
    run_spans = {attribute(span, "run_id"): span for span in spans if span.name == RUN_SPAN}
    assert set(run_spans) == {run.run_id for tree in trees for run in [tree.run, *tree.runs]}
    child_run = saver.ledger.latest_run(f"{delegated}-child")
    parent_run = saver.ledger.latest_run(delegated)
    assert child_run is not None and parent_run is not None
    child_span, parent_span = run_spans[child_run.run_id], run_spans[parent_run.run_id]
    assert child_span.parent is not None and parent_span.context is not None
    assert child_span.parent.span_id == parent_span.context.span_id
    assert [e.name for e in parent_span.events] == ["stop requested", "stop observed", "quiesced"]
    transitions = [span for span in spans if span.name.startswith(TRANSITION_SPAN)]
    assert len(transitions) == sum(len(tree.transitions) for tree in trees)
    post_steps = [span for span in transitions if attribute(span, "tool") == "post"]
    child_context = child_span.context
    assert post_steps and child_context is not None
    assert all(
        span.parent is not None and span.parent.span_id == child_context.span_id
        for span in post_steps
    )
    assert all((span.start_time or 0) <= (span.end_time or 0) for span in transitions)
    assert {attribute(span, "to_status") for span in post_steps} >= {"dispatched", "committed"}

    # --- each run is exported once
    assert telemetry.export(saver.ledger, since=since) == []
    assert len(otel.spans()) == len(spans)

    # --- the human view: every number on a line that fits a terminal
    if not db_url.startswith("memory"):
        text = ok(run_main(["stats", "--db", db_url, "--since", since.isoformat()], tmp_path))
        assert "Cancellations since" in text and ": 6 (6 quiesced)" in text
        assert "66.7% succeeded (2 of 3)" in text
        for tool_name in ("refund", "slow_write", "post", "hold_seat"):
            assert tool_name in text
        assert max(len(line) for line in text.splitlines()) <= 80, text
        assert all(line == line.rstrip() for line in text.splitlines()), text
        assert "hold_seat" in text.split("Per tool")[1] and "0/1" in text


def test_a_stop_still_in_progress_is_counted_by_stats_but_exported_when_it_ends(
    saver: Any, log: ExecutionLog
) -> None:
    since = utcnow()
    thread_id = new_thread()
    tools = [counting_tool(log, "slow_write", EffectKind.IRREVERSIBLE)]
    graph = cancellable(
        agent_builder(scripted(calls(("slow_write", "a", "p1"))), EffectToolNode(tools)), saver
    )
    log.arm("slow_write")
    worker = threading.Thread(
        target=lambda: graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread_id)),
        daemon=True,
    )
    worker.start()
    otel = Collected()
    telemetry = CancellationTelemetry(tracer_provider=otel.tracers, meter_provider=otel.meters)
    try:
        wait_until(lambda: log.started("slow_write"), timeout=TIMEOUT, what="the write")
        request_cancel(saver, thread_id, reason="stop", requested_by="t")
        running = read_stats(saver.ledger, since=since)
        assert running.cancellations == 1 and running.quiesced == 0
        assert running.unknown == 1  # in flight, as the ledger stands
        assert telemetry.export(saver.ledger, since=since) == []
    finally:
        log.release("slow_write")
        worker.join(TIMEOUT)
    done = read_stats(saver.ledger, since=since)
    assert done.quiesced == 1 and done.unknown == 0 and done.permanent == 1
    (numbers,) = telemetry.export(saver.ledger, since=since)
    assert numbers.thread_id == thread_id
    otel.collect()
    assert otel.total(PERMANENT_EFFECTS) == 1 and otel.histogram(QUIESCENCE).count == 1


_IMPORTS_PROBE = """
import sys
from langgraph_cancel.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("langchain_core", "langgraph", "langsmith", "opentelemetry")
               if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_stats_imports_neither_langgraph_nor_opentelemetry(tmp_path: Path, as_json: bool) -> None:
    url = "sqlite:///" + str(tmp_path / "ledger.db")
    Ledger.from_url(url).close()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _IMPORTS_PROBE,
            "stats",
            "--db",
            url,
            *(["--json"] if as_json else []),
        ],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stderr, proc.stderr
    assert ('"cancellations": 0' if as_json else "No run was asked to stop") in proc.stdout


def test_stats_refuses_a_bad_window_and_a_missing_database(tmp_path: Path) -> None:
    bad = run_main(["stats", "--since", "last tuesday", "--db", "memory://"], tmp_path)
    assert bad.returncode == 1 and "--since" in bad.stderr
    missing = run_main(["stats", "--db", str(tmp_path / "nope.db"), "--json"], tmp_path)
    assert missing.returncode == 1 and '"error"' in missing.stdout
    assert not (tmp_path / "nope.db").exists()

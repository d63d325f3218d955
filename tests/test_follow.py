"""``langgraph-cancel cancel --follow``: a stop's progress read from the ledger elsewhere.

A real graph runs in a thread of the test process, streaming its own progress
events; the stop is pressed and followed by another process (the command line,
on SQLite and PostgreSQL) or, on the in-process memory ledger, by another
thread. What the follower reads from the ledger must be what the run streamed:
the same steps, in the same order, ending with the same report.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph

from cli_util import cli_env, flat, run_main
from graphs import (
    ExecutionLog,
    agent_builder,
    backend_params,
    calls,
    cancellable,
    collect_custom,
    config_for,
    counting_tool,
    module_database,
    new_thread,
    open_saver,
    progress_events,
    scripted,
    wait_until,
)
from langgraph_cancel import (
    CancellationReport,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    add_cancellation,
    request_cancel,
)
from langgraph_cancel.follow import follow
from langgraph_cancel.progress import ProgressEvent, ProgressKind
from langgraph_cancel.subagents import child_config
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)

TIMEOUT = 60.0


@pytest.fixture(name="durable", params=backend_params(durable_only=True))
def durable_fixture(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    """SQLite and PostgreSQL (a database another process can open), with a saver on it."""
    with module_database(request) as url, open_saver(url) as saver:
        yield url, saver


_PROBE = """
import sys
from langgraph_cancel.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("langchain_core", "langgraph", "langsmith") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


class Worker:
    """The graph: a hold in flight (held at the provider), a refund and an email queued.

    The reversible hold goes first (irreversible calls go last in a batch).
    """

    def __init__(self, saver: Any, log: ExecutionLog) -> None:
        self.thread_id = new_thread()
        self.log = log
        tools = [
            counting_tool(log, "refund", EffectKind.IRREVERSIBLE),
            counting_tool(log, "hold", EffectKind.REVERSIBLE),
            counting_tool(log, "email", EffectKind.IRREVERSIBLE),
            counting_tool(log, "ticket", EffectKind.REVERSIBLE),
        ]
        model = scripted(
            calls(("refund", "o-1", "f1"), ("hold", "o-1", "f2"), ("email", "a", "f3")),
            calls(("ticket", "t", "f4")),
        )
        self.graph = cancellable(agent_builder(model, EffectToolNode(tools)), saver)
        self.saver = saver
        self.chunks: list[Any] = []
        self.error: BaseException | None = None
        log.arm("hold")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        wait_until(lambda: log.started("hold"), timeout=TIMEOUT, what="the hold in flight")

    def _run(self) -> None:
        try:
            self.chunks = collect_custom(
                self.graph,
                {"messages": [HumanMessage("refund o-1")]},
                config_for(self.thread_id),
                use_async=False,
            )
        except BaseException as exc:  # handed to the test thread
            self.error = exc

    def release(self) -> None:
        self.log.release("hold")

    def streamed(self) -> list[ProgressEvent]:
        self._thread.join(TIMEOUT)
        assert not self._thread.is_alive(), "the run did not end"
        assert self.error is None, self.error
        return progress_events(self.chunks)


def steps(events: list[ProgressEvent]) -> list[tuple[ProgressKind, str | None, str | None]]:
    return [
        (
            e.event,
            e.effect.tool_call_id if e.effect else None,
            e.effect.status.value if e.effect else None,
        )
        for e in events
    ]


EXPECTED = [
    (ProgressKind.REQUESTED, None, None),
    (ProgressKind.OBSERVED, None, None),
    (ProgressKind.WAITING, "f2", "dispatched"),
    (ProgressKind.SETTLED, "f2", "committed"),
    (ProgressKind.DROPPED, "f1", "dropped"),
    (ProgressKind.DROPPED, "f3", "dropped"),
    (ProgressKind.CANCELLED, None, None),
]


def test_cancel_follow_reads_what_the_run_streams(
    saver: Any, log: ExecutionLog, db_url: str, tmp_path: Path
) -> None:
    worker = Worker(saver, log)
    followed: list[ProgressEvent] = []
    if db_url.startswith("memory"):
        # An in-process ledger: the follower is another thread on the same ledger.
        run = saver.ledger.request_cancel(worker.thread_id, reason="stop", requested_by="ops")
        assert run.run_id is not None

        def watch() -> None:
            for event in follow(saver.ledger, run.run_id, interval=0.02, timeout=TIMEOUT):
                followed.append(event)
                if event.event is ProgressKind.WAITING:
                    worker.release()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        watcher.join(TIMEOUT)
        assert not watcher.is_alive()
        stderr = ""
    else:
        # Another process: the command line, one JSON event per line as it happens.
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _PROBE,
                "cancel",
                worker.thread_id,
                "--db",
                db_url,
                "--reason",
                "stop",
                "--by",
                "ops",
                "--follow",
                "--json",
                "--timeout",
                str(TIMEOUT),
            ],
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            assert proc.stdout is not None
            for text in proc.stdout:
                lines.put(text)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        try:
            while (text := lines.get(timeout=TIMEOUT)) is not None:
                event = ProgressEvent.model_validate(json.loads(text))
                followed.append(event)
                if event.event is ProgressKind.WAITING:
                    # The follower saw the call in flight: now let the provider answer.
                    worker.release()
            assert proc.wait(TIMEOUT) == 0
        finally:
            worker.release()
            if proc.poll() is None:
                proc.kill()
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert "HEAVY=\n" in stderr, stderr  # the follower imported no LangGraph
    streamed = worker.streamed()

    assert steps(streamed) == EXPECTED
    assert steps(followed) == EXPECTED, (followed, stderr)
    assert followed[0].reason == "stop" and followed[0].requested_by == "ops"
    assert followed[1].observed_at == streamed[1].observed_at
    waiting = followed[2].effect
    assert waiting is not None and waiting.dispatched_at == streamed[2].effect.dispatched_at  # type: ignore[union-attr]
    assert followed[-1].report == streamed[-1].report
    report = CancellationReport.model_validate(followed[-1].report)
    assert report.permanent == []
    assert [e.tool_call_id for e in report.reversible_committed] == ["f2"]
    assert sorted(e.tool_call_id for e in report.not_run) == ["f1", "f3"]
    assert log.attempts("refund") == 0 and log.attempts("email") == 0
    assert log.applied("hold") == 1
    record = saver.ledger.find_effect(worker.thread_id, "f2")
    assert record is not None and record.status is EffectStatus.COMMITTED


def test_cancel_follow_prints_the_steps_then_the_report(
    durable: tuple[str, Any], log: ExecutionLog, tmp_path: Path
) -> None:
    db_url, saver = durable
    worker = Worker(saver, log)

    def release_once_observed() -> None:
        wait_until(
            lambda: saver.ledger.latest_run(worker.thread_id).observed_at is not None,
            timeout=TIMEOUT,
            what="the stop observed",
        )
        worker.release()

    releaser = threading.Thread(target=release_once_observed, daemon=True)
    releaser.start()
    try:
        proc = run_main(
            ["cancel", worker.thread_id, "--db", db_url, "--reason", "stop", "--follow"],
            tmp_path,
        )
    finally:
        worker.release()
    worker.streamed()
    text = flat(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    for expected in (
        "stop requested by",
        "stop observed: the run is cancelling",
        "waiting for hold(item=o-1)",
        "hold(item=o-1) committed (settled)",
        "refund(item=o-1) dropped (never ran)",
        "email(item=a) dropped (never ran)",
        "run cancelled: the report follows",
        "Cancellation report: thread",
        "Reversible, committed (1)",
        "Not run (2)",
    ):
        assert expected in text, text
    assert text.index("waiting for") < text.index("(settled)") < text.index("Cancellation report")


def test_cancel_follow_gives_up_after_its_timeout(durable: tuple[str, Any], tmp_path: Path) -> None:
    db_url, saver = durable
    thread_id = new_thread()
    saver.ledger.start_run(thread_id)  # a run whose worker is gone: nobody finishes the stop
    proc = run_main(["cancel", thread_id, "--db", db_url, "--follow", "--timeout", "0.3"], tmp_path)
    assert proc.returncode == 1
    assert "did not end within 0.3s" in flat(proc.stderr), proc.stderr
    assert "No worker is running this thread" in flat(proc.stdout)
    run = saver.ledger.latest_run(thread_id)
    assert run is not None and run.cancel_requested  # the request itself stands


def test_follow_needs_follow_for_timeout_and_is_a_no_op_on_a_finished_run(
    durable: tuple[str, Any], log: ExecutionLog, tmp_path: Path
) -> None:
    db_url, saver = durable
    bad = run_main(["cancel", "t", "--db", db_url, "--timeout", "3"], tmp_path)
    assert bad.returncode == 1 and "--timeout goes with --follow" in bad.stderr
    thread_id = new_thread()
    graph = cancellable(
        agent_builder(scripted("done"), EffectToolNode([counting_tool(log, "w", "irreversible")])),
        saver,
    )
    graph.invoke({"messages": [HumanMessage("hi")]}, config_for(thread_id))
    done = run_main(["cancel", thread_id, "--db", db_url, "--follow", "--json"], tmp_path)
    assert done.returncode == 0
    answer = json.loads(done.stdout)
    assert answer["accepted"] is False and answer["status"] == "completed"


def test_following_a_parent_shows_its_sub_agents_calls(saver: Any, log: ExecutionLog) -> None:
    """A stop pressed at the parent reaches its sub-agent: the follower sees the child's calls.

    The sub-agent (``child_config``) refunds on its own thread; stop is pressed at the
    parent while that refund is in flight. Following the parent's run shows the stop
    waiting for the child's refund, its outcome, the child's queued call dropped, and
    ends with the parent's report, which lists the child's refund as permanent.
    """
    parent_thread = new_thread()
    child_thread = f"{parent_thread}-refunds"
    child_tools = [
        counting_tool(log, "child_refund", EffectKind.IRREVERSIBLE),
        counting_tool(log, "child_notify", EffectKind.IRREVERSIBLE),
    ]
    child_model = scripted(calls(("child_refund", "o-88", "k1"), ("child_notify", "dana", "k2")))
    child = cancellable(agent_builder(child_model, EffectToolNode(child_tools)), saver)

    def delegate(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        out = child.invoke(
            {"messages": [HumanMessage("refund o-88")]}, child_config(config, child_thread)
        )
        return {"messages": [AIMessage(f"sub-agent: {out['messages'][-1].text}")]}

    def wrap_up(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("wrapped up")]}

    builder = StateGraph(MessagesState)
    builder.add_node("delegate", delegate)
    builder.add_node("wrap_up", wrap_up)
    builder.add_edge(START, "delegate")
    builder.add_edge("delegate", "wrap_up")
    builder.add_edge("wrap_up", END)
    parent = add_cancellation(builder).compile(checkpointer=saver)
    log.arm("child_refund")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            parent.invoke({"messages": [HumanMessage("go")]}, config_for(parent_thread))
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()

    # The tool itself, not the ``dispatched`` record: the intent is written while the
    # sub-agent's model step is still being saved, and the call leaves only after it.
    wait_until(
        lambda: log.started("child_refund"),
        timeout=TIMEOUT,
        what="the sub-agent's refund in flight",
    )
    answer = request_cancel(saver, parent_thread, reason="wrong order", requested_by="dana")
    assert answer.accepted and answer.run_id is not None
    run_id = answer.run_id
    followed: list[ProgressEvent] = []
    follower = threading.Thread(
        target=lambda: followed.extend(follow(saver.ledger, run_id, timeout=TIMEOUT)),
        daemon=True,
    )
    follower.start()

    def child_observed() -> bool:
        found = saver.ledger.latest_run(child_thread)
        return found is not None and found.observed_at is not None

    wait_until(child_observed, timeout=TIMEOUT, what="the sub-agent to observe the stop")
    log.release("child_refund")
    follower.join(TIMEOUT)
    worker.join(TIMEOUT)
    assert not follower.is_alive() and not worker.is_alive() and not errors, errors

    child_run = saver.ledger.latest_run(child_thread)
    assert child_run is not None and child_run.parent_run_id == run_id
    assert child_run.status.value == "cancelled"
    # Each step once; the parent's request first, its report last.
    assert len(
        {(e.event, e.run_id, e.effect.effect_id if e.effect else None) for e in followed}
    ) == len(followed)
    assert followed[0].event is ProgressKind.REQUESTED and followed[0].run_id == run_id
    assert followed[-1].event is ProgressKind.CANCELLED and followed[-1].run_id == run_id
    # The sub-agent's calls, in the order the stop handled them, each marked with its run.
    of_child = [e for e in followed if e.effect is not None]
    assert steps(of_child) == [
        (ProgressKind.WAITING, "k1", "dispatched"),
        (ProgressKind.SETTLED, "k1", "committed"),
        (ProgressKind.DROPPED, "k2", "dropped"),
    ]
    assert {(e.run_id, e.thread_id) for e in of_child} == {(child_run.run_id, child_thread)}
    assert [e.at for e in followed] == sorted(e.at for e in followed)
    report = CancellationReport.model_validate(followed[-1].report)
    (refund,) = report.permanent
    assert (refund.tool_call_id, refund.child_run_id) == ("k1", child_run.run_id)
    assert [e.tool_call_id for e in report.not_run] == ["k2"]
    assert log.applied("child_refund") == 1 and log.attempts("child_notify") == 0

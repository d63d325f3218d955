"""End to end through a real LangGraph API server (``langgraph dev``), as Studio drives it.

One ``langgraph dev`` per ledger backend serves the repository's
``langgraph.json`` (the refund-agent example, as Studio sees it) for the whole
module. The tests drive it with the ``langgraph_sdk`` async client and check
the truth in two places the server cannot fake: the ledger (opened from this
process with ``Ledger.from_url``) and the fake providers' own SQLite file
(reset before each test).

1. Approval: "refund 120 USD" stops on our approval interrupt; resuming with
   ``{"decisions": [{"type": "approve"}]}`` dispatches the refund exactly once,
   and the ledger holds it committed with the reviewer.
2. ``runs.cancel`` (the server's stop button) while the approved refund is in
   flight: the effect ends ``committed`` (provider agrees) or ``unknown`` with an
   owner and a next action, never ``dispatched`` or lost; continuing the thread
   then finishes the cancel (report, nothing dispatched again).
3. Our durable cancel (``request_cancel`` from this process) during the seed
   run, while ``update_order`` hangs: the run finishes through the cancel node
   and the thread state holds the ``cancellation_report`` (status ``cancelled``,
   what is permanent, what did not run), which the providers' truth confirms.

The servers run without ``--allow-blocking``: the library's async nodes do their
ledger I/O in worker threads, and ``test_served_graph_without_allow_blocking``
runs the example under the dev server's own blocking-call detector. A last test
stops a run with ``runs.cancel`` and types again, as a Studio user would: the
interrupted calls are answered before the new message (chat APIs reject any
other order) and nothing is dispatched twice.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig

from langgraph_cancel import EffectStatus, Ledger, get_report, request_cancel
from langgraph_cancel.demo.tools import refund_key
from langgraph_cancel.types import RunStatus
from served_helpers import (
    REVIEWER,
    SERVED_BACKENDS,
    Served,
    approve,
    client_fixture,  # noqa: F401 (a fixture, found by name)
    dispatch_count,
    human,
    in_flight,
    interrupted_on_refund,
    no_dangling_calls,
    refund_request,
    reset_providers,
    serving,
    settled_from_flight,
    stopped_durably,
    stopped_in_studio_mid_refund,
    thread_id_fixture,  # noqa: F401 (a fixture, found by name)
    tool_answers_follow_their_calls,
    update_order_in_flight,
    wait_for,
)
from server_util import REPO_ROOT

pytestmark = pytest.mark.timeout(110)

REPO_CONFIG = REPO_ROOT / "langgraph.json"
EXAMPLE_GRAPH_FILE = "langgraph_cancel.demo.graph"
#: The library's async nodes do blocking ledger I/O on the event loop (see module doc).
ALLOW_BLOCKING = False


def example_graph_id() -> str:
    """The id under which the repository's ``langgraph.json`` serves the refund agent."""
    if not REPO_CONFIG.exists():
        pytest.fail(f"{REPO_CONFIG} is missing: the example graph must be served to Studio")
    graphs = json.loads(REPO_CONFIG.read_text()).get("graphs", {})
    for graph_id, spec in graphs.items():
        path = spec if isinstance(spec, str) else spec.get("path", "")
        if EXAMPLE_GRAPH_FILE in path:
            return str(graph_id)
    pytest.fail(f"{REPO_CONFIG} serves no {EXAMPLE_GRAPH_FILE} graph: {graphs}")


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module", params=SERVED_BACKENDS)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """``langgraph dev`` serving the repository's ``langgraph.json``, ledger on one backend."""
    config, graph_id = REPO_CONFIG, example_graph_id()
    with serving(
        request, tmp_path_factory, config, graph_id, allow_blocking=ALLOW_BLOCKING
    ) as running:
        yield running


# --------------------------------------------------------------------- tests
def test_served_copy_keeps_cancellation_settings() -> None:
    """The server runs ``graph.copy(update={"checkpointer": ..., "store": ...})``."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    from langgraph_cancel import CancellableGraph, add_cancellation

    builder = StateGraph(MessagesState)
    builder.add_node("noop", lambda state: None)
    builder.add_edge(START, "noop")
    graph = add_cancellation(builder, ledger="memory://").compile()
    copied = graph.copy(update={"checkpointer": InMemorySaver()})
    assert isinstance(copied, CancellableGraph)
    assert copied.cancellation is graph.cancellation
    assert graph.with_config(tags=["x"]).cancellation is graph.cancellation


@pytest.mark.server
async def test_approval_interrupt_then_resume_dispatches_once(
    served: Served, client: Any, thread_id: str
) -> None:
    key = await interrupted_on_refund(served, client, thread_id, 120.0)

    result = await client.runs.wait(thread_id, served.graph_id, command=approve())

    providers = served.providers
    assert providers.executions(key) == 1
    assert providers.attempts(key) == 1
    assert providers.find_refund(key) is not None
    rec = served.ledger.effect_by_key(key)
    assert rec is not None and rec.status is EffectStatus.COMMITTED, rec
    assert dispatch_count(served.ledger, rec) == 1
    assert rec.approval is not None, rec
    assert rec.approval.get("reviewer") == REVIEWER, rec.approval
    assert rec.approval.get("decision", rec.approval.get("type")) == "approve", rec.approval
    # The run went on to the end of the script; every effect happened once.
    for effect in served.ledger.effects(thread_id):
        if effect.kind.value != "read_only":
            assert effect.status is EffectStatus.COMMITTED, effect
            assert providers.executions(effect.idempotency_key) == 1, effect
    final = result["messages"][-1]
    assert final["type"] == "ai" and final["content"].startswith("Done: refunded 120.00"), final
    no_dangling_calls(result["messages"])
    assert "cancellation_report" not in result or result["cancellation_report"] is None
    assert (await client.threads.get(thread_id))["status"] == "idle"
    runs = served.ledger.runs(thread_id)
    assert [r.status for r in runs] == [RunStatus.COMPLETED], runs  # one run, paused and resumed


@pytest.mark.server
async def test_a_reviewer_edits_the_refunds_amount(
    served: Served, client: Any, thread_id: str
) -> None:
    """Studio's reviewer lowers the refund: the lower amount is what runs, once, and
    the report and the providers' truth agree on it."""
    asked = await interrupted_on_refund(served, client, thread_id, 120.0)
    edited_args = {"order_id": "o-88", "amount": 80.0}
    edit = {"type": "edit", "edited_action": {"name": "issue_refund", "args": edited_args}}
    result = await client.runs.wait(
        thread_id,
        served.graph_id,
        command={"resume": {"decisions": [edit], "reviewer": REVIEWER}},
    )

    ran = refund_key(edited_args)
    providers = served.providers
    assert providers.attempts(asked) == 0  # the amount asked for never left the process
    assert providers.executions(ran) == 1
    refunds = providers.truth()["refunds"]
    assert [r["amount"] for r in refunds if r["order_id"] == "o-88"] == [80.0]
    rec = served.ledger.effect_by_key(ran)
    assert rec is not None and rec.status is EffectStatus.COMMITTED, rec
    assert rec.args == edited_args
    report = get_report(served.ledger, thread_id)
    refunded = [e for e in report.permanent if e.tool == "issue_refund"]
    assert (ran, edited_args) in [(e.idempotency_key, e.args) for e in refunded]
    assert asked not in [e.idempotency_key for e in refunded]
    assert [e.idempotency_key for e in report.rejected] == [asked]
    no_dangling_calls(result["messages"])
    assert (await client.threads.get(thread_id))["status"] == "idle"


@pytest.mark.server
async def test_a_reviewer_answers_in_the_tools_place(
    served: Served, client: Any, thread_id: str
) -> None:
    """Studio's reviewer answers with ``respond``: no refund, the text is the tool's
    answer, the run goes on, and the report lists the call as rejected."""
    asked = await interrupted_on_refund(served, client, thread_id, 120.0)
    answer = {"type": "respond", "message": "Refunded by phone already."}
    result = await client.runs.wait(
        thread_id,
        served.graph_id,
        command={"resume": {"decisions": [answer], "reviewer": REVIEWER}},
    )

    assert served.providers.attempts(asked) == 0
    refunds = served.providers.truth()["refunds"]
    assert [r for r in refunds if r["order_id"] == "o-88"] == []
    refund_answers = [
        m for m in result["messages"] if m["type"] == "tool" and m.get("name") == "issue_refund"
    ]
    assert [m["content"] for m in refund_answers].count("Refunded by phone already.") == 1
    rec = served.ledger.effect_by_key(asked)
    assert rec is not None and rec.status is EffectStatus.REJECTED, rec
    report = get_report(served.ledger, thread_id)
    assert [e.idempotency_key for e in report.rejected] == [asked]
    assert asked not in [e.idempotency_key for e in report.permanent]
    no_dangling_calls(result["messages"])
    assert (await client.threads.get(thread_id))["status"] == "idle"


@pytest.mark.server
async def test_runs_cancel_while_approved_refund_in_flight(
    served: Served, client: Any, thread_id: str
) -> None:
    key = await interrupted_on_refund(served, client, thread_id, 150.0)

    served.providers.set_fault("refund", "hang:3", times=1)
    run = await client.runs.create(thread_id, served.graph_id, command=approve())
    await wait_for("the approved refund to be in flight", lambda: in_flight(served, key))
    await asyncio.sleep(1.0)  # ~1 s into the 3 s call
    t0 = time.monotonic()
    await client.runs.cancel(thread_id, run["run_id"], action="interrupt", wait=True)
    cancel_took = time.monotonic() - t0

    rec = await wait_for(
        "the in-flight refund to settle", lambda: settled_from_flight(served.ledger, key)
    )
    print(
        f"[{served.backend}] runs.cancel took {cancel_took:.2f}s; refund ended {rec.status.value}"
    )
    assert rec.status in (EffectStatus.COMMITTED, EffectStatus.UNKNOWN), rec
    if rec.status is EffectStatus.UNKNOWN:
        assert rec.owner and rec.next_action, rec
    else:
        assert served.providers.executions(key) == 1
        assert served.providers.find_refund(key) is not None
    assert dispatch_count(served.ledger, rec) == 1
    assert served.providers.attempts(key) == 1
    assert (await client.runs.get(thread_id, run["run_id"]))["status"] == "interrupted"
    ledger_run = served.ledger.latest_run(thread_id)
    assert ledger_run is not None and ledger_run.cancel_requested, ledger_run
    # The emails queued behind the refund never left.
    emails = [e for e in served.ledger.effects(thread_id) if e.tool == "send_email"]
    assert all(served.providers.attempts(e.idempotency_key) == 0 for e in emails), emails

    # Continuing the stopped thread finishes the cancel instead of running the tools again.
    values = await client.runs.wait(thread_id, served.graph_id)
    report = values.get("cancellation_report")
    assert report is not None and report["status"] == "cancelled", values
    assert report["dispatched_after_cancel"] == 0
    settled_as = "permanent" if rec.status is EffectStatus.COMMITTED else "unknown"
    assert [e["idempotency_key"] for e in report[settled_as]] == [key]
    assert sorted(e["tool"] for e in report["not_run"]) == ["send_email", "send_email"]
    assert served.providers.attempts(key) == 1
    assert served.providers.truth()["emails"] == []
    no_dangling_calls(values["messages"])


@pytest.mark.server
async def test_runs_cancel_wait_returns_with_the_report_in_the_thread_state(
    served: Served, client: Any, thread_id: str
) -> None:
    """Studio's stop: when ``runs.cancel(..., wait=True)`` returns, the thread state holds
    the cancellation report (the cancel finished inside the run's task), or says the
    stop is ``cancelling`` and which call it waits for."""
    from langgraph_cancel.demo.graph import SEED_REQUEST

    served.providers.set_fault("update_order", "hang:1", times=1)
    run = await client.runs.create(thread_id, served.graph_id, input=human(SEED_REQUEST))
    in_flight = await wait_for(
        "update_order(o-88) to be in flight",
        lambda: update_order_in_flight(served, thread_id),
    )
    t0 = time.monotonic()
    await client.runs.cancel(thread_id, run["run_id"], action="interrupt", wait=True)
    cancel_took = time.monotonic() - t0
    state = await client.threads.get_state(thread_id)
    report = state["values"].get("cancellation_report")
    print(
        f"[{served.backend}] runs.cancel(wait=True) took {cancel_took:.2f}s; "
        f"report then: {report and report['status']}"
    )
    assert report is not None, (state["next"], sorted(state["values"]))
    if report["status"] == "cancelling":
        # Past the grace of the server's wait: the stop is under way, waiting for the call.
        assert report["awaiting"] == [in_flight.effect_id], report
        assert [e["effect_id"] for e in report["unknown"]] == [in_flight.effect_id], report

        async def final_report() -> dict[str, Any] | None:
            values = (await client.threads.get_state(thread_id))["values"]
            found = values.get("cancellation_report")
            return found if found and found["status"] != "cancelling" else None

        deadline = time.monotonic() + 20
        while (final := await final_report()) is None:
            assert time.monotonic() < deadline, "the final report never replaced the interim one"
            await asyncio.sleep(0.05)
        report = final
        state = await client.threads.get_state(thread_id)
    assert report["status"] == "cancelled", report
    assert report["awaiting"] == []
    assert state["next"] == [], state["next"]
    assert report["reason"].startswith("run task cancelled"), report
    assert report["dispatched_after_cancel"] == 0
    assert [e["tool"] for e in report["reversible_committed"]] == ["update_order"], report
    no_dangling_calls(state["values"]["messages"])
    ledger_run = served.ledger.latest_run(thread_id)
    assert ledger_run is not None and ledger_run.status is RunStatus.CANCELLED


@pytest.mark.server
async def test_durable_cancel_of_seed_run_reports_in_thread_state(
    served: Served, client: Any, thread_id: str
) -> None:
    """The seed scenario, stop pressed (``request_cancel``) while ``update_order`` hangs."""
    from langgraph_cancel.demo.graph import QUEUED_CALLS, SEED_REQUEST

    served.providers.set_fault("update_order", "hang:2", times=1)
    run = await client.runs.create(thread_id, served.graph_id, input=human(SEED_REQUEST))
    in_flight = await wait_for(
        "update_order(o-88) to be in flight",
        lambda: update_order_in_flight(served, thread_id),
    )
    assert in_flight.args["order_id"] == "o-88"
    state = await stopped_durably(served, client, thread_id, run["run_id"])
    report = state["values"]["cancellation_report"]
    assert report["status"] == "cancelled"
    assert report["reason"] == "stop pressed"
    assert report["requested_by"] == "studio"
    assert report["dispatched_after_cancel"] == 0
    assert sorted(e["tool"] for e in report["permanent"]) == [
        "issue_refund",
        "send_email",
        "send_email",
    ]
    assert [(e["tool"], e["args"]["order_id"]) for e in report["reversible_committed"]] == [
        ("update_order", "o-88")
    ]
    assert sorted(e["tool"] for e in report["not_run"]) == sorted(QUEUED_CALLS)
    assert report["unknown"] == []
    ledger_run = served.ledger.latest_run(thread_id)
    assert ledger_run is not None and ledger_run.status is RunStatus.CANCELLED
    # Invariant I6: the report's permanent effects are what the providers did.
    providers = served.providers
    for entry in report["permanent"] + report["reversible_committed"]:
        assert providers.executions(entry["idempotency_key"]) == 1, entry
    for entry in report["not_run"]:
        assert providers.attempts(entry["idempotency_key"]) == 0, entry
    truth = providers.truth()
    assert [r["amount"] for r in truth["refunds"]] == [40.0]
    assert len(truth["emails"]) == 2
    assert truth["orders"]["o-88"]["status"] == "refunded"
    assert truth["orders"]["o-91"]["status"] == "delivered"
    assert truth["tickets"] == []
    no_dangling_calls(state["values"]["messages"])


@pytest.mark.server
async def test_a_stop_streams_its_progress_to_the_client(
    served: Served, client: Any, thread_id: str
) -> None:
    """A client streaming ``custom`` sees each step of the stop, in order, then the report."""
    from langgraph_cancel.demo.graph import QUEUED_CALLS, SEED_REQUEST
    from langgraph_cancel.progress import EVENT_KEY, ProgressEvent
    from langgraph_cancel.report import CancellationReport

    async def consume() -> list[ProgressEvent]:
        seen: list[ProgressEvent] = []
        async for part in client.runs.stream(
            thread_id, served.graph_id, input=human(SEED_REQUEST), stream_mode="custom"
        ):
            data = part.data
            if part.event.startswith("custom") and isinstance(data, dict) and EVENT_KEY in data:
                seen.append(ProgressEvent.model_validate(data[EVENT_KEY]))
        return seen

    served.providers.set_fault("update_order", "hang:2", times=1)
    streaming = asyncio.ensure_future(consume())
    in_flight = await wait_for(
        "update_order(o-88) to be in flight",
        lambda: update_order_in_flight(served, thread_id),
    )
    await asyncio.to_thread(
        request_cancel, served.ledger_url, thread_id, reason="stop pressed", requested_by="studio"
    )
    progress = await asyncio.wait_for(streaming, timeout=30)

    kinds = [p.event.value for p in progress]
    assert kinds == [
        "requested",
        "observed",
        "waiting",
        "settled",
        *["dropped"] * len(QUEUED_CALLS),
        "cancelled",
    ], kinds
    assert progress[0].requested_by == "studio" and progress[0].reason == "stop pressed"
    waiting, settled = progress[2], progress[3]
    assert waiting.effect is not None and waiting.effect.effect_id == in_flight.effect_id
    assert waiting.effect.dispatched_at == in_flight.dispatched_at
    assert settled.effect is not None and settled.effect.status is EffectStatus.COMMITTED
    assert sorted(p.effect.tool for p in progress[4:-1] if p.effect) == sorted(QUEUED_CALLS)
    # The last event alone is enough to render the outcome, and it is the thread's report.
    streamed = progress[-1].report
    assert streamed is not None
    report = CancellationReport.model_validate(streamed)
    state = await client.threads.get_state(thread_id)
    assert CancellationReport.model_validate(state["values"]["cancellation_report"]) == report
    assert sorted(e.tool_call_id for e in report.not_run) == sorted(
        p.effect.tool_call_id for p in progress[4:-1] if p.effect
    )
    from langgraph_cancel.cli import render

    out = render.console(stderr=False)
    with out.capture() as captured:
        render.render_report(out, report)
    assert "update_order" in captured.get() and "Not run" in captured.get()


@pytest.mark.server
async def test_new_input_after_runs_cancel_keeps_tool_answers_in_order(
    served: Served, client: Any, thread_id: str
) -> None:
    """Stop (``runs.cancel``) mid-batch, then type again, as a Studio user would."""
    rec = await stopped_in_studio_mid_refund(served, client, thread_id)  # under 100: no approval
    key = rec.idempotency_key

    values = await client.runs.wait(
        thread_id, served.graph_id, input=human("Thanks. Did that go through?")
    )

    assert served.providers.attempts(key) == 1
    messages = values["messages"]
    no_dangling_calls(messages)
    # Chat APIs reject ai(tool_calls) -> human -> tool: the answers come first.
    tool_answers_follow_their_calls(messages)
    answer = next(m for m in messages if m.get("tool_call_id") == rec.tool_call_id)
    if rec.status is EffectStatus.COMMITTED:
        assert json.loads(answer["content"])["amount"] == 45.0, answer
    cancelled = served.ledger.runs(thread_id)[0]
    assert cancelled.status is RunStatus.CANCELLED, cancelled


@pytest.mark.server
@pytest.mark.parametrize("ledger", ["sqlite", "memory"])
def test_served_graph_without_allow_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ledger: str
) -> None:
    """The dev server's own blocking-call detector, in-process, around one approval run.

    ``langgraph dev`` without ``--allow-blocking`` runs every graph under
    ``langgraph_runtime_inmem.queue._enable_blockbuster()``; this applies exactly
    that to the example graph (compiled as ``langgraph.json`` serves it, copied
    with an in-memory saver as the server does) and drives it through the
    approval interrupt to the end: with the ledger in a SQLite file
    (``LANGGRAPH_CANCEL_DB``), and in memory beside the server's saver, whose
    statements are blocking calls on the loop too.
    """
    queue = pytest.importorskip("langgraph_runtime_inmem.queue")
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    from langgraph_cancel.demo.graph import build_builder, scripted_model

    if ledger == "sqlite":
        ledger_url = "sqlite:///" + str(tmp_path / "ledger.db")
        monkeypatch.setenv("LANGGRAPH_CANCEL_DB", ledger_url)
        Ledger.from_url(ledger_url).close()
    else:
        monkeypatch.delenv("LANGGRAPH_CANCEL_DB", raising=False)
    monkeypatch.setenv("REFUND_AGENT_PROVIDERS_DB", str(tmp_path / "providers.db"))
    reset_providers(tmp_path / "providers.db")
    # The served graph as `langgraph dev` runs it, with the no-key model whatever the env.
    served_graph = build_builder(scripted_model()).compile(name="refund_agent")
    graph = served_graph.copy(update={"checkpointer": InMemorySaver()})
    config: RunnableConfig = {"configurable": {"thread_id": str(uuid.uuid4())}}

    async def scenario() -> dict[str, Any]:
        await graph.ainvoke(human(refund_request(130)), config)
        return dict(await graph.ainvoke(Command(resume=approve()["resume"]), config))

    detector = queue._enable_blockbuster()
    try:
        values = asyncio.run(scenario())
    except Exception as exc:
        if type(exc).__name__ != "BlockingError":
            pytest.fail(f"the run failed for another reason than blocking I/O: {exc!r}")
        raise
    finally:
        detector.deactivate()
    assert values["messages"][-1].content.startswith("Done: refunded 130.00")

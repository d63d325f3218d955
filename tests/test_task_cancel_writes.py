"""A run's task cancelled while a ledger write is under way: the write is seen through.

A server's ``runs.cancel`` (or a client's disconnect) cancels the run's asyncio task
wherever it is. When a ledger write is on its way to the database at that moment, a
write cut short may still commit after the task gave up on it (a sync ledger called in
a thread), or be cancelled on the server (psycopg's async connection): either way the
run would not know what the ledger holds. So the write is seen through before the
cancellation goes on:

* a call's intent (``dispatched``): the call does not go, and is recorded never sent
  (``not_applied``); the stop neither waits for it nor leaves its outcome unknown;
* a call's outcome: it is recorded, and the stop reports the call as what it was.

The first tests stop a ``create_agent`` agent, whose calls each write their intent
alone; the next an ``EffectToolNode`` batch, whose later intents go with the previous
call's outcome (one call at a time) or in a write shared with the calls in flight beside
them (``effect_concurrency``); the last ones stop a run while an outcome is written.

The database is made to hold a write where the test can see it: a trigger on the
ledger's effects table waits, on an update to the status the test names, for an
advisory lock the test holds. Both ways the async ledger reaches PostgreSQL are covered:
the async saver's own ledger on the graph's loop, and a sync ledger the driver calls in
a thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool

from graphs import agent_builder, cancellable, scripted
from langgraph_cancel import EffectKind, EffectStatus, EffectToolNode, aget_report, effect
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.checkpointers.postgres import AsyncPostgresCancelSaver
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.middleware import EffectMiddleware
from langgraph_cancel.testing import ScriptedChatModel, tool_call

pytestmark = pytest.mark.postgres

#: The advisory lock an update to a held status waits for while the test holds it.
GATE_KEY = 4_242_017
GATE_TABLE = "CREATE TABLE lgc_test_gate (status TEXT PRIMARY KEY)"
GATE_FUNCTION = f"""CREATE OR REPLACE FUNCTION lgc_test_gate() RETURNS trigger AS $$
    BEGIN
        IF NEW.status IN (SELECT status FROM lgc_test_gate) THEN
            PERFORM pg_advisory_lock({GATE_KEY});
            PERFORM pg_advisory_unlock({GATE_KEY});
        END IF;
        RETURN NEW;
    END $$ LANGUAGE plpgsql"""
GATE_TRIGGER = """CREATE TRIGGER lgc_test_gate BEFORE UPDATE ON lgc_effects
    FOR EACH ROW EXECUTE FUNCTION lgc_test_gate()"""
WAITING_AT_GATE = f"""SELECT count(*) FROM pg_locks
    WHERE locktype = 'advisory' AND objid = {GATE_KEY} AND NOT granted"""
#: Short, so that a stop that waited for the unsent call would show it in the ledger
#: (``unknown``) without slowing the suite down much.
CANCEL_TIMEOUT = 2.0


@pytest.fixture(params=["async-ledger", "threaded-ledger"])
async def saver(request: pytest.FixtureRequest, pg_url: str) -> AsyncIterator[Any]:
    """A checkpointer whose ledger the async driver awaits natively, or in a thread."""
    if request.param == "async-ledger":
        async with AsyncPostgresCancelSaver.from_conn_string(pg_url) as native:
            await native.setup()
            yield native
        return
    ledger = Ledger.from_url(pg_url)
    try:
        threaded = MemoryCancelSaver(ledger=ledger)
        threaded.setup()
        yield threaded
    finally:
        ledger.close()


class Gate:
    """Holds updates of ``lgc_effects`` to the statuses it is told, until ``open``."""

    def __init__(self, holder: psycopg.Connection[Any]) -> None:
        self.holder = holder

    def hold(self, status: EffectStatus) -> None:
        """Hold every update to ``status`` (the lock is held from the start)."""
        self.holder.execute("INSERT INTO lgc_test_gate (status) VALUES (%s)", (status.value,))

    def open(self) -> None:
        """Let the held write, and every later one, through."""
        self.holder.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))


@pytest.fixture
def gate(pg_url: str) -> Iterator[Gate]:
    """The trigger installed, holding nothing yet, its lock held."""
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(GATE_TABLE)
        admin.execute(GATE_FUNCTION)
        admin.execute(GATE_TRIGGER)
    with psycopg.connect(pg_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))
        yield Gate(holder)


async def _wait_at_gate(pg_url: str, run: asyncio.Future[Any]) -> None:
    """Until a write waits at the gate (fails if the run ends first)."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as watcher:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert not run.done(), "the run ended before its write reached the gate"
            cursor = await watcher.execute(WAITING_AT_GATE)
            row = await cursor.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.02)
    raise AssertionError("no write reached the gate")


async def _cancel_at_the_gate(
    graph: Any, ask: str, config: RunnableConfig, gate: Gate, pg_url: str
) -> None:
    """Run ``graph`` on ``ask`` and cancel its task while a write waits at the gate;
    then open the gate. The run ends cancelled, only once the write has ended."""
    run = asyncio.ensure_future(graph.ainvoke({"messages": [HumanMessage(ask)]}, config))
    await _wait_at_gate(pg_url, run)
    run.cancel()
    await asyncio.sleep(0.2)
    assert not run.done(), "the cancelled run did not wait for its ledger write"
    gate.open()
    with pytest.raises(asyncio.CancelledError):
        await run


def _refund_agent(saver: Any, sent: list[str], *, order_id: str, call_id: str) -> Any:
    """A ``create_agent`` agent whose model asks for one refund; ``sent`` gets each
    order the tool refunds."""

    @effect(EffectKind.IRREVERSIBLE, idempotency_key=lambda a: f"refund:{a['order_id']}")
    @tool
    def issue_refund(order_id: str) -> str:
        """Refund an order."""
        sent.append(order_id)
        return f"refunded {order_id}"

    model = ScriptedChatModel(
        [
            AIMessage(
                "", tool_calls=[tool_call("issue_refund", {"order_id": order_id}, id=call_id)]
            ),
            "how can I help?",
        ],
        on_exhausted="repeat_last",
    )
    return create_agent(
        model,
        [issue_refund],
        middleware=[EffectMiddleware(approval=False, cancel_timeout=CANCEL_TIMEOUT)],
        checkpointer=saver,
    )


async def test_a_task_cancel_during_the_intent_write_records_the_call_never_sent(
    saver: Any, gate: Gate, pg_url: str
) -> None:
    gate.hold(EffectStatus.DISPATCHED)
    sent: list[str] = []
    agent = _refund_agent(saver, sent, order_id="o-7", call_id="c-7")
    config: RunnableConfig = {"configurable": {"thread_id": "gated"}}
    await _cancel_at_the_gate(agent, "refund", config, gate, pg_url)

    (record,) = saver.ledger.effects("gated")
    assert record.status is EffectStatus.NOT_APPLIED
    assert sent == []
    stopped = saver.ledger.latest_run("gated")
    assert stopped is not None

    # The next turn closes the stopped run with the call answered as never run.
    out = await agent.ainvoke({"messages": [HumanMessage("where are we?")]}, config)
    assert sent == []
    (record,) = saver.ledger.effects("gated")
    assert record.status is EffectStatus.DROPPED
    report = await aget_report(saver, "gated", run_id=stopped.run_id)
    assert report.status == "cancelled"
    assert [effect.tool_call_id for effect in report.not_run] == ["c-7"]
    assert report.unknown == [] and report.permanent == []
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in answers] == ["c-7"]
    assert out["messages"][-1].content == "how can I help?"


@pytest.mark.parametrize("effect_concurrency", [1, 2], ids=["one-at-a-time", "two-at-once"])
async def test_a_batch_stopped_during_a_later_intent_sends_nothing_more(
    saver: Any, gate: Gate, pg_url: str, effect_concurrency: int
) -> None:
    gate.hold(EffectStatus.DISPATCHED)
    sent: list[str] = []

    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def wire(item: str) -> str:
        """Wire money."""
        sent.append(item)
        return f"wired {item}"

    # The first calls' intents go with the batch's plan (an insert, not held at the
    # gate); the next one's is an update, held there.
    first = ["w1", "w2"][:effect_concurrency]
    model = scripted(
        AIMessage(
            "",
            tool_calls=[tool_call("wire", {"item": item}, id=item) for item in [*first, "w-next"]],
        ),
        "done",
    )
    node = EffectToolNode(
        [wire], cancel_timeout=CANCEL_TIMEOUT, effect_concurrency=effect_concurrency
    )
    graph = cancellable(agent_builder(model, node, use_async=True), saver)
    thread_id = f"batch-{effect_concurrency}"
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    await _cancel_at_the_gate(graph, "wire", config, gate, pg_url)

    assert sorted(sent) == sorted(first)
    records = {record.tool_call_id: record for record in saver.ledger.effects(thread_id)}
    # The graph's stop ran as the task ended: the call never sent is dropped.
    assert records["w-next"].status is EffectStatus.DROPPED
    assert all(records[item].status is EffectStatus.COMMITTED for item in first)
    stopped = saver.ledger.latest_run(thread_id)
    assert stopped is not None

    await graph.ainvoke({"messages": [HumanMessage("and now?")]}, config)
    assert sorted(sent) == sorted(first)
    report = await aget_report(saver, thread_id, run_id=stopped.run_id)
    assert report.status == "cancelled"
    assert sorted(effect.tool_call_id for effect in report.permanent) == sorted(first)
    assert [effect.tool_call_id for effect in report.not_run] == ["w-next"]
    assert report.unknown == []


async def test_a_task_cancel_during_an_outcome_write_keeps_the_outcome(
    saver: Any, gate: Gate, pg_url: str
) -> None:
    gate.hold(EffectStatus.COMMITTED)
    sent: list[str] = []
    agent = _refund_agent(saver, sent, order_id="o-8", call_id="c-8")
    config: RunnableConfig = {"configurable": {"thread_id": "kept"}}
    await _cancel_at_the_gate(agent, "refund", config, gate, pg_url)

    (record,) = saver.ledger.effects("kept")
    assert record.status is EffectStatus.COMMITTED
    assert sent == ["o-8"]
    stopped = saver.ledger.latest_run("kept")
    assert stopped is not None

    out = await agent.ainvoke({"messages": [HumanMessage("where are we?")]}, config)
    assert sent == ["o-8"]
    report = await aget_report(saver, "kept", run_id=stopped.run_id)
    assert report.status == "cancelled"
    assert [effect.tool_call_id for effect in report.permanent] == ["c-8"]
    assert report.unknown == [] and report.not_run == []
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in answers] == ["c-8"]
    assert "refunded o-8" in str(answers[0].content)


async def test_a_batch_stopped_during_its_last_outcome_write_keeps_it(
    saver: Any, gate: Gate, pg_url: str
) -> None:
    gate.hold(EffectStatus.COMMITTED)
    sent: list[str] = []

    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def wire(item: str) -> str:
        """Wire money."""
        sent.append(item)
        return f"wired {item}"

    model = scripted(AIMessage("", tool_calls=[tool_call("wire", {"item": "w9"}, id="w9")]), "done")
    node = EffectToolNode([wire], cancel_timeout=CANCEL_TIMEOUT)
    graph = cancellable(agent_builder(model, node, use_async=True), saver)
    config: RunnableConfig = {"configurable": {"thread_id": "last-outcome"}}
    await _cancel_at_the_gate(graph, "wire", config, gate, pg_url)

    assert sent == ["w9"]
    (record,) = saver.ledger.effects("last-outcome")
    assert record.status is EffectStatus.COMMITTED
    stopped = saver.ledger.latest_run("last-outcome")
    assert stopped is not None
    await graph.ainvoke({"messages": [HumanMessage("and now?")]}, config)
    assert sent == ["w9"]
    report = await aget_report(saver, "last-outcome", run_id=stopped.run_id)
    assert report.status == "cancelled"
    assert [effect.tool_call_id for effect in report.permanent] == ["w9"]
    assert report.unknown == []

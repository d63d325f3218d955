"""Async graphs on the async savers: a stop mid-batch, and the ledger on the graph's loop.

``AsyncSqliteCancelSaver`` (a real file, aiosqlite) and ``AsyncPostgresCancelSaver``
(the test server, psycopg's async pool) run the refund agent with ``ainvoke``;
the stop is pressed while ``update_order`` is in flight at the provider. The
run's ledger steps go through the saver's ``AsyncLedger`` on the graph's own
loop: the sync ledger's tool-call methods are never called, and every async
ledger call runs on the loop's thread.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

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
)
from langgraph_cancel import (
    CancellationReport,
    EffectStatus,
    EffectToolNode,
    aget_report,
    arequest_cancel,
)
from langgraph_cancel.checkpointers.sqlite import AsyncSqliteCancelSaver
from langgraph_cancel.demo import tools as refund_tools
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.errors import ConfigurationError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import AsyncLedger, async_twin_of
from langgraph_cancel.testing import tool_call
from langgraph_cancel.types import EffectRecord, RunStatus
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    log_fixture,
    providers_path_fixture,
)

TIMEOUT = 60.0
#: The sync ledger's methods behind the tool-call protocol's ledger steps.
PROTOCOL_METHODS = (
    "plan",
    "plan_many",
    "plan_many_and_begin",
    "record_many",
    "find_effect",
    "find_effects",
    "find_moved",
    "effect_by_key",
    "get_effect",
    "transition",
    "transition_many",
    "mark_observed",
)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="AsyncSqliteCancelSaver"),
        pytest.param("postgres", id="AsyncPostgresCancelSaver", marks=pytest.mark.postgres),
    ]
)
async def async_saver(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """An async cancel-aware saver, set up on this test's loop."""
    if request.param == "sqlite":
        async with AsyncSqliteCancelSaver.from_conn_string(str(tmp_path / "agent.db")) as saver:
            await saver.setup()
            yield saver
        return
    from langgraph_cancel.checkpointers.postgres import AsyncPostgresCancelSaver

    url: str = request.getfixturevalue("pg_url")
    async with AsyncPostgresCancelSaver.from_conn_string(url) as pg_saver:
        await pg_saver.setup()
        yield pg_saver


async def wait_for(
    predicate: Callable[[], Awaitable[Any]], what: str, run: asyncio.Task[Any]
) -> Any:
    """Await ``predicate`` until it is truthy; fail at once if the run ends first."""
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while True:
        value = await predicate()
        if value:
            return value
        if run.done():
            raise AssertionError(f"the run ended before {what}: {run.exception()!r}")
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class LedgerSpy:
    """Counts the sync ledger's protocol calls, and the async ledger's calls by thread."""

    def __init__(self, ledger: Ledger, native: AsyncLedger) -> None:
        self.sync_calls: list[str] = []
        self.async_threads: dict[str, set[int]] = {}
        for name in PROTOCOL_METHODS:
            self._spy_sync(ledger, name)
        for name in dir(native):
            if name.startswith("a") and name[1:] in PROTOCOL_METHODS:
                self._spy_async(native, name)

    def _spy_sync(self, ledger: Ledger, name: str) -> None:
        real = getattr(ledger, name)

        def spied(*args: Any, **kwargs: Any) -> Any:
            self.sync_calls.append(name)
            return real(*args, **kwargs)

        setattr(ledger, name, spied)

    def _spy_async(self, native: AsyncLedger, name: str) -> None:
        real = getattr(native, name)

        async def spied(*args: Any, **kwargs: Any) -> Any:
            self.async_threads.setdefault(name, set()).add(threading.get_ident())
            return await real(*args, **kwargs)

        setattr(native, name, spied)


async def test_the_saver_binds_its_async_ledger(async_saver: Any) -> None:
    native = async_saver.async_ledger
    assert isinstance(native, AsyncLedger) and native.url == async_saver.ledger.url
    assert async_twin_of(async_saver.ledger) is native
    # Another loop (another thread) does not get it: its connections belong to this one.
    assert await asyncio.to_thread(lambda: asyncio.run(_twin_elsewhere(async_saver))) is None
    # Both ledgers see one database.
    run = await native.astart_run("t-bound", owner="w1")
    assert await asyncio.to_thread(async_saver.ledger.get_run, run.run_id) == run


async def _twin_elsewhere(saver: Any) -> AsyncLedger | None:
    return async_twin_of(saver.ledger)


async def test_an_in_memory_async_saver_passes_the_dev_servers_blocking_detector(
    log: ExecutionLog,
) -> None:
    """``AsyncSqliteCancelSaver(":memory:")`` under ``langgraph dev``'s detector: the
    ledger's in-memory statements do not run on the loop, where they would block it."""
    queue = pytest.importorskip("langgraph_runtime_inmem.queue")
    async with AsyncSqliteCancelSaver.from_conn_string(":memory:") as saver:
        await saver.setup()
        assert async_twin_of(saver.ledger) is None  # the graph's ledger calls go to threads
        model = scripted(calls(("w1", "a", "s1")), "done")
        tool = counting_tool(log, "w1", "irreversible")
        graph = cancellable(agent_builder(model, EffectToolNode([tool])), saver)
        thread_id = new_thread()
        detector = queue._enable_blockbuster()
        try:
            out = await graph.ainvoke({"messages": [HumanMessage("go")]}, config_for(thread_id))
        finally:
            detector.deactivate()
        assert out["messages"][-1].content == "done"
        record = saver.ledger.find_effect(thread_id, "s1")
        assert record is not None and record.status is EffectStatus.COMMITTED


async def test_async_seed_scenario(async_saver: Any, providers_path: str) -> None:
    """Refund and two emails done; update_order in flight; four calls queued; stop."""
    systems = Providers(providers_path)
    email = {"to": "dana@example.com", "subject": "Refund", "body": "We refunded 40."}
    turn1 = AIMessage(
        "",
        tool_calls=[
            tool_call("issue_refund", {"order_id": "o-88", "amount": 40}, id="s1"),
            tool_call("send_email", email, id="s2"),
            tool_call("send_email", {**email, "subject": "Receipt"}, id="s3"),
        ],
    )
    queued = {
        "s5": tool_call(
            "create_ticket", {"order_id": "o-88", "subject": "Damaged", "body": "Check."}, id="s5"
        ),
        "s6": tool_call("send_email", {**email, "subject": "Order updated"}, id="s6"),
        "s7": tool_call("issue_refund", {"order_id": "o-91", "amount": 10}, id="s7"),
        "s8": tool_call("send_email", {**email, "to": "sam@example.com"}, id="s8"),
    }
    turn2 = AIMessage(
        "",
        tool_calls=[
            tool_call("update_order", {"order_id": "o-88", "status": "refunded"}, id="s4"),
            *queued.values(),
        ],
    )
    model = scripted(turn1, turn2, "Stopped as you asked; here is where things stand.")
    graph = cancellable(agent_builder(model, EffectToolNode(refund_tools.TOOLS)), async_saver)
    native: AsyncLedger = async_saver.async_ledger
    spy = LedgerSpy(async_saver.ledger, native)
    thread_id = new_thread()
    cfg = config_for(thread_id)
    systems.set_fault("update_order", "hang:2", times=1)
    run = asyncio.create_task(graph.ainvoke({"messages": [HumanMessage("refund o-88")]}, cfg))

    async def update_in_flight() -> EffectRecord | None:
        rec = await native.afind_effect(thread_id, "s4")
        return rec if rec is not None and rec.status is EffectStatus.DISPATCHED else None

    update = await wait_for(update_in_flight, "update_order in flight", run)

    async def held() -> bool:
        return await asyncio.to_thread(systems.pending, update.idempotency_key)

    await wait_for(held, "the provider to hold it", run)
    answer = await arequest_cancel(
        async_saver, thread_id, reason="user pressed stop", requested_by="alice"
    )
    assert answer.accepted and answer.first
    assert systems.pending(update.idempotency_key)  # really in flight when stopped
    await asyncio.wait_for(run, TIMEOUT)

    # I1/I2: exactly the refund, two emails and the o-88 update happened in the world.
    truth = systems.truth()
    assert [(r["order_id"], r["amount"]) for r in truth["refunds"]] == [("o-88", 40)]
    assert sorted(e["subject"] for e in truth["emails"]) == ["Receipt", "Refund"]
    assert [u["order_id"] for u in truth["updates"]] == ["o-88"]
    assert truth["tickets"] == [] and truth["messages"] == []
    # I3: nothing queued was dispatched after the stop; the one in flight was awaited.
    for call_id in queued:
        rec = await native.afind_effect(thread_id, call_id)
        assert rec is not None and rec.status is EffectStatus.DROPPED, call_id
        assert rec.dispatched_at is None and systems.attempts(rec.idempotency_key) == 0
    s4 = await native.afind_effect(thread_id, "s4")
    assert s4 is not None and s4.status is EffectStatus.COMMITTED
    # I4: one terminal transition, with the first reason.
    run_rec = await native.alatest_run(thread_id)
    assert run_rec is not None and run_rec.status is RunStatus.CANCELLED
    assert run_rec.reason == "user pressed stop" and run_rec.requested_by == "alice"
    # I5/I6: the report, in the state and from the database, says where each call stands.
    state = await graph.aget_state(cfg)
    report = CancellationReport.model_validate(state.values["cancellation_report"])
    assert report.status == "cancelled"
    assert sorted((e.tool, json.dumps(e.args, sort_keys=True)) for e in report.permanent) == (
        sorted(
            (t, json.dumps(a, sort_keys=True))
            for t, a in [
                ("issue_refund", {"order_id": "o-88", "amount": 40}),
                ("send_email", email),
                ("send_email", {**email, "subject": "Receipt"}),
            ]
        )
    )
    assert report.unknown == [] and report.orphans == 0
    assert [e.tool_call_id for e in report.reversible_committed] == ["s4"]
    assert sorted(e.tool_call_id for e in report.not_run) == sorted(queued)
    assert report.dispatched_after_cancel == 0
    assert await aget_report(async_saver, thread_id) == report
    # I7: every call in the history is answered; the next model call works.
    messages = state.values["messages"]
    assert dangling_calls(messages) == []
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    assert answers["s4"].status == "success"
    assert all(answers[c].status == "error" for c in queued)
    out = await graph.ainvoke({"messages": [HumanMessage("what happened?")]}, cfg)
    assert out["messages"][-1].content == "Stopped as you asked; here is where things stand."
    latest = await native.alatest_run(thread_id)
    assert latest is not None and latest.status is RunStatus.COMPLETED
    # I8: the run's ledger steps went through the async ledger, on the graph's loop.
    assert spy.sync_calls == []
    assert set(spy.async_threads) >= {"aplan_many_and_begin", "atransition"}, spy.async_threads
    assert set().union(*spy.async_threads.values()) == {threading.get_ident()}


async def test_an_async_sqlite_saver_sets_itself_up_on_first_use(
    tmp_path: Path, providers_path: str
) -> None:
    # No setup() call: LangGraph's saver sets itself up on first use, and ours opens
    # and binds its async ledger then.
    systems = Providers(providers_path)
    model = scripted(
        AIMessage("", tool_calls=[tool_call("issue_refund", {"order_id": "o-91", "amount": 5})]),
        "refunded",
    )
    thread_id = new_thread()
    async with AsyncSqliteCancelSaver.from_conn_string(f"sqlite:///{tmp_path}/lazy.db") as saver:
        assert saver.async_ledger is None
        graph = cancellable(agent_builder(model, EffectToolNode(refund_tools.TOOLS)), saver)
        out = await graph.ainvoke(
            {"messages": [HumanMessage("refund o-91")]}, config_for(thread_id)
        )
        assert out["messages"][-1].content == "refunded"
        assert saver.async_ledger is not None and async_twin_of(saver.ledger) is saver.async_ledger
        [refund] = await saver.async_ledger.aeffects(thread_id)
        assert refund.status is EffectStatus.COMMITTED
        assert [(r["order_id"], r["amount"]) for r in systems.truth()["refunds"]] == [("o-91", 5)]
    # Closed with the saver: the binding is gone.
    assert saver.async_ledger is None and async_twin_of(saver.ledger) is None


async def test_an_async_sqlite_saver_on_a_bare_connection_finds_its_file(
    tmp_path: Path, providers_path: str
) -> None:
    """``AsyncSqliteSaver(conn)``, LangGraph's pattern, with ours: the saver asks the
    connection for its file when set up, and a cancellable run sets it up first."""
    systems = Providers(providers_path)
    model = scripted(
        AIMessage("", tool_calls=[tool_call("issue_refund", {"order_id": "o-91", "amount": 7})]),
        "refunded",
    )
    thread_id = new_thread()
    path = tmp_path / "unnamed.db"
    async with aiosqlite.connect(str(path)) as conn:
        saver = AsyncSqliteCancelSaver(conn)
        with pytest.raises(ConfigurationError, match="setup"):
            _ = saver.ledger
        graph = cancellable(agent_builder(model, EffectToolNode(refund_tools.TOOLS)), saver)
        out = await graph.ainvoke(
            {"messages": [HumanMessage("refund o-91")]}, config_for(thread_id)
        )
        assert out["messages"][-1].content == "refunded"
        assert saver.ledger.url == f"sqlite:///{path}"
        [refund] = saver.ledger.effects(thread_id)
        assert refund.status is EffectStatus.COMMITTED
        assert [(r["order_id"], r["amount"]) for r in systems.truth()["refunds"]] == [("o-91", 7)]
        await saver.aclose_ledger()
    # The ledger is in the connection's own file, beside the checkpoints.
    with Ledger.from_url(f"sqlite:///{path}") as again:
        assert [e.status for e in again.effects(thread_id)] == [EffectStatus.COMMITTED]
    async with aiosqlite.connect(":memory:") as conn:
        in_memory = AsyncSqliteCancelSaver(conn)
        await in_memory.setup()
        assert in_memory.path == ":memory:"
        assert in_memory.ledger.url.startswith("memory://")
        await in_memory.aclose_ledger()


RUN_LIFECYCLE = ("start_run", "start_run_and_unsettled", "finish_run", "acquire_lease")


async def test_a_run_starts_and_completes_on_the_loop(async_saver: Any) -> None:
    """An async graph on an async saver opens and closes its run through the saver's
    ``AsyncLedger`` on the loop's own thread: no thread hop per run."""
    from langgraph.graph import START, MessagesState, StateGraph

    from langgraph_cancel import add_cancellation

    sync_ledger: Ledger = async_saver.ledger
    native: AsyncLedger = async_saver.async_ledger
    sync_calls: list[str] = []
    async_threads: dict[str, set[int]] = {}
    for name in RUN_LIFECYCLE:
        real_sync = getattr(sync_ledger, name)

        def spied_sync(*args: Any, _name: str = name, _real: Any = real_sync, **kw: Any) -> Any:
            sync_calls.append(_name)
            return _real(*args, **kw)

        setattr(sync_ledger, name, spied_sync)
        real_async = getattr(native, "a" + name)

        async def spied_async(
            *args: Any, _name: str = name, _real: Any = real_async, **kw: Any
        ) -> Any:
            async_threads.setdefault(_name, set()).add(threading.get_ident())
            return await _real(*args, **kw)

        setattr(native, "a" + name, spied_async)

    async def answer(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage("done")]}

    builder: Any = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    graph = add_cancellation(builder).compile(checkpointer=async_saver)
    thread = new_thread()
    for _ in range(2):
        out = await graph.ainvoke({"messages": [HumanMessage("hi")]}, config_for(thread))
        assert out["messages"][-1].content == "done"

    assert sync_calls == []
    loop_thread = threading.get_ident()
    assert async_threads == {
        "start_run_and_unsettled": {loop_thread},
        "finish_run": {loop_thread},
    }, async_threads
    runs = await native.aruns(thread)
    assert [r.status for r in runs] == [RunStatus.COMPLETED, RunStatus.COMPLETED]
    assert await native.alease(thread) is None  # released with the run's end


_UNCLOSED_SAVER = """
import asyncio, sys
import aiosqlite
from langgraph_cancel.checkpointers.sqlite import AsyncSqliteCancelSaver

async def main(path):
    async with aiosqlite.connect(path) as conn:
        saver = AsyncSqliteCancelSaver(conn) if sys.argv[2] == "bare" else (
            AsyncSqliteCancelSaver(conn, path=path))
        await saver.setup()
        assert saver.async_ledger is not None
    print("set up, never closed")

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("built", ["bare", "path"])
def test_a_process_that_never_closes_the_saver_still_exits(tmp_path: Path, built: str) -> None:
    """LangGraph's ``AsyncSqliteSaver`` needs nothing closed but the caller's connection;
    the ledger's own connection must not keep the process alive either."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _UNCLOSED_SAVER, str(tmp_path / "open.db"), built],
        capture_output=True,
        text=True,
        timeout=120,  # a hang fails here instead of stalling the suite
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "set up, never closed"


async def test_the_saver_s_own_connection_goes_with_the_saver(tmp_path: Path) -> None:
    def workers() -> int:
        return sum("_connection_worker_thread" in t.name for t in threading.enumerate())

    async with aiosqlite.connect(str(tmp_path / "gone.db")) as conn:
        before = workers()
        saver = AsyncSqliteCancelSaver(conn)
        await saver.setup()
        assert workers() == before + 1  # the async ledger's connection
        del saver
        gc.collect()
        for _ in range(200):
            if workers() == before:
                break
            await asyncio.sleep(0.01)
        assert workers() == before

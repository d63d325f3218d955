"""A side effect never leaves before the checkpoint of the step that asked for it.

Under LangGraph's default ``durability="async"`` the model step's checkpoint is
written while the tool step runs (``test_langgraph_facts.py``). A refund sent in
that window, then a crash, and the resumed run asks the model again: its new call
gets a new id, so a key derived from the id does not stop a second refund. The
tool node therefore waits for the checkpoint its task was prepared from before
the first side-effecting dispatch. Reads do not wait.

Each test holds the saver's ``put`` of the model step's checkpoint and looks at
what the tool node did meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

from graphs import ExecutionLog, backend_params, calls, counting_tool, new_thread, scripted
from langgraph_cancel import (
    EffectKind,
    EffectStatus,
    EffectToolNode,
    get_report,
    request_cancel,
)
from langgraph_cancel.checkpointers.durable import PlanCheckpoint, plan_checkpoint
from langgraph_cancel.checkpointers.postgres import AsyncPostgresCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.ledger import Ledger
from plan_hold import (
    Hold,
    held,
    held_agent,
    held_graph,
    held_saver,
    nothing_sent,
    run_held,
    statuses,
)


@pytest.fixture(params=backend_params(durable_only=True))
def durable_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    return url


@pytest.fixture
def log(tmp_path: Any) -> ExecutionLog:
    return ExecutionLog(str(tmp_path / "providers.db"))


@pytest.mark.parametrize("at_once", [1, 3], ids=["one_call", "three_at_once"])
@pytest.mark.parametrize("stop", [False, True], ids=["saved", "stopped"])
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_side_effect_waits_for_the_model_steps_checkpoint(
    durable_url: str, log: ExecutionLog, use_async: bool, stop: bool, at_once: int
) -> None:
    # The intent is written while the save is held (the two commits overlap); the call
    # itself waits for the save. With effect_concurrency, the intents of the calls that
    # go out together are all written with the batch's plan, and each call waits. A
    # stop that comes before the save: no call leaves, and the records and the report
    # say so.
    hold = Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(*(("refund", f"r-{i}", f"c{i}") for i in range(at_once))), "done")
    thread = new_thread()
    with held_saver(durable_url, hold) as saver:
        node = EffectToolNode([refund], effect_concurrency=at_once)
        graph = held_graph(saver, hold, node, model, use_async=use_async)
        sent = nothing_sent(log, "refund")

        def meanwhile() -> None:
            sent()
            records = saver.ledger.effects(thread)
            assert [record.status for record in records] == [EffectStatus.DISPATCHED] * at_once
            if stop:
                answer = request_cancel(
                    saver, thread, reason="user pressed stop", requested_by="ann"
                )
                assert answer.accepted

        run_held(graph, hold, thread, meanwhile, use_async=use_async)
        records = saver.ledger.effects(thread)
        if not stop:
            assert log.attempts("refund") == at_once and log.applied("refund") == at_once
            assert {record.status for record in records} == {EffectStatus.COMMITTED}
            return
        assert log.attempts("refund") == 0
        for record in records:
            assert record.status is EffectStatus.DROPPED
            trail = saver.ledger.history(record.effect_id)
            assert [(row.from_status, row.to_status) for row in trail[-2:]] == [
                (EffectStatus.DISPATCHED, EffectStatus.NOT_APPLIED),
                (EffectStatus.NOT_APPLIED, EffectStatus.DROPPED),
            ]
            assert trail[-2].detail["never_sent"] is True
        report = get_report(saver, thread)
        assert report.status == "cancelled"
        assert [effect.tool for effect in report.not_run] == ["refund"] * at_once
        assert report.permanent == [] and report.unknown == []
        assert report.dispatched_after_cancel == 0


@pytest.mark.parametrize("at_once", [1, 3], ids=["one_call", "three_at_once"])
@pytest.mark.parametrize("moment", ["waiting_for_the_save", "writing_the_plan"])
def test_a_task_cancelled_while_begun_calls_wait_records_them_never_sent(
    durable_url: str,
    log: ExecutionLog,
    at_once: int,
    moment: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server's runs.cancel cancels the run's asyncio task. Cancelled while the begun
    # calls wait for the save, or while the plan that began them is still being written
    # (committed, its answer not back), none leaves, and each record says it was never
    # sent (no reconcile hook needed to find out); the next invocation finishes the stop
    # with all of them under "never ran", none unknown.
    hold = Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE, reconcile=False)
    model = scripted(calls(*(("refund", f"r-{i}", f"c{i}") for i in range(at_once))), "done")
    thread = new_thread()
    config = {"configurable": {"thread_id": thread}}
    with held_saver(durable_url, hold) as saver:
        if moment == "writing_the_plan":
            written = saver.ledger.aplan_many_and_begin

            async def slow_to_answer(**kwargs: Any) -> Any:
                answer = await written(**kwargs)
                await asyncio.sleep(0.5)
                return answer

            monkeypatch.setattr(saver.ledger, "aplan_many_and_begin", slow_to_answer)
        node = EffectToolNode([refund], effect_concurrency=at_once)
        graph = held_graph(saver, hold, node, model, use_async=True)

        def records() -> list[Any]:
            return list(saver.ledger.effects(thread))

        async def cancel_while_held() -> None:
            task = asyncio.ensure_future(graph.ainvoke({"messages": [HumanMessage("go")]}, config))
            deadline = time.monotonic() + 20
            while [r.status for r in records()] != [EffectStatus.DISPATCHED] * at_once:
                assert time.monotonic() < deadline and not task.done(), records()
                await asyncio.sleep(0.02)
            task.cancel()
            # LangGraph lets the node's task go on until the step's save is over.
            await asyncio.sleep(0.2)
            hold.release.set()
            # The cancel reaches the node's wait and the task ends cancelled, unless
            # LangGraph caught it first (its step still saving): then the node's stop
            # check sees the task's pending cancel, and the run ends its stop itself.
            with contextlib.suppress(asyncio.CancelledError):
                await task

        try:
            asyncio.run(cancel_while_held())
        finally:
            hold.release.set()
        assert log.attempts("refund") == 0
        for record in records():
            trail = [
                (row.from_status, row.to_status, row.detail)
                for row in saver.ledger.history(record.effect_id)
            ]
            assert record.status in (EffectStatus.NOT_APPLIED, EffectStatus.DROPPED), trail
            never_sent = [
                detail
                for before, after, detail in trail
                if (before, after) == (EffectStatus.DISPATCHED, EffectStatus.NOT_APPLIED)
            ]
            assert never_sent in (
                [{"never_sent": True, "reason": "the run's task was cancelled"}],
                [{"never_sent": True, "reason": "the run was stopped"}],
            ), trail
        asyncio.run(graph.ainvoke(None, config))
        report = get_report(saver, thread)
        assert report.status == "cancelled"
        assert [effect.tool for effect in report.not_run] == ["refund"] * at_once
        assert report.unknown == [] and report.permanent == []
        assert log.attempts("refund") == 0


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_read_does_not_wait(durable_url: str, log: ExecutionLog, use_async: bool) -> None:
    hold = Hold()
    lookup = counting_tool(log, "lookup", EffectKind.READ_ONLY)
    model = scripted(calls(("lookup", "o-1", "c1")), "done")
    thread = new_thread()
    with held_saver(durable_url, hold) as saver:
        graph = held_graph(saver, hold, EffectToolNode([lookup]), model, use_async=use_async)

        def meanwhile() -> None:
            deadline = time.monotonic() + 20
            while log.attempts("lookup") == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert log.attempts("lookup") == 1  # ran while the save was held

        run_held(graph, hold, thread, meanwhile, use_async=use_async)


@pytest.mark.postgres
def test_the_async_postgres_saver_waits_too(pg_url: str, log: ExecutionLog) -> None:
    # Native async puts (no worker thread): the graph a LangGraph server would run.
    hold = Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-5", "c1")), "done")
    thread = new_thread()
    out: list[Any] = []

    async def main() -> None:
        async with held(AsyncPostgresCancelSaver, hold).from_conn_string(pg_url) as saver:
            await saver.setup()
            graph = held_graph(saver, hold, EffectToolNode([refund]), model, use_async=True)
            config = {"configurable": {"thread_id": thread}}
            run = asyncio.ensure_future(graph.ainvoke({"messages": [HumanMessage("go")]}, config))
            try:
                assert await asyncio.to_thread(hold.holding.wait, 20)
                await asyncio.sleep(0.5)
                assert log.attempts("refund") == 0
            finally:
                hold.release.set()
                out.append(await asyncio.wait_for(run, 30))
            assert statuses(saver.ledger, thread)["refund"] is EffectStatus.COMMITTED

    asyncio.run(main())
    assert log.attempts("refund") == 1 and out[0]["messages"][-1].content == "done"


def test_a_saver_of_langgraphs_own_is_asked_by_checkpoint_id(
    sqlite_url: str, log: ExecutionLog
) -> None:
    # LangGraph's SqliteSaver notes nothing: the wait asks it for the checkpoint.
    hold = Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-2", "c1")), "done")
    thread = new_thread()
    ledger = Ledger.from_url(sqlite_url)
    ledger.setup()
    with held(SqliteSaver, hold).from_conn_string(sqlite_url.removeprefix("sqlite:///")) as saver:
        graph = held_graph(
            saver, hold, EffectToolNode([refund], ledger=ledger), model, use_async=False
        )
        run_held(graph, hold, thread, nothing_sent(log, "refund"))
        assert log.attempts("refund") == 1
    ledger.close()


def _probe(seen: list[PlanCheckpoint | None]) -> Callable[..., Any]:
    """A node that notes what a dispatch in its place would wait for."""

    def probe(state: MessagesState, config: RunnableConfig) -> dict[str, list[AnyMessage]]:
        seen.append(plan_checkpoint(config))
        return {"messages": [AIMessage("probed")]}

    return probe


def test_the_checkpoint_waited_for_is_the_tasks_own_in_a_subgraph_too(sqlite_url: str) -> None:
    seen: list[PlanCheckpoint | None] = []
    inner = StateGraph(MessagesState)
    inner.add_node("probe", _probe(seen))
    inner.add_edge(START, "probe")
    inner.add_edge("probe", END)
    builder = StateGraph(MessagesState)
    builder.add_node("probe", _probe(seen))
    builder.add_node("inner", inner.compile())
    builder.add_edge(START, "probe")
    builder.add_edge("probe", "inner")
    builder.add_edge("inner", END)
    with SqliteCancelSaver.from_conn_string(sqlite_url) as saver:
        saver.setup()
        graph = builder.compile(checkpointer=saver)
        config: RunnableConfig = {"configurable": {"thread_id": new_thread()}}
        graph.invoke({"messages": [HumanMessage("go")]}, config)
        assert len(seen) == 2 and all(p is not None for p in seen)
        for plan in seen:
            assert plan is not None
            assert plan.known_saved()
            found = SqliteSaver.get_tuple(saver, plan.config)  # from disk, not noted
            assert found is not None and found.checkpoint["id"] == plan.checkpoint_id
        root, sub = seen
        assert root is not None and sub is not None
        assert root.config["configurable"]["checkpoint_ns"] == ""
        assert sub.config["configurable"]["checkpoint_ns"].startswith("inner:")
        # durability="sync": LangGraph saved the step before this one started.
        seen.clear()
        graph.invoke({"messages": [HumanMessage("again")]}, config, durability="sync")
        assert seen == [None, None]


def test_create_agent_with_the_middleware_waits_too(sqlite_url: str, log: ExecutionLog) -> None:
    hold = Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-4", "c1")), "done")
    thread = new_thread()
    with held_saver(sqlite_url, hold) as saver:
        agent = held_agent(saver, hold, model, [refund])
        run_held(agent, hold, thread, nothing_sent(log, "refund"))
        assert log.attempts("refund") == 1
        assert statuses(saver.ledger, thread)["refund"] is EffectStatus.COMMITTED


def test_waiting_calls_hold_no_thread_of_the_event_loop(sqlite_url: str) -> None:
    # A threaded aput needs a worker of the loop's default executor to save the very
    # checkpoint the calls wait for: concurrent calls each blocking a worker while
    # they wait could leave none (seen with six concurrent refunds on two cores).
    from concurrent.futures import ThreadPoolExecutor

    with SqliteCancelSaver.from_conn_string(sqlite_url) as saver:
        saver.setup()
        config: RunnableConfig = {
            "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "cp-1"}
        }
        plan = PlanCheckpoint(saver=saver, config=config, checkpoint_id="cp-1")

        async def main() -> None:
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
            waiters = [asyncio.create_task(plan.await_saved(within=5)) for _ in range(4)]
            await asyncio.sleep(0.05)
            assert not any(w.done() for w in waiters)
            await asyncio.wait_for(asyncio.to_thread(saver.saved_checkpoints.note, "cp-1"), 3)
            await asyncio.wait_for(asyncio.gather(*waiters), 3)

        asyncio.run(main())
        assert plan.known_saved()


def test_the_sqlite_savers_checkpoints_commit_as_its_ledger_does(tmp_path: Any) -> None:
    # One file, one write-ahead log, one durability for both kinds of rows: WAL with
    # synchronous=NORMAL (a commit survives kill -9; a power cut loses a suffix of the
    # log, never a checkpoint while keeping a later intent). The connection is the
    # user's: what the saver set on it is what its checkpoints get.
    import sqlite3

    conn = sqlite3.connect(str(tmp_path / "agent.db"), check_same_thread=False)
    try:
        saver = SqliteCancelSaver(conn)
        saver.setup()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        ledger_conn = saver.ledger.backend._conn  # type: ignore[attr-defined]
        assert ledger_conn.execute("PRAGMA synchronous").fetchone()[0] == 1
        saver.ledger.close()
    finally:
        conn.close()

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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graphs import ExecutionLog, backend_params, calls, counting_tool, new_thread, scripted
from langgraph_cancel import (
    CheckpointNotSavedError,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    add_cancellation,
    get_report,
    request_cancel,
)
from langgraph_cancel.checkpointers.durable import PlanCheckpoint, plan_checkpoint
from langgraph_cancel.checkpointers.postgres import AsyncPostgresCancelSaver, PostgresCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.ledger import Ledger


class _Hold:
    """Once armed, the next ``put`` waits for ``release``."""

    def __init__(self, *, fail: bool = False) -> None:
        self.armed = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()
        self.fail = fail  # the held save then fails (the database went away)

    def before_put(self) -> None:
        if self.armed.is_set() and not self.release.is_set():
            self.holding.set()
            self.release.wait(30)
            if self.fail:
                raise ConnectionError("server closed the connection unexpectedly")


def _held(base: type[Any], hold: _Hold) -> type[Any]:
    """``base`` whose LangGraph saver underneath holds (and maybe fails) the armed put.

    Underneath: our savers note a save, or its failure, around LangGraph's ``put``.
    """
    langgraph_saver = next(c for c in base.__mro__ if c.__module__.startswith("langgraph."))

    class Below(langgraph_saver):  # type: ignore[misc, valid-type]
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            hold.before_put()
            return super().put(config, checkpoint, metadata, new_versions)

        async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            await asyncio.to_thread(hold.before_put)
            return await super().aput(config, checkpoint, metadata, new_versions)

    if base is langgraph_saver:
        return Below

    class Held(base, Below):  # type: ignore[misc]
        pass

    return Held


@pytest.fixture(params=backend_params(durable_only=True))
def durable_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    return url


@contextmanager
def _held_saver(url: str, hold: _Hold) -> Iterator[Any]:
    base = SqliteCancelSaver if url.startswith("sqlite") else PostgresCancelSaver
    with _held(base, hold).from_conn_string(url) as saver:
        saver.setup()
        yield saver


@pytest.fixture
def log(tmp_path: Any) -> ExecutionLog:
    return ExecutionLog(str(tmp_path / "providers.db"))


def _graph(saver: Any, hold: _Hold, node: EffectToolNode, model: Any, *, use_async: bool) -> Any:
    """model -> tools -> model; the model arms the hold, so its step's save is held."""

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        out = model.invoke(state["messages"])
        hold.armed.set()
        return {"messages": [out]}

    async def aagent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return agent(state)

    builder = StateGraph(MessagesState)
    builder.add_node("agent", aagent if use_async else agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return add_cancellation(builder).compile(checkpointer=saver)


def _agent(saver: Any, hold: _Hold, model: Any, tools: list[Any], **options: Any) -> Any:
    """``create_agent`` with ``EffectMiddleware(**options)``; the model step arms the hold."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware

    from langgraph_cancel.middleware import EffectMiddleware

    class ArmAfterModel(AgentMiddleware[Any, Any, Any]):
        def after_model(self, state: Any, runtime: Any) -> None:
            hold.armed.set()

    return create_agent(
        model,
        tools,
        middleware=[
            cast(AgentMiddleware[Any, Any, Any], EffectMiddleware(approval=False, **options)),
            ArmAfterModel(),
        ],
        checkpointer=saver,
    )


def _start(graph: Any, thread: str, *, use_async: bool) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    config = {"configurable": {"thread_id": thread}}
    inputs = {"messages": [HumanMessage("go")]}

    def run() -> None:
        try:
            if use_async:
                out.append(asyncio.run(graph.ainvoke(inputs, config)))
            else:
                out.append(graph.invoke(inputs, config))
        except BaseException as exc:  # handed to the test
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, out


def _run_held(
    graph: Any,
    hold: _Hold,
    thread: str,
    meanwhile: Callable[[], None],
    *,
    use_async: bool = False,
) -> Any:
    """Run ``graph``; once the model step's save is held, check ``meanwhile``, then let
    the save go and return the run's result."""
    worker, out = _start(graph, thread, use_async=use_async)
    try:
        assert hold.holding.wait(20), "the model step's checkpoint was never put"
        meanwhile()
    finally:
        hold.release.set()
        worker.join(30)
    assert out and not isinstance(out[0], BaseException), out
    return out[0]


def _nothing_sent(log: ExecutionLog, tool: str) -> Callable[[], None]:
    def check() -> None:
        time.sleep(0.5)  # ample time for the tool node to start and plan
        assert log.attempts(tool) == 0

    return check


def _statuses(ledger: Ledger, thread: str) -> dict[str, EffectStatus]:
    return {e.tool: e.status for e in ledger.effects(thread)}


@pytest.mark.parametrize("stop", [False, True], ids=["saved", "stopped"])
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_side_effect_waits_for_the_model_steps_checkpoint(
    durable_url: str, log: ExecutionLog, use_async: bool, stop: bool
) -> None:
    # The intent is written while the save is held (the two commits overlap); the call
    # itself waits for the save. A stop that comes before the save: the call never
    # leaves, and its record and the report say so.
    hold = _Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-1", "c1")), "done")
    thread = new_thread()
    with _held_saver(durable_url, hold) as saver:
        graph = _graph(saver, hold, EffectToolNode([refund]), model, use_async=use_async)
        sent = _nothing_sent(log, "refund")

        def meanwhile() -> None:
            sent()
            assert _statuses(saver.ledger, thread).get("refund") is EffectStatus.DISPATCHED
            if stop:
                answer = request_cancel(
                    saver, thread, reason="user pressed stop", requested_by="ann"
                )
                assert answer.accepted

        _run_held(graph, hold, thread, meanwhile, use_async=use_async)
        if not stop:
            assert log.attempts("refund") == 1
            assert _statuses(saver.ledger, thread)["refund"] is EffectStatus.COMMITTED
            return
        assert log.attempts("refund") == 0
        [refund_record] = saver.ledger.effects(thread)
        assert refund_record.status is EffectStatus.DROPPED
        trail = [
            (row.from_status, row.to_status)
            for row in saver.ledger.history(refund_record.effect_id)
        ]
        assert trail[-2:] == [
            (EffectStatus.DISPATCHED, EffectStatus.NOT_APPLIED),
            (EffectStatus.NOT_APPLIED, EffectStatus.DROPPED),
        ]
        report = get_report(saver, thread)
        assert report.status == "cancelled"
        assert [effect.tool for effect in report.not_run] == ["refund"]
        assert report.permanent == [] and report.unknown == []
        assert report.dispatched_after_cancel == 0


@pytest.mark.parametrize("stop", [False, True], ids=["saved", "stopped"])
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_side_effects_sent_at_once_all_wait_for_the_checkpoint(
    durable_url: str, log: ExecutionLog, use_async: bool, stop: bool
) -> None:
    # With effect_concurrency, the intents of the calls that go out together are
    # written with the batch's plan while the save is held; each call waits for the
    # save, and a stop before it sends none of them.
    hold = _Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(*(("refund", f"r-{i}", f"c{i}") for i in range(3))), "done")
    thread = new_thread()
    with _held_saver(durable_url, hold) as saver:
        node = EffectToolNode([refund], effect_concurrency=3)
        graph = _graph(saver, hold, node, model, use_async=use_async)
        sent = _nothing_sent(log, "refund")

        def meanwhile() -> None:
            sent()
            records = saver.ledger.effects(thread)
            assert [record.status for record in records] == [EffectStatus.DISPATCHED] * 3
            if stop:
                answer = request_cancel(
                    saver, thread, reason="user pressed stop", requested_by="ann"
                )
                assert answer.accepted

        _run_held(graph, hold, thread, meanwhile, use_async=use_async)
        records = saver.ledger.effects(thread)
        if not stop:
            assert log.attempts("refund") == 3 and log.applied("refund") == 3
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
        assert len(report.not_run) == 3 and report.permanent == [] and report.unknown == []
        assert report.dispatched_after_cancel == 0


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_read_does_not_wait(durable_url: str, log: ExecutionLog, use_async: bool) -> None:
    hold = _Hold()
    lookup = counting_tool(log, "lookup", EffectKind.READ_ONLY)
    model = scripted(calls(("lookup", "o-1", "c1")), "done")
    thread = new_thread()
    with _held_saver(durable_url, hold) as saver:
        graph = _graph(saver, hold, EffectToolNode([lookup]), model, use_async=use_async)

        def meanwhile() -> None:
            deadline = time.monotonic() + 20
            while log.attempts("lookup") == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert log.attempts("lookup") == 1  # ran while the save was held

        _run_held(graph, hold, thread, meanwhile, use_async=use_async)


@pytest.mark.postgres
def test_the_async_postgres_saver_waits_too(pg_url: str, log: ExecutionLog) -> None:
    # Native async puts (no worker thread): the graph a LangGraph server would run.
    hold = _Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-5", "c1")), "done")
    thread = new_thread()
    out: list[Any] = []

    async def main() -> None:
        async with _held(AsyncPostgresCancelSaver, hold).from_conn_string(pg_url) as saver:
            await saver.setup()
            graph = _graph(saver, hold, EffectToolNode([refund]), model, use_async=True)
            config = {"configurable": {"thread_id": thread}}
            run = asyncio.ensure_future(graph.ainvoke({"messages": [HumanMessage("go")]}, config))
            try:
                assert await asyncio.to_thread(hold.holding.wait, 20)
                await asyncio.sleep(0.5)
                assert log.attempts("refund") == 0
            finally:
                hold.release.set()
                out.append(await asyncio.wait_for(run, 30))
            assert _statuses(saver.ledger, thread)["refund"] is EffectStatus.COMMITTED

    asyncio.run(main())
    assert log.attempts("refund") == 1 and out[0]["messages"][-1].content == "done"


def test_a_saver_of_langgraphs_own_is_asked_by_checkpoint_id(
    sqlite_url: str, log: ExecutionLog
) -> None:
    # LangGraph's SqliteSaver notes nothing: the wait asks it for the checkpoint.
    hold = _Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-2", "c1")), "done")
    thread = new_thread()
    ledger = Ledger.from_url(sqlite_url)
    ledger.setup()
    with _held(SqliteSaver, hold).from_conn_string(sqlite_url.removeprefix("sqlite:///")) as saver:
        graph = _graph(saver, hold, EffectToolNode([refund], ledger=ledger), model, use_async=False)
        _run_held(graph, hold, thread, _nothing_sent(log, "refund"))
        assert log.attempts("refund") == 1
    ledger.close()


@pytest.mark.parametrize("via", ["node", "middleware"])
def test_a_save_that_never_comes_dispatches_nothing(
    sqlite_url: str, log: ExecutionLog, via: str
) -> None:
    hold = _Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-3", "c1")), "done")
    thread = new_thread()
    with _held_saver(sqlite_url, hold) as saver:
        if via == "node":
            node = EffectToolNode([refund], checkpoint_timeout=0.5)
            graph = _graph(saver, hold, node, model, use_async=False)
        else:
            graph = _agent(saver, hold, model, [refund], checkpoint_timeout=0.5)
        started = time.monotonic()
        worker, out = _start(graph, thread, use_async=False)
        assert hold.holding.wait(20)
        # The node gives up after 0.5 s of the default 30; the run ends once the save does.
        # The node plans the call with its intent while the save is held; the
        # middleware's call is planned and waits before its intent.
        waiting = EffectStatus.DISPATCHED if via == "node" else EffectStatus.PLANNED
        deadline = time.monotonic() + 20
        while _statuses(saver.ledger, thread).get("refund") is not waiting:
            assert time.monotonic() < deadline, "the call was never planned"
            time.sleep(0.05)
        time.sleep(max(0.0, started + 2.0 - time.monotonic()))
        hold.release.set()
        worker.join(30)
        assert out, "the run did not end"
        assert isinstance(out[0], CheckpointNotSavedError), out[0]
        assert "0.5" in str(out[0]) and "nothing was dispatched" in str(out[0])
        assert log.attempts("refund") == 0
        [refund_record] = saver.ledger.effects(thread)
        if via == "middleware":
            assert refund_record.status is EffectStatus.PLANNED
            return
        # Its intent was durable, but it never left the process: the record says so,
        # and a later run may send it under the same key.
        assert refund_record.status is EffectStatus.NOT_APPLIED
        last = saver.ledger.history(refund_record.effect_id)[-1]
        assert (last.from_status, last.to_status) == (
            EffectStatus.DISPATCHED,
            EffectStatus.NOT_APPLIED,
        )
        assert last.detail["never_sent"] is True
        assert "not saved" in last.detail["reason"]


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan")])
def test_checkpoint_timeout_must_be_a_positive_number_of_seconds(seconds: float) -> None:
    from langgraph_cancel.middleware import EffectMiddleware

    with pytest.raises(ValueError, match="checkpoint_timeout"):
        EffectToolNode([], checkpoint_timeout=seconds)
    with pytest.raises(ValueError, match="checkpoint_timeout"):
        EffectMiddleware(checkpoint_timeout=seconds)


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
    hold = _Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-4", "c1")), "done")
    thread = new_thread()
    with _held_saver(sqlite_url, hold) as saver:
        agent = _agent(saver, hold, model, [refund])
        _run_held(agent, hold, thread, _nothing_sent(log, "refund"))
        assert log.attempts("refund") == 1
        assert _statuses(saver.ledger, thread)["refund"] is EffectStatus.COMMITTED


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


def test_a_saver_that_reads_nothing_back_is_not_waited_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # BaseCheckpointSaver's own get_tuple / aget_tuple raise NotImplementedError: the
    # wait cannot be kept, which is said once, and the dispatch goes on.
    from langgraph.checkpoint.base import BaseCheckpointSaver

    class Unaskable(BaseCheckpointSaver[Any]):
        pass

    config: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_id": "cp-9"}}
    plan = PlanCheckpoint(saver=Unaskable(), config=config, checkpoint_id="cp-9")
    with caplog.at_level("WARNING", logger="langgraph_cancel.checkpointers"):
        plan.wait(5)
        asyncio.run(plan.await_saved(5))
    warned = [r for r in caplog.records if "cannot read a checkpoint back" in r.getMessage()]
    assert len(warned) == 1 and "Unaskable" in warned[0].getMessage()


def test_a_read_that_fails_is_not_saved_yet_and_the_wait_goes_on() -> None:
    # The database drops the connection while the dispatch waits: the failed reads
    # count as "not saved yet"; the wait ends when a read finds the checkpoint, or at
    # the deadline with CheckpointNotSavedError carrying the last database error.
    from langgraph.checkpoint.base import BaseCheckpointSaver

    class Flaky(BaseCheckpointSaver[Any]):
        def __init__(self, failures: int) -> None:
            super().__init__()
            self.failures = failures
            self.reads = 0

        def get_tuple(self, config: RunnableConfig) -> Any:
            self.reads += 1
            if self.failures < 0 or self.reads <= self.failures:
                raise ConnectionError("server closed the connection unexpectedly")
            return object()  # found

    config: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_id": "cp-7"}}
    for wait in ("sync", "async"):
        flaky = Flaky(failures=3)
        plan = PlanCheckpoint(saver=flaky, config=config, checkpoint_id="cp-7")
        if wait == "sync":
            plan.wait(5)
        else:
            asyncio.run(plan.await_saved(5))
        assert flaky.reads == 4
        down = PlanCheckpoint(saver=Flaky(failures=-1), config=config, checkpoint_id="cp-7")
        with pytest.raises(CheckpointNotSavedError) as caught:
            if wait == "sync":
                down.wait(0.3)
            else:
                asyncio.run(down.await_saved(0.3))
        assert isinstance(caught.value.__cause__, ConnectionError)


def test_a_save_that_fails_stops_the_wait_at_once(sqlite_url: str, log: ExecutionLog) -> None:
    # LangGraph does not retry a failed save: the dispatch stops waiting when it
    # fails, well before the timeout, and nothing goes out.
    hold = _Hold(fail=True)
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-6", "c1")), "done")
    thread = new_thread()
    with _held_saver(sqlite_url, hold) as saver:
        node = EffectToolNode([refund], checkpoint_timeout=20.0)
        graph = _graph(saver, hold, node, model, use_async=False)
        worker, out = _start(graph, thread, use_async=False)
        assert hold.holding.wait(20)
        time.sleep(0.3)
        hold.release.set()
        worker.join(60)
        assert out, "the run did not end"
        # Told why (the failed save), not that 20 s went by.
        err = out[0]
        assert isinstance(err, CheckpointNotSavedError), repr(err)
        assert isinstance(err.__cause__, ConnectionError) and "save failed" in str(err)
        assert log.attempts("refund") == 0
        # Its intent went with the plan, while the save was still under way.
        assert _statuses(saver.ledger, thread)["refund"] is EffectStatus.NOT_APPLIED
        saved = saver.saved_checkpoints
        failed = [cid for cid in list(saved._ids) if saved.failure(cid) is not None]
        assert len(failed) == 1 and failed[0] not in saved


def test_a_failed_save_ends_the_waits_for_the_rest_of_its_run_only() -> None:
    # LangGraph saves a run's checkpoints one after the other: after a failed save no
    # later checkpoint of the run is saved. A later save or read of the thread (a new
    # run) clears that. Checkpoint ids sort by time.
    from langgraph_cancel.checkpointers.durable import SavedCheckpoints

    noted, thread = SavedCheckpoints(), ("t", "")
    noted.note("cp-1", thread=thread)
    noted.note("cp-2", failed=ConnectionError("down"), thread=thread)
    assert "cp-1" in noted and "cp-2" not in noted
    assert isinstance(noted.failure("cp-2"), ConnectionError)
    assert isinstance(noted.failure("cp-3", thread), ConnectionError)  # never coming
    assert noted.failure("cp-3") is None and noted.failure("cp-3", ("u", "")) is None
    noted.note("cp-4", thread=thread)  # the next run's first save
    assert noted.failure("cp-5", thread) is None
    noted.note("cp-2", thread=thread)  # read back after all: saved
    assert "cp-2" in noted and noted.failure("cp-2") is None


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

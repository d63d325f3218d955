"""Each cancel-aware saver is a real LangGraph checkpointer and owns a working ledger.

Runs the public ``langgraph-checkpoint-conformance`` suite against
``MemoryCancelSaver``, ``SqliteCancelSaver``, ``AsyncSqliteCancelSaver``,
``PostgresCancelSaver`` and ``AsyncPostgresCancelSaver`` (a fresh PostgreSQL
database per registration), and checks that every saver's ledger works,
``setup()`` is idempotent and ``delete_thread`` forgets the thread's ledger rows too.
"""

from __future__ import annotations

import itertools
import sqlite3
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, closing
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import BASE_CAPABILITIES, Capability

from langgraph_cancel.checkpointers.base import LedgerOwner
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.checkpointers.sqlite import AsyncSqliteCancelSaver, SqliteCancelSaver
from langgraph_cancel.errors import UnknownThreadError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.schema import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS
from langgraph_cancel.types import EffectKind, EffectStatus, RunStatus

SaverFactory = Callable[[], AbstractAsyncContextManager[BaseCheckpointSaver[Any]]]
_counter = itertools.count()


def _factory(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> SaverFactory:
    """An async context manager factory opening a fresh, set-up saver of ``kind``."""
    if kind == "memory":

        @asynccontextmanager
        async def memory() -> AsyncIterator[BaseCheckpointSaver[Any]]:
            saver = MemoryCancelSaver()
            saver.setup()
            yield saver
            saver.ledger.close()

        return memory

    if kind == "sqlite":

        @asynccontextmanager
        async def sqlite() -> AsyncIterator[BaseCheckpointSaver[Any]]:
            path = tmp_path / f"saver-{next(_counter)}.db"
            with SqliteCancelSaver.from_conn_string(str(path)) as saver:
                saver.setup()
                yield saver

        return sqlite

    if kind == "asqlite":

        @asynccontextmanager
        async def asqlite() -> AsyncIterator[BaseCheckpointSaver[Any]]:
            path = tmp_path / f"saver-{next(_counter)}.db"
            async with AsyncSqliteCancelSaver.from_conn_string(str(path)) as saver:
                await saver.setup()
                yield saver

        return asqlite

    url: str = request.getfixturevalue("pg_url")
    from langgraph_cancel.checkpointers.postgres import (
        AsyncPostgresCancelSaver,
        PostgresCancelSaver,
    )

    if kind == "postgres":

        @asynccontextmanager
        async def postgres() -> AsyncIterator[BaseCheckpointSaver[Any]]:
            with PostgresCancelSaver.from_conn_string(url) as saver:
                saver.setup()
                yield saver

        return postgres

    @asynccontextmanager
    async def apostgres() -> AsyncIterator[BaseCheckpointSaver[Any]]:
        async with AsyncPostgresCancelSaver.from_conn_string(url) as saver:
            await saver.setup()
            yield saver

    return apostgres


EXTENDED_METHODS = {
    Capability.DELETE_FOR_RUNS: "adelete_for_runs",
    Capability.COPY_THREAD: "acopy_thread",
    Capability.PRUNE: "aprune",
}


def _saver_class(kind: str) -> type[BaseCheckpointSaver[Any]]:
    if kind == "memory":
        return MemoryCancelSaver
    if kind == "sqlite":
        return SqliteCancelSaver
    if kind == "asqlite":
        return AsyncSqliteCancelSaver
    from langgraph_cancel.checkpointers.postgres import (
        AsyncPostgresCancelSaver,
        PostgresCancelSaver,
    )

    return PostgresCancelSaver if kind == "postgres" else AsyncPostgresCancelSaver


SAVERS = [
    pytest.param("memory", id="MemoryCancelSaver"),
    pytest.param("sqlite", id="SqliteCancelSaver"),
    pytest.param("asqlite", id="AsyncSqliteCancelSaver"),
    pytest.param("postgres", id="PostgresCancelSaver", marks=pytest.mark.postgres),
    pytest.param("apostgres", id="AsyncPostgresCancelSaver", marks=pytest.mark.postgres),
]


@pytest.mark.parametrize("kind", SAVERS)
async def test_conformance_base_capabilities(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    open_saver = _factory(request, kind, tmp_path)

    async def factory() -> AsyncGenerator[BaseCheckpointSaver[Any], None]:
        async with open_saver() as saver:
            yield saver

    registered = checkpointer_test(name=f"{kind}-{request.node.name}")(factory)
    # Base capabilities, plus each extended one the saver class claims (validate()
    # would open a saver just to find an unclaimed one missing).
    claimed = {
        cap.value
        for cap, method in EXTENDED_METHODS.items()
        if getattr(_saver_class(kind), method) is not getattr(BaseCheckpointSaver, method)
    }
    report = await validate(registered, capabilities={c.value for c in BASE_CAPABILITIES} | claimed)
    failures = {
        name: result.failures
        for name, result in report.results.items()
        if result.detected and result.passed is not True
    }
    assert report.passed_all_base(), failures
    for cap in BASE_CAPABILITIES:
        result = report.results[cap.value]
        assert result.detected and result.tests_passed > 0 and result.tests_failed == 0, cap
    # Whatever extended capability a saver claims, it must pass too.
    assert report.passed_all(), failures
    for name in claimed:
        assert report.results[name].detected and report.results[name].passed is True, name


@pytest.mark.parametrize("kind", SAVERS)
async def test_saver_owns_a_working_ledger(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    open_saver = _factory(request, kind, tmp_path)
    async with open_saver() as saver:
        assert isinstance(saver, LedgerOwner)
        ledger = saver.ledger
        # setup() again is harmless, on the saver and on its ledger.
        setup_result = getattr(saver, "setup")()  # noqa: B009 - not on the base class
        if kind in ("apostgres", "asqlite"):
            await setup_result
        ledger.setup()

        keep, drop = "thread-keep", "thread-drop"
        effect_ids: dict[str, str] = {}
        for thread in (keep, drop):
            run = await ledger.astart_run(thread)
            rec, created = await ledger.aplan(
                thread_id=thread,
                run_id=run.run_id,
                tool_call_id="call-1",
                tool="refund",
                kind=EffectKind.IRREVERSIBLE,
                args={"amount": 10},
            )
            assert created
            await ledger.atransition(rec.effect_id, EffectStatus.APPROVED, actor="human")
            effect_ids[thread] = rec.effect_id
            config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            await saver.aput(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
            assert await saver.aget_tuple(config) is not None

        await saver.adelete_thread(drop)

        # The dropped thread is gone from checkpoints and from the ledger ...
        drop_cfg: RunnableConfig = {"configurable": {"thread_id": drop, "checkpoint_ns": ""}}
        assert await saver.aget_tuple(drop_cfg) is None
        assert ledger.effects(drop) == []
        assert ledger.runs(drop) == []
        assert ledger.find_effect(drop, "call-1") is None
        with pytest.raises(UnknownThreadError):
            ledger.request_cancel(drop, reason="x", requested_by="y")
        # ... and the other thread is untouched.
        keep_cfg: RunnableConfig = {"configurable": {"thread_id": keep, "checkpoint_ns": ""}}
        assert await saver.aget_tuple(keep_cfg) is not None
        [kept] = ledger.effects(keep)
        assert kept.effect_id == effect_ids[keep] and kept.status is EffectStatus.APPROVED
        answer = ledger.request_cancel(keep, reason="stop", requested_by="alice")
        assert answer.first and answer.status is RunStatus.CANCEL_REQUESTED


def test_sync_savers_delete_thread_and_setup_twice(tmp_path: Path) -> None:
    path = tmp_path / "sync.db"
    with SqliteCancelSaver.from_conn_string(str(path)) as saver:
        saver.setup()
        saver.setup()
        run = saver.ledger.start_run("t1")
        saver.ledger.plan(
            thread_id="t1",
            run_id=run.run_id,
            tool_call_id="c1",
            tool="email",
            kind=EffectKind.IRREVERSIBLE,
            args={},
        )
        config: RunnableConfig = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
        saver.delete_thread("t1")
        assert saver.get_tuple(config) is None
        assert saver.ledger.effects("t1") == [] and saver.ledger.runs("t1") == []

    # A second saver on the same file: setup() finds the schema and keeps the data.
    with SqliteCancelSaver.from_conn_string(f"sqlite:///{path}") as again:
        again.setup()
        run = again.ledger.start_run("t2")
        assert again.ledger.active_run("t2") == run
        with again.ledger.backend.transaction() as cur:
            cur.execute("SELECT COUNT(*) AS n FROM lgc_migrations")
            row = cur.fetchone()
        assert row is not None and row["n"] == len(SQLITE_MIGRATIONS)

    memory = MemoryCancelSaver()
    memory.setup()
    memory.setup()
    run = memory.ledger.start_run("t1")
    assert memory.ledger.get_run(run.run_id) == run
    memory.delete_thread("t1")
    assert memory.ledger.runs("t1") == []


@pytest.mark.postgres
def test_postgres_second_saver_setup_is_idempotent(pg_url: str) -> None:
    from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

    with PostgresCancelSaver.from_conn_string(pg_url) as first:
        first.setup()
        run = first.ledger.start_run("t1")
    with PostgresCancelSaver.from_conn_string(pg_url) as second:
        second.setup()
        second.setup()
        assert second.ledger.get_run(run.run_id) == run
        with second.ledger.backend.transaction() as cur:
            cur.execute("SELECT COUNT(*) AS n FROM lgc_migrations")
            row = cur.fetchone()
        assert row is not None and row["n"] == len(POSTGRES_MIGRATIONS)


def _thread_config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


@pytest.mark.postgres
def test_pruning_threads_away_deletes_their_ledger_rows(pg_url: str) -> None:
    from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

    gone, kept = f"t-{uuid.uuid4().hex}", f"t-{uuid.uuid4().hex}"
    with PostgresCancelSaver.from_conn_string(pg_url) as saver:
        saver.setup()
        for thread_id in (gone, kept):
            saver.ledger.start_run(thread_id)
            saver.put(_thread_config(thread_id), empty_checkpoint(), {"step": -1}, {})
        saver.prune([gone], strategy="keep_latest")  # keeps the latest: the ledger stays
        assert saver.get_tuple(_thread_config(gone)) is not None
        assert len(saver.ledger.runs(gone)) == 1
        saver.prune([gone], strategy="delete")
        assert saver.get_tuple(_thread_config(gone)) is None
        assert saver.ledger.runs(gone) == []
        assert saver.get_tuple(_thread_config(kept)) is not None
        assert len(saver.ledger.runs(kept)) == 1


async def _prune_one_of_two_threads(saver: Any) -> None:
    """Two threads with a run and a checkpoint each; ``aprune(strategy="delete")`` of
    one takes its checkpoints and its ledger rows, and leaves the other's."""
    gone, kept = f"t-{uuid.uuid4().hex}", f"t-{uuid.uuid4().hex}"
    for thread_id in (gone, kept):
        await saver.ledger.astart_run(thread_id)
        await saver.aput(_thread_config(thread_id), empty_checkpoint(), {"step": -1}, {})
    await saver.aprune([gone], strategy="delete")
    assert await saver.aget_tuple(_thread_config(gone)) is None
    assert await saver.ledger.aruns(gone) == []
    assert await saver.aget_tuple(_thread_config(kept)) is not None
    assert len(await saver.ledger.aruns(kept)) == 1


@pytest.mark.postgres
async def test_async_pruning_threads_away_deletes_their_ledger_rows(pg_url: str) -> None:
    from langgraph_cancel.checkpointers.postgres import AsyncPostgresCancelSaver

    async with AsyncPostgresCancelSaver.from_conn_string(pg_url) as saver:
        await saver.setup()
        await _prune_one_of_two_threads(saver)


@pytest.mark.postgres
async def test_a_sync_saver_prunes_for_async_callers_too(pg_url: str) -> None:
    """The sync saver serves async graphs from worker threads; ``aprune`` too."""
    from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

    with PostgresCancelSaver.from_conn_string(pg_url) as saver:
        saver.setup()
        await _prune_one_of_two_threads(saver)


def test_a_version_0_ledger_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    """Migrations are append-only: a database made by version 0 gets the later ones."""
    path = tmp_path / "v0.db"
    conn = sqlite3.connect(path)
    for statement in SQLITE_MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO lgc_migrations (v) VALUES (0)")
    conn.execute(
        "INSERT INTO lgc_runs (run_id, thread_id, status, created_at, updated_at) VALUES "
        "('r0', 't0', 'running', '2026-01-01T00:00:00+00:00', '2026-01-01T00:00:00+00:00')"
    )
    conn.commit()
    conn.close()
    with Ledger.from_url(f"sqlite:///{path}") as ledger:
        assert ledger.active_run("t0") is not None  # the old row, still there
        asked = ledger.request_cancel("t0", reason="stop", requested_by="test")
        assert asked.accepted and asked.first  # written with the v1 token column
        with ledger.backend.transaction() as cur:
            cur.execute("SELECT v FROM lgc_migrations ORDER BY v")
            versions = [r["v"] for r in cur.fetchall()]
    assert versions == list(range(len(SQLITE_MIGRATIONS)))


def test_setting_up_a_set_up_file_waits_for_no_other_writer(tmp_path: Path) -> None:
    """A worker starting beside another in the middle of its transaction sets up at
    once, as LangGraph's ``SqliteSaver`` does: a ledger at the latest version is only
    read, never locked for writing."""
    path = tmp_path / "busy.db"
    with SqliteCancelSaver.from_conn_string(str(path)) as first:
        first.setup()
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        with closing(sqlite3.connect(path, timeout=0, check_same_thread=False)) as conn:
            saver = SqliteCancelSaver(conn)
            saver.setup()
            assert saver.ledger.runs("t") == []
            saver.ledger.close()
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_the_migrations_are_importable_where_they_were() -> None:
    from langgraph_cancel.ledger import schema, sql

    assert sql.POSTGRES_MIGRATIONS is schema.POSTGRES_MIGRATIONS
    assert sql.SQLITE_MIGRATIONS is schema.SQLITE_MIGRATIONS


def test_opening_savers_draws_no_uuid4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests that make uuid4 deterministic (LangGraph's own do) expect the ids their
    # graph draws: a saver swapped in must not take one of them.
    drawn: list[str] = []
    real_uuid4 = uuid.uuid4

    def counting_uuid4() -> uuid.UUID:
        drawn.append("drawn")
        return real_uuid4()

    monkeypatch.setattr(uuid, "uuid4", counting_uuid4)
    with SqliteCancelSaver.from_conn_string(":memory:") as memory_file:
        memory_file.setup()
    with SqliteCancelSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as on_disk:
        on_disk.setup()
    MemoryCancelSaver().setup()
    assert drawn == []

"""A PostgreSQL saver built on the caller's pool or connection leaves no session behind.

LangGraph's savers use the pool or connection they are given, and the caller closes
it. Ours add the ledger: it shares the caller's pool or connection (the async ledger
too; on one connection under the saver's lock, as the checkpoints), and its cancel
listener ends when that is closed. So a saver made per request, or a test that drops
its database once the pool or connection it gave the saver is closed (LangGraph's own
tests do), finds no session of ours left on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from graphs import (
    ExecutionLog,
    agent_builder,
    calls,
    cancellable,
    config_for,
    counting_tool,
    new_thread,
    scripted,
)
from langgraph_cancel import EffectKind, EffectToolNode
from langgraph_cancel.checkpointers.postgres import (
    AsyncPostgresCancelSaver,
    PostgresCancelSaver,
)
from langgraph_cancel.errors import TransientDatabaseError
from langgraph_cancel.ledger import PostgresBackend
from langgraph_cancel.ledger.aio_postgres import AsyncPostgresBackend
from langgraph_cancel.ledger.backends import CallersHandle

POOL_SIZE = 3
#: Beside the pool, the session that listens for cancel requests (``LISTEN`` needs a
#: connection of its own).
LISTENER = 1


def sessions(url: str, *, expected: int = 0, within: float = 5.0) -> int:
    """The server's sessions on ``url``'s database besides this probe's, once they
    number ``expected`` or ``within`` seconds have passed (a closed client's server
    process takes a moment to exit)."""
    deadline = time.monotonic() + within
    # Once: late in a long run a full collection takes a noticeable while, and what
    # it frees (a dropped saver's connections) is freed by the first.
    gc.collect()
    while True:
        with psycopg.connect(url, autocommit=True) as probe:
            row = probe.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        count = int(row[0]) if row is not None else 0
        if count == expected or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


async def asessions(url: str, *, expected: int = 0, within: float = 5.0) -> int:
    """``sessions``, from async code (the probe is sync: it runs in a worker thread)."""
    return await asyncio.to_thread(sessions, url, expected=expected, within=within)


def refund_graph(
    saver: Any,
    tmp_path: Path,
    *,
    use_async: bool = False,
    before: Callable[[str], None] | None = None,
) -> Any:
    """The agent, one refund a turn, on ``saver``: the run writes to the ledger
    (``before`` is called as the refund is about to be sent)."""
    log = ExecutionLog(tmp_path / "providers.db")
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE, before=before)
    model = scripted(calls(("refund", "o-1")))
    builder = agent_builder(model, EffectToolNode([refund]), use_async=use_async)
    return cancellable(builder, saver)


def refunded(
    saver: Any, tmp_path: Path, *, before: Callable[[str], None] | None = None
) -> tuple[Any, str]:
    """Run the refund agent on ``saver`` in a new thread and check the run ended with
    the refund committed once; the graph (it holds the saver) and the thread."""
    graph = refund_graph(saver, tmp_path, before=before)
    thread = new_thread()
    out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread))
    assert out["messages"][-1].content == "done"
    assert [e.status.value for e in saver.ledger.effects(thread)] == ["committed"]
    return graph, thread


async def arefunded(
    saver: Any, tmp_path: Path, *, before: Callable[[str], None] | None = None
) -> tuple[Any, str]:
    """``refunded`` for an async saver, run with ``ainvoke``."""
    graph = refund_graph(saver, tmp_path, use_async=True, before=before)
    thread = new_thread()
    out = await graph.ainvoke({"messages": [HumanMessage("go")]}, config_for(thread))
    assert out["messages"][-1].content == "done"
    assert saver.async_ledger is not None
    effects = await saver.async_ledger.aeffects(thread)
    assert [e.status.value for e in effects] == ["committed"]
    return graph, thread


def test_sync_saver_on_the_callers_pool_uses_only_that_pool(pg_url: str, tmp_path: Path) -> None:
    with ConnectionPool(
        pg_url, min_size=1, max_size=POOL_SIZE, kwargs={"autocommit": True}
    ) as pool:
        saver = PostgresCancelSaver(pool)
        saver.setup()
        graph, _ = refunded(saver, tmp_path)
        assert sessions(pg_url, expected=POOL_SIZE + LISTENER) <= POOL_SIZE + LISTENER

    assert sessions(pg_url) == 0
    del graph, saver
    assert sessions(pg_url) == 0


def test_sync_saver_on_one_connection_uses_only_that_connection(
    pg_url: str, tmp_path: Path
) -> None:
    with psycopg.Connection.connect(pg_url, autocommit=True, row_factory=dict_row) as conn:
        saver = PostgresCancelSaver(conn)
        saver.setup()
        assert sessions(pg_url, expected=1) == 1
        graph, _ = refunded(saver, tmp_path)
        assert sessions(pg_url, expected=1 + LISTENER) == 1 + LISTENER

    # The caller closed the connection: the listener ends with it.
    assert sessions(pg_url) == 0
    del graph, saver
    assert sessions(pg_url) == 0


async def test_async_saver_on_the_callers_pool_uses_only_that_pool(
    pg_url: str, tmp_path: Path
) -> None:
    async with AsyncConnectionPool(
        pg_url, min_size=1, max_size=POOL_SIZE, kwargs={"autocommit": True}, open=False
    ) as pool:
        saver = AsyncPostgresCancelSaver(pool)
        await saver.setup()
        assert saver.async_ledger is not None
        graph, _ = await arefunded(saver, tmp_path)
        assert await asessions(pg_url, expected=POOL_SIZE + LISTENER) <= POOL_SIZE + LISTENER

    # Nothing of the saver's own is open, even before the saver goes.
    assert await asessions(pg_url) == 0
    del graph, saver
    assert await asessions(pg_url) == 0


async def test_async_saver_on_one_connection_uses_only_that_connection(
    pg_url: str, tmp_path: Path
) -> None:
    async with await psycopg.AsyncConnection.connect(
        pg_url, autocommit=True, row_factory=dict_row
    ) as conn:
        saver = AsyncPostgresCancelSaver(conn)
        await saver.setup()
        assert saver.async_ledger is not None
        assert await asessions(pg_url, expected=1) == 1
        graph, _ = await arefunded(saver, tmp_path)
        assert await asessions(pg_url, expected=1 + LISTENER) == 1 + LISTENER

    # Nothing of the saver's own is open, even before the saver goes.
    assert await asessions(pg_url) == 0
    del graph, saver
    assert await asessions(pg_url) == 0


def committed_intents(url: str) -> Callable[[str], None]:
    """A check, run as the refund is about to be sent, that its intent is committed:
    another session sees its row (in a pipeline, a write is committed at the sync)."""

    def check(_item: str) -> None:
        with psycopg.connect(url, autocommit=True) as other:
            row = other.execute("SELECT count(*) FROM lgc_effects WHERE tool = 'refund'").fetchone()
        assert row is not None and row[0] == 1, "the refund's intent is not committed"

    return check


@pytest.mark.parametrize("pipe_given", ["when_built", "set_later"])
def test_sync_saver_on_a_pipelined_connection_uses_only_that_connection(
    pg_url: str, tmp_path: Path, pipe_given: str
) -> None:
    with psycopg.Connection.connect(pg_url, autocommit=True, row_factory=dict_row) as conn:
        # LangGraph's migrations cannot run in a pipeline: set up first, as its tests do.
        first = PostgresCancelSaver(conn)
        first.setup()
        with conn.pipeline() as pipe:
            if pipe_given == "when_built":
                saver = PostgresCancelSaver(conn, pipe)
            else:  # LangGraph's own graph tests set the pipeline on a set-up saver
                saver, first.pipe = first, pipe
            assert sessions(pg_url, expected=1) == 1
            graph, thread = refunded(saver, tmp_path, before=committed_intents(pg_url))
            assert sessions(pg_url, expected=1 + LISTENER) == 1 + LISTENER
            # The checkpoints, written through the same pipeline, are all there.
            assert saver.get_tuple(config_for(thread)) is not None

    assert sessions(pg_url) == 0
    del graph, saver, first
    assert sessions(pg_url) == 0


async def test_async_saver_on_a_pipelined_connection_uses_only_that_connection(
    pg_url: str, tmp_path: Path
) -> None:
    async with await psycopg.AsyncConnection.connect(
        pg_url, autocommit=True, row_factory=dict_row
    ) as conn:
        await AsyncPostgresCancelSaver(conn).setup()
        async with conn.pipeline() as pipe:
            saver = AsyncPostgresCancelSaver(conn, pipe)
            await saver.aopen_ledger()
            assert saver.async_ledger is not None
            assert await asessions(pg_url, expected=1) == 1
            graph, thread = await arefunded(saver, tmp_path, before=committed_intents(pg_url))
            assert await asessions(pg_url, expected=1 + LISTENER) == 1 + LISTENER
            assert await saver.aget_tuple(config_for(thread)) is not None

    assert await asessions(pg_url) == 0
    del graph, saver
    assert await asessions(pg_url) == 0


def probe_rows(url: str) -> list[int]:
    """The ``probe`` table's values, as another session sees them."""
    with psycopg.connect(url, autocommit=True) as other:
        return [row[0] for row in other.execute("SELECT n FROM probe ORDER BY n").fetchall()]


def test_a_ledger_use_of_a_pipelined_connection_commits_alone_and_at_once(pg_url: str) -> None:
    with psycopg.Connection.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE probe (n INTEGER PRIMARY KEY)")
        with conn.pipeline():
            backend = PostgresBackend(conn, lock=threading.Lock())
            with backend.transaction() as cur:
                cur.execute("INSERT INTO probe VALUES (1)")
            assert probe_rows(pg_url) == [1]
            with backend.statement() as cur:
                cur.execute("INSERT INTO probe VALUES (2)")
            assert probe_rows(pg_url) == [1, 2]
            # The caller's statement, not synced yet, is not rolled back with a
            # ledger transaction that fails, and the pipeline stays usable.
            conn.execute("INSERT INTO probe VALUES (3)")
            with pytest.raises(psycopg.errors.UniqueViolation), backend.transaction() as cur:
                cur.execute("INSERT INTO probe VALUES (4)")
                cur.execute("INSERT INTO probe VALUES (1)")
            assert probe_rows(pg_url) == [1, 2, 3]
            conn.execute("INSERT INTO probe VALUES (5)")
            with pytest.raises(psycopg.errors.UniqueViolation), backend.statement() as cur:
                cur.execute("INSERT INTO probe VALUES (1)")
            assert probe_rows(pg_url) == [1, 2, 3, 5]
            conn.execute("INSERT INTO probe VALUES (6)")
        assert probe_rows(pg_url) == [1, 2, 3, 5, 6]


async def test_an_async_ledger_use_of_a_pipelined_connection_commits_alone_and_at_once(
    pg_url: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE probe (n INTEGER PRIMARY KEY)")
        async with conn.pipeline():
            backend = AsyncPostgresBackend(conn, conninfo=pg_url)
            async with backend.transaction() as cur:
                await cur.execute("INSERT INTO probe VALUES (1)")
            assert await asyncio.to_thread(probe_rows, pg_url) == [1]
            async with backend.statement() as cur:
                await cur.execute("INSERT INTO probe VALUES (2)")
            assert await asyncio.to_thread(probe_rows, pg_url) == [1, 2]
            await conn.execute("INSERT INTO probe VALUES (3)")
            with pytest.raises(psycopg.errors.UniqueViolation):
                async with backend.transaction() as cur:
                    await cur.execute("INSERT INTO probe VALUES (4)")
                    await cur.execute("INSERT INTO probe VALUES (1)")
            assert await asyncio.to_thread(probe_rows, pg_url) == [1, 2, 3]
            await conn.execute("INSERT INTO probe VALUES (5)")
            with pytest.raises(psycopg.errors.UniqueViolation):
                async with backend.statement() as cur:
                    await cur.execute("INSERT INTO probe VALUES (1)")
            assert await asyncio.to_thread(probe_rows, pg_url) == [1, 2, 3, 5]
            await conn.execute("INSERT INTO probe VALUES (6)")
        assert await asyncio.to_thread(probe_rows, pg_url) == [1, 2, 3, 5, 6]


def test_a_pipelined_saver_that_used_its_ledger_lets_the_database_go(pg_url: str) -> None:
    """LangGraph's prune tests on a pipeline: delete threads (checkpoints and ledger
    rows), close the connection, drop the database at once."""
    database = f"lgc_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")
    url = pg_url.rsplit("/", 1)[0] + "/" + database
    try:
        with (
            psycopg.Connection.connect(url, autocommit=True, row_factory=dict_row) as conn,
        ):
            PostgresCancelSaver(conn).setup()
            with conn.pipeline() as pipe:
                saver = PostgresCancelSaver(conn, pipe)
                saver.prune([new_thread()], strategy="delete")
            assert sessions(url, expected=1) == 1
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {database}")


async def test_an_async_pipelined_saver_that_used_its_ledger_lets_the_database_go(
    pg_url: str,
) -> None:
    """The same, async, with the pipelined saver never set up itself (LangGraph's tests
    set up another saver on the connection first)."""
    database = f"lgc_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {database}")
    url = pg_url.rsplit("/", 1)[0] + "/" + database
    try:
        async with await psycopg.AsyncConnection.connect(
            url, autocommit=True, row_factory=dict_row
        ) as conn:
            await AsyncPostgresCancelSaver(conn).setup()
            async with conn.pipeline() as pipe:
                saver = AsyncPostgresCancelSaver(conn, pipe)
                await saver.aprune([new_thread()], strategy="delete")
                await saver.adelete_thread(new_thread())
                assert await asessions(url, expected=1) == 1
    finally:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE {database}")


def test_a_saver_only_set_up_holds_nothing_once_its_connection_closes(pg_url: str) -> None:
    """LangGraph's own saver tests: set up on one connection, use the checkpoints,
    close the connection, drop the database at once."""
    database = f"lgc_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")
    url = pg_url.rsplit("/", 1)[0] + "/" + database
    try:
        with psycopg.Connection.connect(url, autocommit=True, row_factory=dict_row) as conn:
            saver = PostgresCancelSaver(conn)
            saver.setup()
            assert saver.list(None) is not None and sessions(url, expected=1) == 1
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {database}")


async def test_an_async_saver_only_set_up_holds_nothing_once_its_connection_closes(
    pg_url: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(
        pg_url, autocommit=True, row_factory=dict_row
    ) as conn:
        saver = AsyncPostgresCancelSaver(conn)
        await saver.setup()
        assert await saver.aget_tuple(config_for(new_thread())) is None
    assert await asessions(pg_url, within=0.5) == 0


def test_a_pool_not_opened_yet_is_not_taken_for_closed(pg_url: str) -> None:
    pool: ConnectionPool[Any] = ConnectionPool(pg_url, min_size=1, open=False)
    handle = CallersHandle(pool)
    assert pool.closed and not handle.closed  # still to come
    pool.open()
    assert not handle.closed
    pool.close()
    assert handle.closed
    # Seen open when it was handed over, closed since: closed.
    with ConnectionPool(pg_url, min_size=1) as opened:
        later = CallersHandle(opened)
    assert later.closed


@pytest.mark.parametrize("pipelined", [False, True], ids=["plain", "pipelined"])
def test_a_saver_whose_one_connection_drops_raises_a_typed_error(
    pg_url: str, pipelined: bool
) -> None:
    with psycopg.Connection.connect(pg_url, autocommit=True, row_factory=dict_row) as conn:
        PostgresCancelSaver(conn).setup()
        row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
        assert row is not None
        with contextlib.ExitStack() as stack:
            pipe = stack.enter_context(conn.pipeline()) if pipelined else None
            saver = PostgresCancelSaver(conn, pipe)
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (row["pid"],))
            with pytest.raises(TransientDatabaseError, match="database unavailable"):
                saver.ledger.start_run(new_thread())
            # Not ending the caller's pipeline block: on a lost connection it raises
            # psycopg's error, the caller's own (as with LangGraph's saver alone).
            stack.pop_all()

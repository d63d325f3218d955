"""A PostgreSQL saver built on the caller's pool or connection leaves no session behind.

LangGraph's savers use the pool or connection they are given, and the caller closes
it. Ours add the ledger: on the caller's pool the ledger shares it (the async ledger
too), and its cancel listener ends when the pool is closed; on one connection it
opens a small pool of its own, empty until used, closed with the saver (the sync
saver's as soon as the caller closes the connection, by its listener). So a saver
made per request, or a test that drops its database once the pool it gave the saver
is closed (LangGraph's own fixtures do), finds no session of ours left on the server.
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

import psycopg
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
    while True:
        gc.collect()
        with psycopg.connect(url, autocommit=True) as probe:
            row = probe.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        count = int(row[0]) if row is not None else 0
        if count == expected or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def refund_graph(saver: Any, tmp_path: Path, *, use_async: bool = False) -> Any:
    """The agent, one refund a turn, on ``saver``: the run writes to the ledger."""
    log = ExecutionLog(tmp_path / "providers.db")
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "o-1")))
    builder = agent_builder(model, EffectToolNode([refund]), use_async=use_async)
    return cancellable(builder, saver)


def test_sync_saver_on_the_callers_pool_uses_only_that_pool(pg_url: str, tmp_path: Path) -> None:
    with ConnectionPool(
        pg_url, min_size=1, max_size=POOL_SIZE, kwargs={"autocommit": True}
    ) as pool:
        saver = PostgresCancelSaver(pool)
        saver.setup()
        graph = refund_graph(saver, tmp_path)
        out = graph.invoke({"messages": [HumanMessage("go")]}, config_for(new_thread()))
        assert out["messages"][-1].content == "done"
        assert sessions(pg_url, expected=POOL_SIZE + LISTENER) <= POOL_SIZE + LISTENER

    assert sessions(pg_url) == 0
    del graph, saver
    assert sessions(pg_url) == 0


def test_sync_saver_on_one_connection_closes_its_ledger_pool_with_it(
    pg_url: str, tmp_path: Path
) -> None:
    with psycopg.Connection.connect(pg_url, autocommit=True, row_factory=dict_row) as conn:
        saver = PostgresCancelSaver(conn)
        # Opened empty: the saver holds nothing before its ledger is used.
        assert sessions(pg_url, expected=1) == 1
        saver.setup()
        graph = refund_graph(saver, tmp_path)
        thread = new_thread()
        graph.invoke({"messages": [HumanMessage("go")]}, config_for(thread))
        assert [e.status.value for e in saver.ledger.effects(thread)] == ["committed"]

    # The caller closed the connection: the ledger's pool and listener end with it.
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
        graph = refund_graph(saver, tmp_path, use_async=True)
        thread = new_thread()
        out = await graph.ainvoke({"messages": [HumanMessage("go")]}, config_for(thread))
        assert out["messages"][-1].content == "done"
        assert [e.status.value for e in await saver.async_ledger.aeffects(thread)] == ["committed"]
        in_use = await asyncio.to_thread(sessions, pg_url, expected=POOL_SIZE + LISTENER)
        assert in_use <= POOL_SIZE + LISTENER

    # Nothing of the saver's own is open, even before the saver goes.
    assert await asyncio.to_thread(sessions, pg_url) == 0
    del graph, saver
    assert await asyncio.to_thread(sessions, pg_url) == 0


async def test_async_saver_on_one_connection_closes_its_ledger_with_it(
    pg_url: str, tmp_path: Path
) -> None:
    async with await psycopg.AsyncConnection.connect(
        pg_url, autocommit=True, row_factory=dict_row
    ) as conn:
        saver = AsyncPostgresCancelSaver(conn)
        await saver.setup()
        graph = refund_graph(saver, tmp_path, use_async=True)
        thread = new_thread()
        await graph.ainvoke({"messages": [HumanMessage("go")]}, config_for(thread))
        assert [e.status.value for e in saver.ledger.effects(thread)] == ["committed"]

    # The async ledger's own pool goes with the saver, closed on the loop it was opened on.
    del graph, saver
    gc.collect()
    await asyncio.sleep(0.2)
    assert await asyncio.to_thread(sessions, pg_url) == 0


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

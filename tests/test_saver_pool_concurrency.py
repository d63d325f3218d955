"""A PostgreSQL saver on a pool lets a process's runs use the pool side by side.

LangGraph's PostgreSQL savers hold one lock per saver around every checkpoint read
and write. A single connection needs it; on a pool each use takes a connection of
its own, and the lock would only queue the runs of a process behind one another.
Ours drop it on a pool and keep it on a connection.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from graphs import config_for, new_thread
from langgraph_cancel.checkpointers.postgres import (
    AsyncPostgresCancelSaver,
    PostgresCancelSaver,
)
from test_saver_connections import arefunded, refunded

#: Long enough for any use of the database here; only a test that fails waits it out.
HOLD_AT_MOST = 30.0
POOL_KWARGS = {"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0}


def holds_while_read(saver: PostgresCancelSaver) -> bool:
    """Keep one of the saver's cursors open in another thread while this thread reads a
    checkpoint: True when the read finished before that cursor was let go (a read
    queued behind it finishes only once the other thread gives up waiting)."""
    opened, read = threading.Event(), threading.Event()
    outcome: list[bool] = []

    def hold() -> None:
        with saver._cursor() as cursor:
            cursor.execute("SELECT 1")
            opened.set()
            outcome.append(read.wait(HOLD_AT_MOST))

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert opened.wait(HOLD_AT_MOST)
        assert saver.get_tuple(config_for(new_thread())) is None
        read.set()
    finally:
        read.set()
        holder.join(HOLD_AT_MOST)
    return outcome == [True]


def test_sync_saver_on_a_pool_reads_while_another_use_is_open(pg_url: str) -> None:
    with ConnectionPool(pg_url, min_size=2, max_size=2, kwargs=POOL_KWARGS) as pool:
        saver = PostgresCancelSaver(pool)
        saver.setup()
        assert holds_while_read(saver)


def test_sync_saver_on_one_connection_keeps_its_uses_one_at_a_time(pg_url: str) -> None:
    with PostgresCancelSaver.from_conn_string(pg_url) as saver:
        saver.setup()
        entered = threading.Event()
        release = threading.Event()

        def hold() -> None:
            with saver._cursor():
                entered.set()
                release.wait(HOLD_AT_MOST)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert entered.wait(HOLD_AT_MOST)
            # The connection is in use: the saver's lock is held, a second use waits.
            assert saver.lock.acquire(blocking=False) is False
        finally:
            release.set()
            holder.join(HOLD_AT_MOST)


def test_sync_runs_on_one_pooled_saver_run_side_by_side(pg_url: str, tmp_path: Path) -> None:
    """Six runs of the refund agent at once on one saver and a pool of three: each ends
    with its refund committed once."""
    with ConnectionPool(pg_url, min_size=1, max_size=3, kwargs=POOL_KWARGS) as pool:
        saver = PostgresCancelSaver(pool)
        saver.setup()
        failures: list[BaseException] = []

        def run(index: int) -> None:
            try:
                directory = tmp_path / f"run-{index}"
                directory.mkdir()
                refunded(saver, directory)
            except BaseException as exc:  # reported below, from the test's thread
                failures.append(exc)

        runners = [threading.Thread(target=run, args=(index,)) for index in range(6)]
        for runner in runners:
            runner.start()
        for runner in runners:
            runner.join(120)
        assert not failures, failures
        assert not any(runner.is_alive() for runner in runners)


async def test_async_saver_on_a_pool_reads_while_another_use_is_open(pg_url: str) -> None:
    async with AsyncConnectionPool(
        pg_url, min_size=2, max_size=2, kwargs=POOL_KWARGS, open=False
    ) as pool:
        saver = AsyncPostgresCancelSaver(pool)
        await saver.setup()
        opened, read = asyncio.Event(), asyncio.Event()

        async def hold() -> bool:
            async with saver._cursor() as cursor:
                await cursor.execute("SELECT 1")
                opened.set()
                try:
                    await asyncio.wait_for(read.wait(), HOLD_AT_MOST)
                except TimeoutError:
                    return False
                return True

        holder = asyncio.create_task(hold())
        await asyncio.wait_for(opened.wait(), HOLD_AT_MOST)
        assert await saver.aget_tuple(config_for(new_thread())) is None
        read.set()
        assert await holder


async def test_async_runs_on_one_pooled_saver_run_side_by_side(pg_url: str, tmp_path: Path) -> None:
    async with AsyncConnectionPool(
        pg_url, min_size=1, max_size=3, kwargs=POOL_KWARGS, open=False
    ) as pool:
        saver = AsyncPostgresCancelSaver(pool)
        await saver.setup()
        directories = [tmp_path / f"run-{index}" for index in range(6)]
        for directory in directories:
            directory.mkdir()
        await asyncio.gather(*(arefunded(saver, directory) for directory in directories))

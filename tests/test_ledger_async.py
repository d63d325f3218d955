"""The sync ledger tests, run against the async ledger on every backend.

Each sync test of ``test_ledger.py`` and ``test_ledger_runs.py`` is collected here
too, with ``ledger`` an ``AsyncLedger`` behind the sync method names
(``BlockingAsyncLedger``): the same assertions hold for both ledgers, which share
their statements and decisions. The tests of the async methods themselves are in
``test_ledger_runs.py`` (both ledgers); cancel notices (``LISTEN``) on the async
connection and retries on new connections are here.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Iterator
from typing import Any, cast

import pytest

import test_ledger
import test_ledger_runs
from langgraph_cancel.errors import LedgerError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import AsyncLedger
from langgraph_cancel.ledger.aio_backends import AsyncMemoryBackend, AsyncSqliteBackend
from langgraph_cancel.ledger.aio_postgres import AsyncPostgresBackend
from ledger_util import BlockingAsyncLedger, terminate_other_connections

SYNC_TESTS: dict[str, Any] = {
    name: test
    for module in (test_ledger, test_ledger_runs)
    for name, test in vars(module).items()
    if name.startswith("test_") and not inspect.iscoroutinefunction(test)
}
globals().update(SYNC_TESTS)


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    """The async ledger on ``db_url``, answering the sync ledger's method names."""
    blocking = BlockingAsyncLedger(db_url)
    try:
        # The tests are typed against Ledger; the stand-in answers the same names.
        yield cast(Ledger, blocking)
    finally:
        blocking.close()


def test_every_sync_ledger_test_is_collected_here() -> None:
    assert len(SYNC_TESTS) >= 20
    for name in SYNC_TESTS:
        assert callable(globals()[name])


def test_the_stand_in_is_the_async_ledger(ledger: Ledger, db_url: str) -> None:
    blocking = cast(BlockingAsyncLedger, ledger)
    expected = {
        "memory": AsyncMemoryBackend,
        "sqlite": AsyncSqliteBackend,
        "postgresql": AsyncPostgresBackend,
    }[db_url.split(":", 1)[0]]
    assert isinstance(blocking.async_ledger.backend, expected)
    run = ledger.start_run("t-stand-in")
    assert blocking.run(blocking.async_ledger.aget_run(run.run_id)) == run


async def test_cancel_notices_arrive_on_an_async_connection(pg_url: str) -> None:
    async with (
        await AsyncLedger.from_url(pg_url) as listening,
        await AsyncLedger.from_url(pg_url) as requesting,
    ):
        heard: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

        async def listen() -> None:
            async for notice in listening.alisten_cancels():
                await heard.put(notice)

        task = asyncio.create_task(listen())
        try:
            # The listener's LISTEN lands at some point after the task starts: ask for
            # cancels on fresh threads until one is heard, and it must be that one.
            for attempt in range(50):
                run = await requesting.astart_run(f"t-notify-{attempt}")
                answer = await requesting.arequest_cancel(
                    run.thread_id, reason="stop", requested_by="ops"
                )
                assert answer.first
                try:
                    notice = await asyncio.wait_for(heard.get(), timeout=0.2)
                except TimeoutError:
                    continue
                assert notice == (run.thread_id, run.run_id)
                break
            else:
                pytest.fail("no cancel notice arrived on the async connection")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_cancel_notices_need_postgres() -> None:
    async with await AsyncLedger.from_url("memory://") as ledger:
        with pytest.raises(LedgerError, match="PostgreSQL"):
            async for _ in ledger.alisten_cancels():
                pass


async def test_killed_connections_are_retried_on_new_ones(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with await AsyncLedger.from_url(pg_url) as ledger:
        run = await ledger.astart_run("t-killed")
        killed = await asyncio.to_thread(terminate_other_connections, pg_url)
        assert killed >= 1
        with caplog.at_level(logging.WARNING, logger="langgraph_cancel.ledger"):
            assert await ledger.aget_run(run.run_id) == run
            record, created = await ledger.aplan(
                thread_id="t-killed", run_id=run.run_id, tool_call_id="c1", tool="t",
                kind="irreversible", args={"n": 1},
            )  # fmt: skip
        assert created
        assert any("Retrying" in r.getMessage() for r in caplog.records)
        assert [h.to_status.value for h in await ledger.ahistory(record.effect_id)] == ["planned"]

"""On PostgreSQL a leased run's start and its end are one statement each.

The start takes the thread's lease, writes the run when the lease is ours and tells
whether the thread has unsettled effects, which a second read fetches only when there
are some; the end finishes the run and gives the lease back. Every statement the
ledger's psycopg cursors run is counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import AsyncLedger
from langgraph_cancel.types import EffectKind, EffectStatus, NewEffect, RunStatus
from ledger_util import new_id


@pytest.fixture
def pg_ledger(pg_url: str) -> Iterator[Ledger]:
    with Ledger.from_url(pg_url) as ledger:
        yield ledger


@pytest.fixture
def executed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every statement psycopg's sync cursors run from now on."""
    seen: list[str] = []
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(" ".join(str(query).split()))
        return execute(self, query, *args, **kwargs)

    def counted_executemany(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(" ".join(str(query).split()))
        return executemany(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted_execute)
    monkeypatch.setattr(psycopg.Cursor, "executemany", counted_executemany)
    return seen


def test_a_new_leased_run_is_one_statement(pg_ledger: Ledger, executed: list[str]) -> None:
    thread = new_id("t")
    run, unsettled = pg_ledger.start_run_and_unsettled(thread, owner="w1", lease_ttl=30)
    assert len(executed) == 1, executed
    assert run.status is RunStatus.RUNNING and run.thread_id == thread and run.owner == "w1"
    assert unsettled == []
    lease = pg_ledger.lease(thread)
    assert lease is not None and lease.owner == "w1"
    assert [r.run_id for r in pg_ledger.runs(thread)] == [run.run_id]


def test_the_unsettled_effects_are_read_only_when_the_thread_has_some(
    pg_ledger: Ledger, executed: list[str]
) -> None:
    thread = new_id("t")
    first = pg_ledger.start_run(thread, owner="w1", lease_ttl=30)
    (entry,) = pg_ledger.plan_many(
        thread_id=thread,
        run_id=first.run_id,
        items=[
            NewEffect(
                tool_call_id="c1", tool="refund", kind=EffectKind.IRREVERSIBLE, args={"amount": 5}
            )
        ],
    )
    assert isinstance(entry, tuple)
    left, created = entry
    assert created and left.status is EffectStatus.PLANNED
    assert pg_ledger.finish_run(first.run_id, RunStatus.FAILED, release_lease="w1")
    executed.clear()
    run, unsettled = pg_ledger.start_run_and_unsettled(thread, owner="w1", lease_ttl=30)
    assert len(executed) == 2, executed
    assert run.run_id != first.run_id and run.status is RunStatus.RUNNING
    assert [e.effect_id for e in unsettled] == [left.effect_id]


def test_new_input_on_a_thread_with_a_live_run_gets_that_run(
    pg_ledger: Ledger, executed: list[str]
) -> None:
    thread = new_id("t")
    live = pg_ledger.start_run(thread, owner="w1", lease_ttl=30)
    executed.clear()
    again, unsettled = pg_ledger.start_run_and_unsettled(thread, owner="w1", lease_ttl=30)
    assert len(executed) == 2, executed  # the start, then the live run read
    assert again.run_id == live.run_id and unsettled == []
    assert len(pg_ledger.runs(thread)) == 1


def test_a_lease_held_elsewhere_refuses_the_start_and_writes_no_run(pg_ledger: Ledger) -> None:
    thread = new_id("t")
    held = pg_ledger.start_run(thread, owner="w1", lease_ttl=30)
    with pytest.raises(ThreadBusyError):
        pg_ledger.start_run_and_unsettled(thread, owner="w2", lease_ttl=30)
    assert [r.run_id for r in pg_ledger.runs(thread)] == [held.run_id]
    lease = pg_ledger.lease(thread)
    assert lease is not None and lease.owner == "w1"


def test_a_finish_that_gives_the_lease_back_is_one_statement(
    pg_ledger: Ledger, executed: list[str]
) -> None:
    thread = new_id("t")
    run = pg_ledger.start_run(thread, owner="w1", lease_ttl=30)
    executed.clear()
    assert pg_ledger.finish_run(run.run_id, RunStatus.COMPLETED, release_lease="w1")
    assert len(executed) == 1, executed
    assert pg_ledger.lease(thread) is None
    assert pg_ledger.get_run(run.run_id).status is RunStatus.COMPLETED
    # A finish that does not end the run (already over) gives nothing back.
    pg_ledger.acquire_lease(thread, "w1", ttl=30)
    assert not pg_ledger.finish_run(run.run_id, RunStatus.COMPLETED, release_lease="w1")
    assert pg_ledger.lease(thread) is not None


async def test_the_async_twin_starts_and_finishes_a_run_in_one_statement_each(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    execute = psycopg.AsyncCursor.execute

    async def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(" ".join(str(query).split()))
        return await execute(self, query, *args, **kwargs)

    async with await AsyncLedger.from_url(pg_url) as ledger:
        thread = new_id("t")
        monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted_execute)
        run, unsettled = await ledger.astart_run_and_unsettled(thread, owner="w1", lease_ttl=30)
        assert len(seen) == 1 and unsettled == [], seen
        assert await ledger.afinish_run(run.run_id, RunStatus.COMPLETED, release_lease="w1")
        assert len(seen) == 2, seen
        monkeypatch.undo()
        assert await ledger.alease(thread) is None
        assert (await ledger.aget_run(run.run_id)).status is RunStatus.COMPLETED

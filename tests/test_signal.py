"""The cancel signal's poll: level-triggered, one database read per interval.

A batch's calls all ask "cancelled?" as they start; however many ask at once,
one of them reads the run row and the rest take the last answer.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig

from langgraph_cancel.ledger import Ledger
from langgraph_cancel.runtime import CancelSignal
from ledger_util import new_id


def _counting(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = ledger.get_run

    def get_run(run_id: str) -> Any:
        reads.append(run_id)
        return real(run_id)

    monkeypatch.setattr(ledger, "get_run", get_run)
    return reads


def test_a_batch_asking_at_once_costs_one_read(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = ledger.start_run(new_id("t"))
    signal = CancelSignal(ledger, run.run_id, poll_interval=60.0)
    reads = _counting(ledger, monkeypatch)
    hops: list[object] = []
    real_to_thread = asyncio.to_thread

    async def to_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        # As when the batch's tools keep the worker threads busy: the poll starts late.
        await asyncio.sleep(0.01)
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)

    async def batch() -> list[bool]:
        return await asyncio.gather(*(signal.acancel_called() for _ in range(50)))

    assert asyncio.run(batch()) == [False] * 50
    assert len(reads) == 1 and len(hops) == 1
    # Within the interval the answer stands, without a read.
    assert signal.cancel_called is False and len(reads) == 1


def test_threads_asking_at_once_cost_one_read(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = ledger.start_run(new_id("t"))
    signal = CancelSignal(ledger, run.run_id, poll_interval=60.0)
    reads = _counting(ledger, monkeypatch)
    start = threading.Barrier(8)
    answers: list[bool] = []

    def ask() -> None:
        start.wait()
        answers.append(signal.cancel_called)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [False] * 8 and len(reads) == 1


def test_a_requested_cancel_is_seen_at_the_next_due_poll_and_stays_seen(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = new_id("t")
    run = ledger.start_run(thread)
    signal = CancelSignal(ledger, run.run_id, poll_interval=0.0)
    assert signal.cancel_called is False
    ledger.request_cancel(thread, reason="user pressed stop", requested_by="test")
    assert asyncio.run(signal.acancel_called()) is True
    reads = _counting(ledger, monkeypatch)
    assert signal.cancel_called is True and asyncio.run(signal.acancel_called()) is True
    assert reads == []  # level-triggered: once up, the flag answers


def test_invocation_scope_is_the_one_scope_for_returns_found_without_io(
    tmp_path: Any,
) -> None:
    from langgraph_cancel.runtime import (
        CONFIG_KEY_LEDGER,
        current_scope,
        invocation_scope,
        scope_for,
    )

    ledger = Ledger.from_url(f"sqlite:///{tmp_path}/a.db")
    other = Ledger.from_url(f"sqlite:///{tmp_path}/b.db")
    try:
        cfg: RunnableConfig = {"configurable": {"thread_id": "t1", CONFIG_KEY_LEDGER: ledger}}
        assert invocation_scope(cfg) is None  # outside an invocation
        scope = scope_for(cfg)
        token = current_scope.set(scope)
        try:
            assert invocation_scope(cfg) is scope is scope_for(cfg, new_run=False)
            by_url: RunnableConfig = {
                "configurable": {"thread_id": "t1", CONFIG_KEY_LEDGER: ledger.url}
            }
            assert invocation_scope(by_url) is scope
            # Another thread, or a node bound to another ledger: not this scope.
            assert (
                invocation_scope({"configurable": {"thread_id": "t2", CONFIG_KEY_LEDGER: ledger}})
                is None
            )
            assert invocation_scope(cfg, other) is None
            assert invocation_scope(cfg, other.url) is None
        finally:
            current_scope.reset(token)
    finally:
        ledger.close()
        other.close()

"""A sweeper that runs for long outlives its database going away.

``langgraph-cancel sweep --watch`` opens its PostgreSQL saver on a pool that checks
its connections, so the checkpoint reads and writes of its closes work again once the
server is back; and ``Sweeper.run`` goes on after a pass that raised.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from graphs import new_thread
from langgraph_cancel.cli.config import resolve_database
from langgraph_cancel.cli.database import open_saver
from langgraph_cancel.sweeper import Sweeper, SweepSummary, watch
from langgraph_cancel.urls import parse_database_url
from ledger_util import terminate_other_connections


def test_the_commands_postgres_saver_outlives_its_connections_terminated(pg_url: str) -> None:
    thread = new_thread()
    with open_saver(resolve_database(parse_database_url(pg_url))) as saver:
        config: Any = {"configurable": {"thread_id": thread}}
        assert saver.get_tuple(config) is None
        saver.ledger.start_run(thread, owner="worker")
        assert terminate_other_connections(pg_url) >= 1
        # One connection, as ``from_conn_string`` gives, would be closed for good here.
        assert saver.get_tuple(config) is None
        assert list(saver.list(config)) == []
        run = saver.ledger.latest_run(thread)
        assert run is not None and run.owner == "worker"


def test_a_watching_sweeper_goes_on_after_a_pass_that_failed(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sweeper = Sweeper(sqlite_url, owner="sweeper")
    passes = 0
    sweep_once = sweeper.sweep_once

    def gone_once() -> SweepSummary:
        nonlocal passes
        passes += 1
        if passes == 1:
            raise ConnectionError("the database went away")
        return sweep_once()

    monkeypatch.setattr(sweeper, "sweep_once", gone_once)
    with caplog.at_level(logging.WARNING, logger="langgraph_cancel.sweeper"):
        summaries = watch(sweeper, interval=0.01, passes=1)
    assert passes == 2
    assert len(summaries) == 1 and summaries[0].sweeper == "sweeper"
    failed = [r for r in caplog.records if "sweep pass failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None

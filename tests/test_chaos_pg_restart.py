"""PostgreSQL restarted (``pg_ctl restart``) in the middle of a run (chaos).

The agent works through slow side-effecting calls against the fake providers
while the database server is restarted under it: while a call is at the
provider (it applied, the ledger has not recorded the outcome yet), or while
the model writes a turn. Every connection the run holds dies.

Allowed outcomes: the run retries and continues (the ledger's writes retry
transient faults; a saver on a checking pool reconnects), or the invocation
fails with a clear, typed database error (``psycopg.OperationalError``, a pool
timeout, ``TransientDatabaseError``, or ``CheckpointNotSavedError`` caused by one:
a side effect whose step's checkpoint could not be saved is not dispatched). Never
another exception, and never a
lost effect: once the server is back, a fresh process-like view of the
database knows every call the providers applied (I7), a resume completes the
run, no idempotency key was applied twice (I2), every effect is settled or
unknown with an owner (I3), and I1-I6 hold against the providers' truth.
"""

from __future__ import annotations

import os
import threading
import traceback
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from psycopg_pool import PoolTimeout

from chaos_harness import (
    CallSpec,
    Plan,
    Runner,
    check_invariants,
    check_persisted_state_answers,
    open_saver,
)
from conftest import PgServer
from langgraph_cancel import EffectStatus
from langgraph_cancel.errors import CheckpointNotSavedError, TransientDatabaseError
from langgraph_cancel.types import RunStatus

pytestmark = [pytest.mark.postgres]

#: The errors a run may fail with while its database restarts: typed, and about the database.
DATABASE_ERRORS = (psycopg.OperationalError, PoolTimeout, TransientDatabaseError)

C = CallSpec
#: Seven slow calls in two turns: emails, tickets, a refund, a read.
PLAN = Plan(
    turns=(
        (C("cx_email"), C("cx_ticket"), C("cx_email"), C("cx_refund"), C("cx_lookup")),
        (C("cx_email"), C("cx_ticket")),
    ),
)
SLOW = 0.25


def _ledger_gave_up(error: BaseException) -> list[str]:
    """Frames of our ledger in the error's traceback (its writes must retry a restart)."""
    return [
        f"{f.filename}:{f.lineno} {f.name}"
        for f in traceback.extract_tb(error.__traceback__)
        if f"langgraph_cancel{os.sep}ledger{os.sep}" in f.filename
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("saver_kind", ["postgres", "postgres-pool"], ids=["connection", "pool"])
@pytest.mark.parametrize(
    "when",
    [
        # The call applied at the provider; the ledger records its outcome after the restart.
        ("tool", 2, "after", True),
        # The server goes down while the batch's calls are being dispatched and recorded.
        ("tool", 1, "before", False),
        # The model is writing the second turn.
        ("turn", 1, "", True),
    ],
    ids=["call-at-provider", "during-dispatches", "model-turn"],
)
def test_postgres_restart_mid_run(
    pg_server: PgServer,
    pg_url: str,
    tmp_path: Path,
    saver_kind: str,
    when: tuple[str, int, str, bool],
) -> None:
    point, wait = when[:3], when[3]
    restarts: list[threading.Thread] = []
    lock = threading.Lock()

    def restart_once(kind: str, at: int, phase: str) -> None:
        with lock:
            if restarts or (kind, at, phase) != point:
                return
            restarter = threading.Thread(target=pg_server.restart, name="pg-restart")
            restarter.start()
            restarts.append(restarter)
        if wait:
            restarter.join()

    error: BaseException | None = None
    with open_saver(saver_kind, tmp_path, pg_url) as saver:
        runner = Runner(PLAN, tmp_path, saver, url=pg_url)
        thread_id = runner.thread_id
        runner.world.delay = SLOW
        runner.world.on_event = restart_once
        try:
            runner.drive({"messages": [HumanMessage("go")]})
        except Exception as exc:  # judged below: only typed database errors may surface
            error = exc
        invocations = runner.world.invocations
    assert restarts, "the server was never restarted: the chaos point was not reached"
    restarts[0].join(120)
    assert pg_server.pid() is not None, "the server did not come back"
    if error is not None:
        typed = error.__cause__ if isinstance(error, CheckpointNotSavedError) else error
        assert isinstance(typed, DATABASE_ERRORS), "".join(traceback.format_exception(error))
        # LangGraph's checkpoint writes do not retry; the ledger's own writes must.
        assert not _ledger_gave_up(error), "".join(traceback.format_exception(error))

    # The server is back. A new saver (new connections), as a new process would open.
    with open_saver(saver_kind, tmp_path, pg_url) as saver:
        runner = Runner(PLAN, tmp_path, saver, url=pg_url, thread_id=thread_id, arm_faults=False)
        runner.world.invocations = invocations
        check_persisted_state_answers(runner)  # I7: nothing the providers did is lost
        run = runner.ledger.latest_run(thread_id)
        assert run is not None
        if not run.terminal:
            runner.drive(None)  # resume the interrupted run from its last checkpoint
        run = runner.ledger.latest_run(thread_id)
        assert run is not None and run.status is RunStatus.COMPLETED, run
        runner.drive({"messages": [HumanMessage("where do things stand?")]})
        check_invariants(runner)
        effects = {e.tool_call_id: e for e in runner.ledger.effects(thread_id)}
        assert sorted(effects) == sorted(f"c{n}" for n in range(7)), sorted(effects)
        for record in effects.values():
            assert record.status is EffectStatus.COMMITTED, (
                record.status,
                record.error,
                record.tool,
            )
        keys = runner.world.providers.truth()["keys"]
        assert all(v["executions"] == 1 for v in keys.values()), keys
        messages: list[Any] = runner.graph.get_state(runner.cfg).values["messages"]
        assert messages[-1].content == "done"

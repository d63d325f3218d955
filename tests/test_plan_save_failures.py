"""A save that never comes, or fails, sends nothing: the tool node's wait for the
checkpoint of the step that asked for a side effect gives up with
``CheckpointNotSavedError`` after ``checkpoint_timeout`` (or at once, when the save
failed), and a call whose intent was written is recorded never sent.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig

from graphs import ExecutionLog, calls, counting_tool, new_thread, scripted
from langgraph_cancel import (
    CheckpointNotSavedError,
    EffectKind,
    EffectStatus,
    EffectToolNode,
)
from langgraph_cancel.checkpointers.durable import PlanCheckpoint
from plan_hold import (
    Hold,
    held_agent,
    held_graph,
    held_saver,
    start_in_thread,
    statuses,
)


@pytest.fixture
def log(tmp_path: Any) -> ExecutionLog:
    return ExecutionLog(str(tmp_path / "providers.db"))


@pytest.mark.parametrize("via", ["node", "middleware"])
def test_a_save_that_never_comes_dispatches_nothing(
    sqlite_url: str, log: ExecutionLog, via: str
) -> None:
    hold = Hold()
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-3", "c1")), "done")
    thread = new_thread()
    with held_saver(sqlite_url, hold) as saver:
        if via == "node":
            node = EffectToolNode([refund], checkpoint_timeout=0.5)
            graph = held_graph(saver, hold, node, model, use_async=False)
        else:
            graph = held_agent(saver, hold, model, [refund], checkpoint_timeout=0.5)
        started = time.monotonic()
        worker, out = start_in_thread(graph, thread, use_async=False)
        assert hold.holding.wait(20)
        # The node gives up after 0.5 s of the default 30; the run ends once the save does.
        # The node plans the call with its intent while the save is held; the
        # middleware's call is planned and waits before its intent.
        waiting = EffectStatus.DISPATCHED if via == "node" else EffectStatus.PLANNED
        deadline = time.monotonic() + 20
        while statuses(saver.ledger, thread).get("refund") is not waiting:
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
    hold = Hold(fail=True)
    refund = counting_tool(log, "refund", EffectKind.IRREVERSIBLE)
    model = scripted(calls(("refund", "r-6", "c1")), "done")
    thread = new_thread()
    with held_saver(sqlite_url, hold) as saver:
        node = EffectToolNode([refund], checkpoint_timeout=20.0)
        graph = held_graph(saver, hold, node, model, use_async=False)
        worker, out = start_in_thread(graph, thread, use_async=False)
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
        assert statuses(saver.ledger, thread)["refund"] is EffectStatus.NOT_APPLIED
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

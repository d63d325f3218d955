"""Which ledger writes may commit before their WAL is on disk, and which never do.

An intent (``dispatched``) must be durable before its call leaves (I1), so its commit
waits for the disk. The planned rows of a batch and the outcome of its last call are
records the protocol survives losing in a database crash (nothing leaves the process
between the plan and the first intent, whose flush covers the plan; a lost outcome
leaves the record dispatched, for reconciliation), so they need not wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from psycopg.rows import dict_row

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
from langgraph_cancel import EffectStatus, EffectToolNode
from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
from langgraph_cancel.errors import DuplicateIdempotencyKeyError, LedgerError
from langgraph_cancel.ledger import Ledger, PostgresBackend
from langgraph_cancel.ledger.flush import commit_before_flush, commits_before_flush
from langgraph_cancel.types import EffectRecord, NewEffect, TransitionRequest


class _WritesSeen(Ledger):
    """The ledger, noting for each batch write whether it may commit before the flush."""

    def __init__(self, backend: PostgresBackend) -> None:
        super().__init__(backend)
        self.seen: list[tuple[str, tuple[EffectStatus, ...], bool]] = []

    def plan_many(
        self,
        *,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        owner: str | None = None,
        actor: str = "system",
    ) -> list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError]:
        self.seen.append(("plan", (), commits_before_flush()))
        return super().plan_many(
            thread_id=thread_id, run_id=run_id, items=items, owner=owner, actor=actor
        )

    def transition_many(
        self, requests: Sequence[TransitionRequest]
    ) -> list[EffectRecord | LedgerError]:
        targets = tuple(request.to for request in requests)
        self.seen.append(("transition", targets, commits_before_flush()))
        return super().transition_many(requests)


@pytest.fixture
def log(tmp_path: Path) -> ExecutionLog:
    return ExecutionLog(str(tmp_path / "providers.db"))


def test_only_the_plan_and_the_last_outcome_commit_before_the_flush(
    pg_url: str, log: ExecutionLog
) -> None:
    refund = counting_tool(log, "refund")
    model = scripted(calls(("refund", "a"), ("refund", "b"), ("refund", "c")))
    with psycopg.Connection.connect(
        pg_url, autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        ledger = _WritesSeen(PostgresBackend(pg_url, max_size=2))
        try:
            saver = PostgresCancelSaver(conn, ledger=ledger)
            saver.setup()
            graph = cancellable(agent_builder(model, EffectToolNode([refund])), saver)
            thread = new_thread()
            graph.invoke({"messages": [HumanMessage("refund three")]}, config_for(thread))
            effects = ledger.effects(thread)
        finally:
            ledger.close()
    assert sorted(e.status for e in effects) == [EffectStatus.COMMITTED] * 3
    assert log.applied("refund") == 3
    # The batch's one plan, then each outcome beside the next intent, then the last
    # outcome on its own (the first intent goes through ``transition``).
    assert ledger.seen == [
        ("plan", (), True),
        ("transition", (EffectStatus.COMMITTED, EffectStatus.DISPATCHED), False),
        ("transition", (EffectStatus.COMMITTED, EffectStatus.DISPATCHED), False),
        ("transition", (EffectStatus.COMMITTED,), True),
    ]


def test_the_mark_holds_only_inside_its_block() -> None:
    assert not commits_before_flush()
    with commit_before_flush():
        assert commits_before_flush()
        with commit_before_flush():
            assert commits_before_flush()
        assert commits_before_flush()
    assert not commits_before_flush()

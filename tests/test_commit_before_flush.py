"""Which ledger writes may commit before their WAL is on disk, and which never do.

An intent (``dispatched``) must be durable before its call leaves (I1), so its commit
waits for the disk. A run's start, the planned rows of a batch, the outcome of its
last call, the records of its reads and the run's completion need not wait: no side
effect leaves the process on their strength before a later write that waits for the
disk (the next intent, the step's checkpoint) has made them durable, a lost outcome
leaves its record dispatched, for reconciliation, a lost read is read again, and a
lost completion leaves the run live, as a worker that died before writing it does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

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
from langgraph_cancel import EffectKind, EffectStatus, EffectToolNode
from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
from langgraph_cancel.errors import DuplicateIdempotencyKeyError, LedgerError
from langgraph_cancel.ledger import Ledger, PostgresBackend
from langgraph_cancel.ledger.aio_postgres import AsyncPostgresBackend
from langgraph_cancel.ledger.flush import commit_before_flush, commits_before_flush
from langgraph_cancel.testing.fake_model import ScriptedChatModel, tool_call
from langgraph_cancel.types import (
    EffectRecord,
    NewEffect,
    RunRecord,
    RunStatus,
    TransitionRequest,
)


class _WritesSeen(Ledger):
    """The ledger, noting for each batch write whether it may commit before the flush."""

    def __init__(self, backend: PostgresBackend) -> None:
        super().__init__(backend)
        self.seen: list[tuple[str, tuple[EffectStatus, ...], bool]] = []

    def start_run_and_unsettled(
        self,
        thread_id: str,
        *,
        run_id: str | None = None,
        owner: str | None = None,
        parent_run_id: str | None = None,
        lease_ttl: float | None = None,
    ) -> tuple[RunRecord, list[EffectRecord]]:
        self.seen.append(("start", (), commits_before_flush()))
        return super().start_run_and_unsettled(
            thread_id, run_id=run_id, owner=owner, parent_run_id=parent_run_id, lease_ttl=lease_ttl
        )

    def finish_run(
        self,
        run_id: str,
        status: RunStatus | str,
        *,
        report: dict[str, Any] | None = None,
        quiesced_at: datetime | None = None,
        tokens_after_cancel: int | None = None,
        release_lease: str | None = None,
    ) -> bool:
        self.seen.append(("finish", (), commits_before_flush()))
        return super().finish_run(
            run_id,
            status,
            report=report,
            quiesced_at=quiesced_at,
            tokens_after_cancel=tokens_after_cancel,
            release_lease=release_lease,
        )

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

    def plan_many_and_begin(
        self,
        *,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        begin: str | Sequence[str],
        owner: str | None = None,
        actor: str = "system",
    ) -> tuple[list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError], list[EffectRecord]]:
        self.seen.append(("plan and begin", (), commits_before_flush()))
        return super().plan_many_and_begin(
            thread_id=thread_id, run_id=run_id, items=items, begin=begin, owner=owner, actor=actor
        )

    def record_many(
        self,
        *,
        thread_id: str,
        run_id: str,
        items: Sequence[NewEffect],
        owner: str | None = None,
        actor: str = "system",
    ) -> list[DuplicateIdempotencyKeyError | None]:
        self.seen.append(("record", tuple(item.status for item in items), commits_before_flush()))
        return super().record_many(
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


#: A saver on PostgreSQL and its ledger, which notes each write's flush mark.
SeenSaver = tuple[PostgresCancelSaver, _WritesSeen]


@pytest.fixture
def seen(pg_url: str) -> Iterator[SeenSaver]:
    with psycopg.Connection.connect(
        pg_url, autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        ledger = _WritesSeen(PostgresBackend(pg_url, max_size=2))
        try:
            saver = PostgresCancelSaver(conn, ledger=ledger)
            saver.setup()
            yield saver, ledger
        finally:
            ledger.close()


def test_only_the_intents_wait_for_the_flush(seen: SeenSaver, log: ExecutionLog) -> None:
    saver, ledger = seen
    refund = counting_tool(log, "refund")
    model = scripted(calls(("refund", "a"), ("refund", "b"), ("refund", "c")))
    graph = cancellable(agent_builder(model, EffectToolNode([refund])), saver)
    thread = new_thread()
    graph.invoke({"messages": [HumanMessage("refund three")]}, config_for(thread))
    effects = ledger.effects(thread)
    assert sorted(e.status for e in effects) == [EffectStatus.COMMITTED] * 3
    assert log.applied("refund") == 3
    # The run's start, the batch's plan with the first intent (its commit waits: the
    # call leaves right after), then each outcome beside the next intent, then the last
    # outcome on its own, and the run's completion, after the last checkpoint.
    assert ledger.seen == [
        ("start", (), True),
        ("plan and begin", (), False),
        ("transition", (EffectStatus.COMMITTED, EffectStatus.DISPATCHED), False),
        ("transition", (EffectStatus.COMMITTED, EffectStatus.DISPATCHED), False),
        ("transition", (EffectStatus.COMMITTED,), True),
        ("finish", (), True),
    ]


def test_the_records_of_reads_commit_before_the_flush(seen: SeenSaver, log: ExecutionLog) -> None:
    saver, ledger = seen
    lookup = counting_tool(log, "lookup", EffectKind.READ_ONLY)
    refund = counting_tool(log, "refund")
    model = scripted(
        calls(("lookup", "a"), ("lookup", "b")),
        calls(("lookup", "c"), ("refund", "c")),
    )
    graph = cancellable(agent_builder(model, EffectToolNode([lookup, refund])), saver)
    thread = new_thread()
    graph.invoke({"messages": [HumanMessage("look, then refund")]}, config_for(thread))
    effects = ledger.effects(thread)
    assert sorted((e.tool, e.status) for e in effects) == [
        ("lookup", EffectStatus.COMMITTED),
        ("lookup", EffectStatus.COMMITTED),
        ("lookup", EffectStatus.COMMITTED),
        ("refund", EffectStatus.COMMITTED),
    ]
    assert (log.applied("lookup"), log.applied("refund")) == (3, 1)
    # Reads change nothing outside: their records need not wait for the disk, in a
    # batch of reads alone as beside a side effect (the refund's intent, through
    # ``transition``, is not in this list).
    assert ledger.seen == [
        ("start", (), True),
        ("record", (EffectStatus.COMMITTED, EffectStatus.COMMITTED), True),
        ("plan", (), True),
        ("record", (EffectStatus.COMMITTED,), True),
        ("transition", (EffectStatus.COMMITTED,), True),
        ("finish", (), True),
    ]


def test_the_mark_holds_only_inside_its_block() -> None:
    assert not commits_before_flush()
    with commit_before_flush():
        assert commits_before_flush()
        with commit_before_flush():
            assert commits_before_flush()
        assert commits_before_flush()
    assert not commits_before_flush()


# The commit's setting as the statement's own transaction sees it, and the session
# that ran it: a setting of the transaction shows as ``session``, one the server or the
# database gives every session as ``configuration file``, ``database`` or ``default``.
_SETTING = """SELECT setting, source, pg_backend_pid() AS pid
    FROM pg_settings WHERE name = 'synchronous_commit'"""

_Seen = tuple[str, str, int]


def _commit_setting(backend: PostgresBackend, how: str) -> _Seen:
    """(synchronous_commit, where it came from, backend pid) for a statement run ``how``."""
    if how == "pipeline":
        with backend.pipeline() as execute:
            cur = execute(_SETTING, {})
        row = cur.fetchone()
    elif how == "all_rows":
        row = backend.all_rows([(_SETTING, {})])[0][0]
    else:
        opened = backend.statement() if how == "statement" else backend.transaction()
        with opened as cur:
            cur.execute(_SETTING, {})
            row = cur.fetchone()
    assert row is not None
    return str(row["setting"]), str(row["source"]), int(row["pid"])


def _before_inside_after(backend: PostgresBackend, how: str) -> list[_Seen]:
    seen = []
    for inside in (False, True, False):
        with commit_before_flush() if inside else nullcontext():
            seen.append(_commit_setting(backend, how))
    return seen


@pytest.mark.parametrize("how", ["statement", "all_rows", "pipeline", "transaction"])
def test_inside_the_block_a_write_commits_before_the_flush_on_the_same_connection(
    pg_url: str, how: str
) -> None:
    backend = PostgresBackend(pg_url, max_size=1)
    try:
        before, inside, after = _before_inside_after(backend, how)
    finally:
        backend.close()
    assert inside[:2] == ("off", "session")
    # The setting was the transaction's own: the next statement on the same session
    # waits for the disk as the server says. No second pool or session was opened.
    assert before[1] != "session" and after[1] != "session"
    assert before[2] == inside[2] == after[2]


def test_a_write_that_fails_inside_the_block_leaves_the_session_as_it_was(
    pg_url: str,
) -> None:
    backend = PostgresBackend(pg_url, max_size=1)
    try:
        with (
            commit_before_flush(),
            pytest.raises(psycopg.errors.DivisionByZero),
            backend.statement() as cur,
        ):
            cur.execute("SELECT 1 / 0", {})
        source = _commit_setting(backend, "statement")[1]
    finally:
        backend.close()
    assert source != "session"


@pytest.mark.parametrize("how", ["statement", "pipeline"])
def test_on_the_callers_pool_too_a_write_inside_the_block_commits_before_the_flush(
    pg_url: str, how: str
) -> None:
    with ConnectionPool(
        pg_url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=True
    ) as pool:
        before, inside, after = _before_inside_after(PostgresBackend(pool), how)
    assert inside[:2] == ("off", "session")
    assert before[1] != "session" and after[1] != "session"


def test_on_the_callers_connection_too_a_write_inside_the_block_commits_before_the_flush(
    pg_url: str,
) -> None:
    with psycopg.Connection.connect(pg_url, autocommit=True) as conn:
        before, inside, after = _before_inside_after(PostgresBackend(conn), "statement")
    assert inside[:2] == ("off", "session")
    assert before[1] != "session" and after[1] != "session"
    assert before[2] == inside[2] == after[2]


def test_the_async_backend_commits_before_the_flush_inside_the_block(pg_url: str) -> None:
    async def settings(how: str) -> list[_Seen]:
        backend = await AsyncPostgresBackend.open(pg_url, max_size=1)
        seen: list[_Seen] = []
        try:
            for inside in (False, True, False):
                with commit_before_flush() if inside else nullcontext():
                    if how == "statement":
                        async with backend.statement() as cur:
                            await cur.execute(_SETTING, {})
                            row = await cur.fetchone()
                    elif how == "transaction":
                        async with backend.transaction() as cur:
                            await cur.execute(_SETTING, {})
                            row = await cur.fetchone()
                    else:
                        rows = await backend.all_rows([(_SETTING, {}), (_SETTING, {})])
                        row = rows[-1][0]
                assert row is not None
                seen.append((str(row["setting"]), str(row["source"]), int(row["pid"])))
        finally:
            await backend.aclose()
        return seen

    for how in ("statement", "transaction", "pipeline"):
        before, inside, after = asyncio.run(settings(how))
        assert inside[:2] == ("off", "session"), how
        assert before[1] != "session" and after[1] != "session", how
        assert before[2] == inside[2] == after[2], how


class _CountingPipelines(psycopg.Connection[dict[str, Any]]):
    """A connection counting the pipelines opened on it."""

    pipelines = 0

    def pipeline(self) -> Any:
        self.pipelines += 1
        return super().pipeline()


@pytest.mark.parametrize(
    "write",
    ["plan one", "plan two", "record", "transition", "two transitions", "start", "finish"],
)
def test_the_ledgers_writes_before_the_flush_make_the_setting_themselves(
    pg_url: str, write: str
) -> None:
    """Run in the caller's open transaction, a write leaves set what its commit would use:
    the hot writes carry the setting in their own statement (no pipeline), and the same
    writes outside the block leave the server's setting alone."""
    seen: list[tuple[str, int]] = []
    with _CountingPipelines.connect(pg_url, autocommit=True, row_factory=dict_row) as conn:
        ledger = Ledger(PostgresBackend(conn))
        ledger.setup()
        thread = new_thread()
        run_id = ledger.start_run(thread).run_id
        items = [
            NewEffect(
                tool_call_id=f"{write}-{i}", tool="refund", kind=EffectKind.IRREVERSIBLE, args={}
            )
            for i in range(6)
        ]
        planned = ledger.plan_many(
            thread_id=thread, run_id=run_id, items=items[:2], owner="w", actor="w"
        )
        ids = [entry[0].effect_id for entry in planned if isinstance(entry, tuple)]
        for effect_id in ids:
            ledger.transition(effect_id, EffectStatus.DISPATCHED, actor="w")
        leased = [ledger.start_run(new_thread(), owner="w", lease_ttl=30) for _ in range(2)]

        def run(inside: bool) -> None:
            done = [
                TransitionRequest(effect_id=effect_id, to=EffectStatus.COMMITTED, actor="w")
                for effect_id in ids
            ]
            if write.startswith("plan"):
                # One call takes the one-row statement, a batch the row-set statement.
                first = 2 + 2 * inside
                batch = items[first : first + (2 if write == "plan two" else 1)]
                ledger.plan_many(thread_id=thread, run_id=run_id, items=batch, owner="w", actor="w")
            elif write == "record":
                ledger.record_many(
                    thread_id=thread,
                    run_id=run_id,
                    items=[
                        NewEffect(
                            tool_call_id=f"read-{inside}",
                            tool="lookup",
                            kind=EffectKind.READ_ONLY,
                            args={},
                            status=EffectStatus.COMMITTED,
                        )
                    ],
                    owner="w",
                    actor="w",
                )
            elif write == "transition":
                ledger.transition_many(done[inside : inside + 1])
            elif write == "start":
                ledger.start_run_and_unsettled(new_thread(), owner="w", lease_ttl=30)
            elif write == "finish":
                finished = leased[inside].run_id
                assert ledger.finish_run(finished, RunStatus.COMPLETED, release_lease="w")
            else:
                ledger.transition_many(done if inside else [])

        for inside in (False, True):
            with conn.transaction():
                conn.pipelines = 0
                with commit_before_flush() if inside else nullcontext():
                    run(inside)
                row = conn.execute(_SETTING).fetchone()
            assert row is not None
            seen.append((str(row["source"]), conn.pipelines))
    assert seen[0][0] != "session"
    assert seen[1] == ("session", 0)


def test_the_create_agent_middlewares_completion_commits_before_the_flush(
    seen: SeenSaver, log: ExecutionLog
) -> None:
    agents = pytest.importorskip("langchain.agents")
    from langgraph_cancel.middleware import EffectMiddleware

    saver, ledger = seen
    refund = counting_tool(log, "refund")
    model = ScriptedChatModel(
        [AIMessage("", tool_calls=[tool_call("refund", {"item": "a"})]), AIMessage("done")]
    )
    agent = agents.create_agent(
        model, [refund], middleware=[EffectMiddleware(approval=False)], checkpointer=saver
    )
    thread = new_thread()
    out = agent.invoke({"messages": [HumanMessage("refund a")]}, config_for(thread))
    run = ledger.latest_run(thread)
    assert out["messages"][-1].content == "done"
    assert log.applied("refund") == 1
    assert run is not None and run.status is RunStatus.COMPLETED
    finishes = [before_flush for write, _, before_flush in ledger.seen if write == "finish"]
    assert finishes == [True]

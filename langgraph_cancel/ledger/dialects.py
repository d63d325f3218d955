"""What differs between SQLite and PostgreSQL, written once for the sync and async backends.

Each dialect's way of writing an effect (the planning insert, the compare-and-set,
a batch of either), its setup lock and its cancel announcement are operations
(see ``steps.py``) of a mixin the dialect's backends inherit: ``SqliteBackend``
and the async SQLite backends take ``SqliteStatements``, ``PostgresBackend`` and
``AsyncPostgresBackend`` take ``PostgresStatements``. The ledger asks its backend
for them and never branches on the dialect.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Generator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from langgraph_cancel.ledger import decisions
from langgraph_cancel.ledger import sql as ledger_sql
from langgraph_cancel.ledger.decisions import CasJob, CasOutcome
from langgraph_cancel.ledger.flush import commits_before_flush
from langgraph_cancel.ledger.records import effect_record, inserted_record
from langgraph_cancel.ledger.steps import (
    Execute,
    ExecuteMany,
    Operation,
    Pipeline,
    Step,
    Unit,
    in_order,
    nothing,
    read,
    within,
)
from langgraph_cancel.types import (
    EffectRecord,
    EffectStatus,
    NewEffect,
    TransitionRequest,
    utcnow,
)

#: The advisory lock that serializes concurrent ``setup()`` calls of many workers.
SETUP_LOCK_KEY = 7231900118

#: A body run inside an open unit (its steps join the unit's cursor).
Body = Generator[Step, Any, None]

Row = dict[str, Any]

#: What a leased start wrote and read: whether the lease is ours, the run row it
#: created (None when the thread has a live run), the thread's unsettled effects'
#: rows (None unless asked for).
LeasedStart = tuple[bool, Row | None, list[Row] | None]


def json_text(value: Any) -> str:
    """JSON for a JSONB column; what JSON cannot hold is kept as its string.

    Bound as text and cast in the statement (``%(rows)s::jsonb``), a document costs
    psycopg less client time than a ``Jsonb`` wrapper does.
    """
    return json.dumps(value, default=str)


class DialectStatements:
    """The operations whose statements differ between the dialects."""

    if TYPE_CHECKING:  # provided by the backend class the mixin is part of

        def ts_in(self, value: datetime | None) -> Any: ...
        def json_in(self, value: Any) -> Any: ...
        def json_out(self, value: Any) -> Any: ...
        def ts_out(self, value: Any) -> datetime | None: ...

    #: A read that finds a row once the ledger's tables exist.
    has_migrations_sql: str = ledger_sql.SQLITE_HAS_MIGRATIONS

    def lock_for_setup(self) -> Body:
        """Serialize concurrent ``setup()`` calls inside their transaction (a body).

        SQLite's ``BEGIN IMMEDIATE`` already does; PostgreSQL takes a lock.
        """
        return nothing()

    def announce_cancel(self, thread_id: str, run_id: str) -> Body:
        """Tell listeners elsewhere that a cancel was requested (a body; PostgreSQL:
        ``NOTIFY``)."""
        return nothing()

    def start_leased_run(
        self, run: Row, lease: Row, with_unsettled: bool
    ) -> Operation[LeasedStart]:
        """Take the thread's lease, then insert the run if the lease is ours, and read
        the thread's unsettled effects when asked, in one round trip.

        Args:
            run: ``INSERT_RUN_LEASED``'s parameters.
            lease: ``ACQUIRE_LEASE``'s parameters.
            with_unsettled: Read the thread's unsettled effects too.
        """
        statements = [(ledger_sql.ACQUIRE_LEASE, lease), (ledger_sql.INSERT_RUN_LEASED, run)]
        if with_unsettled:
            statements.append((ledger_sql.SELECT_UNSETTLED, {"thread_id": run["thread_id"]}))
        results = yield Pipeline(statements)
        created = results[1][0] if results[1] else None
        return bool(results[0]), created, results[2] if with_unsettled else None

    def finish_releasing(self, finish: str, params: Row) -> Operation[Row | None]:
        """Run ``finish`` (``FINISH_RUN`` for a target) and let the lease go if it or an
        earlier attempt with the same token finished the run, in one round trip.

        Returns:
            The finished run's row, or None if this statement did not finish it.
        """
        results = yield Pipeline(
            [(finish, params), (ledger_sql.RELEASE_LEASE_AFTER_FINISH, params)]
        )
        finished: Row | None = results[0][0] if results[0] else None
        return finished

    def insert_effect(self, params: Row) -> Operation[tuple[Row, bool]]:
        """Insert a planned effect (``decisions.plan_params``) with its audit row.

        Returns:
            ``(row, created)``: the new row, or the one already recorded.
        """
        raise NotImplementedError  # pragma: no cover - interface

    def insert_effects(
        self,
        thread_id: str,
        run_id: str,
        unique: dict[str, NewEffect],
        *,
        owner: str | None,
        actor: str,
        read_back: bool,
    ) -> Operation[dict[str, tuple[EffectRecord, bool]]]:
        """Insert a batch (one item per tool-call id) with its audit rows.

        Returns:
            With ``read_back``, every item's ``(record, created)`` by tool-call id;
            else an empty dict.
        """
        raise NotImplementedError  # pragma: no cover - interface

    def insert_effects_beginning(
        self,
        thread_id: str,
        run_id: str,
        unique: dict[str, NewEffect],
        *,
        owner: str | None,
        actor: str,
        intents: Sequence[TransitionRequest],
        token: str,
    ) -> Operation[tuple[dict[str, tuple[EffectRecord, bool]], list[EffectRecord]]]:
        """``insert_effects`` with ``read_back``, then each of ``intents`` (``dispatched``)
        applied to the row it names when that insert created it and its run is running.

        PostgreSQL does both in one statement; this default, a write after the other.

        Returns:
            Every item's ``(record, created)`` by tool-call id, and the records moved to
            ``dispatched``, in the order of ``intents``.
        """
        found = yield from self.insert_effects(
            thread_id, run_id, unique, owner=owner, actor=actor, read_back=True
        )
        created = {
            rec.effect_id
            for rec, new in found.values()
            if new and rec.status is EffectStatus.PLANNED
        }
        jobs = [
            (intent, decisions.checked(intent), token)
            for intent in intents
            if intent.effect_id in created
        ]
        if not jobs:
            return found, []
        begun: list[EffectRecord] = []
        for moved, _current in (yield from self.compare_and_set_many(jobs)):
            if moved is not None:
                rec = effect_record(moved, self)
                found[rec.tool_call_id] = (rec, True)
                begun.append(rec)
        return found, begun

    def effect_rows(self, effect_ids: list[str]) -> Operation[list[Row]]:
        """The rows of these effects that exist, in one read."""
        raise NotImplementedError  # pragma: no cover - interface

    def compare_and_set(self, job: CasJob) -> Operation[CasOutcome]:
        """One effect's compare-and-set with its audit row.

        Returns:
            ``(moved, None)`` when it applied; ``(None, current)`` when it did not,
            ``current`` being the row as it is (None: no such effect).
        """
        raise NotImplementedError  # pragma: no cover - interface

    def compare_and_set_many(self, jobs: Sequence[CasJob]) -> Operation[list[CasOutcome]]:
        """``compare_and_set`` for several effects at once, one outcome per job."""
        raise NotImplementedError  # pragma: no cover - interface


def select_in(template: str, ids: list[str]) -> Generator[Step, Any, list[Row]]:
    """SQLite (a body): the rows of ``template`` (an ``IN ({ids})`` query) for many ids."""
    rows: list[Row] = []
    for sql, params in decisions.in_chunks(template, ids):
        rows.extend((yield Execute(sql, params, "all")))
    return rows


class SqliteStatements(DialectStatements):
    """SQLite: each write a transaction of plain statements (the audit row its own)."""

    def insert_effect(self, params: Row) -> Operation[tuple[Row, bool]]:
        return (yield from within("transaction", self._insert_effect(params)))

    def _insert_effect(self, params: Row) -> Generator[Step, Any, tuple[Row, bool]]:
        row = yield Execute(ledger_sql.INSERT_EFFECT, params)
        if row is None:
            existing = yield Execute(ledger_sql.SELECT_EFFECT, {"effect_id": params["effect_id"]})
            assert existing is not None
            return existing, False
        yield Execute(ledger_sql.INSERT_TRANSITION, decisions.plan_audit(params), "none")
        return row, True

    def insert_effects(
        self,
        thread_id: str,
        run_id: str,
        unique: dict[str, NewEffect],
        *,
        owner: str | None,
        actor: str,
        read_back: bool,
    ) -> Operation[dict[str, tuple[EffectRecord, bool]]]:
        """One transaction, a statement per step (not per call).

        A taken idempotency key fails the whole insert (rolled back); the caller
        then records the batch call by call to tell which key it was. The new
        records are built from the rows as inserted (the writer lock is held, so
        nothing else wrote them); only rows recorded before are read.
        """
        stamp = self.ts_in(utcnow())
        ids = {call_id: decisions.derive_effect_id(thread_id, call_id) for call_id in unique}
        known, rows = yield Unit(
            "transaction",
            self._insert_batch(thread_id, run_id, unique, ids, owner, actor, stamp, read_back),
        )
        if not read_back:
            return {}
        found = {
            call_id: (effect_record(known[ids[call_id]], self), False)
            for call_id in unique
            if ids[call_id] in known
        }
        for row in rows:
            found[row["tool_call_id"]] = (inserted_record(row, stamp, self), True)
        return found

    def _insert_batch(
        self,
        thread_id: str,
        run_id: str,
        unique: dict[str, NewEffect],
        ids: dict[str, str],
        owner: str | None,
        actor: str,
        stamp: Any,
        read_back: bool,
    ) -> Generator[Step, Any, tuple[dict[str, Row], list[Row]]]:
        """The batch's body: the rows recorded before (by effect id) and those inserted."""
        template = ledger_sql.SELECT_EFFECTS_IN if read_back else ledger_sql.SELECT_EFFECT_IDS_IN
        before = yield from select_in(template, list(ids.values()))
        known = {row["effect_id"]: row for row in before}
        new = {call_id: item for call_id, item in unique.items() if ids[call_id] not in known}
        rows, audits = decisions.sqlite_plan_rows(
            thread_id, run_id, new, owner=owner, actor=actor, stamp=stamp, codec=self
        )
        if rows:
            yield ExecuteMany(ledger_sql.INSERT_EFFECT_ROW, rows)
            yield ExecuteMany(ledger_sql.INSERT_TRANSITION, audits)
        return known, rows

    def effect_rows(self, effect_ids: list[str]) -> Operation[list[Row]]:
        return (yield from within("read", select_in(ledger_sql.SELECT_EFFECTS_IN, effect_ids)))

    def compare_and_set(self, job: CasJob) -> Operation[CasOutcome]:
        return (yield from within("transaction", self._compare_and_set(job)))

    def _compare_and_set(self, job: CasJob) -> Generator[Step, Any, CasOutcome]:
        req, (allowed, guard), token = job
        now = utcnow()
        audit, params = decisions.cas_statement(
            ledger_sql.SQLITE_AUDIT_TRANSITION, req, allowed, guard, token, now, self
        )
        update, _ = decisions.cas_statement(
            ledger_sql.SQLITE_TRANSITION_EFFECT, req, allowed, guard, token, now, self
        )
        yield Execute(audit, params, "none")
        row = yield Execute(update, params)
        if row is not None:
            return row, None
        return None, (yield Execute(ledger_sql.SELECT_EFFECT, {"effect_id": req.effect_id}))

    def compare_and_set_many(self, jobs: Sequence[CasJob]) -> Operation[list[CasOutcome]]:
        return (yield from within("transaction", self._each_in_one(jobs)))

    def _each_in_one(self, jobs: Sequence[CasJob]) -> Generator[Step, Any, list[CasOutcome]]:
        """All of them in one transaction (each a nested unit joining it)."""
        outcomes: list[CasOutcome] = []
        for job in jobs:
            outcomes.append((yield from self.compare_and_set(job)))
        return outcomes


class PostgresStatements(DialectStatements):
    """PostgreSQL: each write one autocommit statement, a writable CTE carrying the
    audit row; a batch one statement over a JSON document of rows."""

    def json_out(self, value: Any) -> Any:
        """A ``JSONB`` column as psycopg decoded it: a string stored is a string read,
        never parsed a second time."""
        return value

    has_migrations_sql = ledger_sql.PG_HAS_MIGRATIONS

    def lock_for_setup(self) -> Body:
        yield Execute(f"SELECT pg_advisory_xact_lock({SETUP_LOCK_KEY})", None, "none")

    def announce_cancel(self, thread_id: str, run_id: str) -> Body:
        yield Execute(ledger_sql.NOTIFY_CANCEL, decisions.cancel_notice(thread_id, run_id), "none")

    def start_leased_run(
        self, run: Row, lease: Row, with_unsettled: bool
    ) -> Operation[LeasedStart]:
        """One statement; the unsettled effects are read after it only when it found
        some (the common new run has none)."""
        start = Execute(_as_written(ledger_sql.PG_START_RUN_LEASED), {**lease, **run})
        row: Row | None = yield Unit("statement", in_order(start))
        if row is None:
            return False, None, None
        unsettled_found = row.pop("unsettled_found")
        created = row if row["run_id"] is not None else None
        if not with_unsettled:
            return True, created, None
        if not unsettled_found:
            return True, created, []
        unsettled: list[Row] = yield read(
            ledger_sql.SELECT_UNSETTLED, {"thread_id": run["thread_id"]}, "all"
        )
        return True, created, unsettled

    def finish_releasing(self, finish: str, params: Row) -> Operation[Row | None]:
        """One statement: the finish and the release in writable CTEs."""
        statement = _finish_releasing(finish, commits_before_flush())
        finished: Row | None = yield Unit("statement", in_order(Execute(statement, params)))
        return finished

    def insert_effect(self, params: Row) -> Operation[tuple[Row, bool]]:
        return (yield from within("statement", self._insert_effect(params)))

    def _insert_effect(self, params: Row) -> Generator[Step, Any, tuple[Row, bool]]:
        row = yield Execute(_as_written(ledger_sql.PG_INSERT_EFFECT), params)
        if row is not None:
            return row, True
        existing = yield Execute(ledger_sql.SELECT_EFFECT, {"effect_id": params["effect_id"]})
        assert existing is not None
        return existing, False

    def insert_effects(
        self,
        thread_id: str,
        run_id: str,
        unique: dict[str, NewEffect],
        *,
        owner: str | None,
        actor: str,
        read_back: bool,
    ) -> Operation[dict[str, tuple[EffectRecord, bool]]]:
        """One statement for the whole batch; rows recorded before are read back after it."""
        rows, params = self._batch_params(thread_id, run_id, unique, owner=owner, actor=actor)
        return (yield from within("statement", self._insert_batch(rows, params, read_back)))

    def _batch_params(
        self,
        thread_id: str,
        run_id: str,
        unique: dict[str, NewEffect],
        *,
        owner: str | None,
        actor: str,
    ) -> tuple[list[Row], Row]:
        """A batch's rows and the parameters of the statements that plan it."""
        rows = decisions.pg_plan_rows(thread_id, run_id, unique)
        params = {
            # One JSON document, not an array per column: psycopg quotes every array
            # element in Python, which cost more than the server's insert.
            "rows": json_text(rows),
            "thread_id": thread_id,
            "run_id": run_id,
            "owner": owner,
            "actor": actor,
            "now": self.ts_in(utcnow()),
        }
        return rows, params

    def _insert_batch(
        self, rows: list[Row], params: Row, read_back: bool
    ) -> Generator[Step, Any, dict[str, tuple[EffectRecord, bool]]]:
        found: dict[str, tuple[EffectRecord, bool]] = {}
        insert = _as_written(ledger_sql.PG_INSERT_EFFECTS)
        if not read_back:
            yield Execute(insert, params, "none")
            return found
        for row in (yield Execute(insert, params, "all")):
            found[row["tool_call_id"]] = (effect_record(row, self), True)
        missing = [r["effect_id"] for r in rows if r["tool_call_id"] not in found]
        if missing:
            for row in (yield Execute(ledger_sql.PG_SELECT_EFFECTS_ANY, {"ids": missing}, "all")):
                found[row["tool_call_id"]] = (effect_record(row, self), False)
        return found

    def insert_effects_beginning(
        self,
        thread_id: str,
        run_id: str,
        unique: dict[str, NewEffect],
        *,
        owner: str | None,
        actor: str,
        intents: Sequence[TransitionRequest],
        token: str,
    ) -> Operation[tuple[dict[str, tuple[EffectRecord, bool]], list[EffectRecord]]]:
        rows, params = self._batch_params(thread_id, run_id, unique, owner=owner, actor=actor)
        # Only the ids travel: each intent's audit detail is its row's idempotency key,
        # which the statement writes from the row itself (``plan_many_and_begin``
        # builds every intent's detail from the same key).
        params.update(begin_ids=[intent.effect_id for intent in intents], token=token)
        return (yield from within("statement", self._insert_beginning(rows, params)))

    def _insert_beginning(
        self, rows: list[Row], params: Row
    ) -> Generator[Step, Any, tuple[dict[str, tuple[EffectRecord, bool]], list[EffectRecord]]]:
        found: dict[str, tuple[EffectRecord, bool]] = {}
        begin_ids: list[str] = params["begin_ids"]
        begun: dict[str, EffectRecord] = {}
        for row in (yield Execute(ledger_sql.PG_INSERT_EFFECTS_BEGINNING, params, "all")):
            rec = effect_record(row, self)
            found[row["tool_call_id"]] = (rec, True)
            if rec.effect_id in begin_ids and rec.status is EffectStatus.DISPATCHED:
                begun[rec.effect_id] = rec
        missing = [r["effect_id"] for r in rows if r["tool_call_id"] not in found]
        if missing:
            for row in (yield Execute(ledger_sql.PG_SELECT_EFFECTS_ANY, {"ids": missing}, "all")):
                rec = effect_record(row, self)
                # This statement's own intent, its acknowledgement lost and the write retried.
                own = row["effect_id"] in begin_ids and row["last_token"] == params["token"]
                found[row["tool_call_id"]] = (rec, own)
                if own and rec.status is EffectStatus.DISPATCHED:
                    begun[rec.effect_id] = rec
        return found, [begun[effect_id] for effect_id in begin_ids if effect_id in begun]

    def effect_rows(self, effect_ids: list[str]) -> Operation[list[Row]]:
        rows: list[Row] = yield read(ledger_sql.PG_SELECT_EFFECTS_ANY, {"ids": effect_ids}, "all")
        return rows

    def compare_and_set(self, job: CasJob) -> Operation[CasOutcome]:
        return (yield from within("statement", self._compare_and_set(job)))

    def _compare_and_set(self, job: CasJob) -> Generator[Step, Any, CasOutcome]:
        req, (allowed, guard), token = job
        sql, params = decisions.cas_statement(
            _as_written(ledger_sql.PG_TRANSITION_EFFECT), req, allowed, guard, token, utcnow(), self
        )
        row = yield Execute(sql, params)
        if row is not None:
            return row, None
        return None, (yield Execute(ledger_sql.SELECT_EFFECT, {"effect_id": req.effect_id}))

    def compare_and_set_many(self, jobs: Sequence[CasJob]) -> Operation[list[CasOutcome]]:
        """The compare-and-sets in one statement, then one read of those that did not apply.

        One statement rather than a pipeline of one per request: psycopg's pipeline
        costs more client CPU than the server spends on the rows.
        """
        if len(jobs) == 1:  # the one-row statement runs faster than a row set
            return [(yield from self.compare_and_set(jobs[0]))]
        transition = Execute(
            _as_written(ledger_sql.PG_TRANSITION_EFFECTS),
            {
                "rows": json_text(decisions.pg_transition_rows(jobs)),
                "ids": [req.effect_id for req, _, _ in jobs],
                "now": self.ts_in(utcnow()),
            },
            "all",
        )
        moved: list[Row | None] = [None] * len(jobs)
        for row in (yield Unit("statement", in_order(transition))):
            moved[row["n"]] = row
        lost = [req.effect_id for (req, _, _), row in zip(jobs, moved, strict=True) if row is None]
        current: dict[str, Row] = {}
        if lost:
            current = {row["effect_id"]: row for row in (yield from self.effect_rows(lost))}
        return [
            (row, None) if row is not None else (None, current.get(req.effect_id))
            for (req, _, _), row in zip(jobs, moved, strict=True)
        ]


@functools.lru_cache(maxsize=32)
def _finish_releasing(finish: str, before_flush: bool) -> str:
    """``PG_FINISH_RUN_RELEASING`` around ``finish``, committing before the WAL flush
    when asked; formatted once per finish statement."""
    statement = ledger_sql.PG_FINISH_RUN_RELEASING.format(finish=finish)
    return ledger_sql.pg_committing_before_flush(statement) if before_flush else statement


def _as_written(statement: str) -> str:
    """A hot write's statement, or inside ``commit_before_flush`` its variant that
    commits before the WAL flush (``ledger_sql.PG_COMMITTING_BEFORE_FLUSH``)."""
    if commits_before_flush():
        return ledger_sql.PG_COMMITTING_BEFORE_FLUSH[statement]
    return statement


__all__ = [
    "SETUP_LOCK_KEY",
    "Body",
    "DialectStatements",
    "LeasedStart",
    "PostgresStatements",
    "SqliteStatements",
    "json_text",
    "select_in",
]

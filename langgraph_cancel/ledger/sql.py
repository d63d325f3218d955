"""SQL of the ledger: its statements as named constants.

Statements are written with psycopg's ``%(name)s`` placeholders; the SQLite
dialect rewrites them to ``:name`` once at import time. The tables they work on
are created by the migrations in ``schema.py``.
"""

from __future__ import annotations

import re

# The migrations are importable from this module too, where version 0.1.0 kept them.
from langgraph_cancel.ledger.schema import POSTGRES_MIGRATIONS as POSTGRES_MIGRATIONS
from langgraph_cancel.ledger.schema import SQLITE_MIGRATIONS as SQLITE_MIGRATIONS
from langgraph_cancel.ledger.schema import TERMINAL_RUN_SQL, UNSETTLED_SQL, V0_EFFECT_COLUMNS

# A write that need not wait for its WAL to reach the disk (``langgraph_cancel.ledger.
# flush``) turns ``synchronous_commit`` off for its own transaction (is_local): the
# setting governs that commit and ends with it, so the session's next statement waits
# again. A statement makes it itself (``pg_committing_before_flush``) or has this run
# first, in the same implicit transaction (one pipeline).
PG_SET_COMMIT_BEFORE_FLUSH = "set_config('synchronous_commit', 'off', true)"
PG_COMMIT_BEFORE_FLUSH = f"SELECT {PG_SET_COMMIT_BEFORE_FLUSH}"


def pg_committing_before_flush(statement: str) -> str:
    """``statement`` making the setting itself, as its main query reads back its rows.

    Only for a statement whose main query reads every row it wrote and has no ``WHERE``
    of its own: the setting is made before its transaction commits anything it wrote,
    with no statement of its own (a pipeline costs the client more than the write
    costs the server). A statement that wrote nothing has nothing to flush.
    """
    return f"{statement}\nWHERE {PG_SET_COMMIT_BEFORE_FLUSH} IS NOT NULL"


SELECT_VERSION = "SELECT MAX(v) FROM lgc_migrations"
# Whether the ledger's tables exist, read before ``setup`` takes any lock.
SQLITE_HAS_MIGRATIONS = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'lgc_migrations'"
)
PG_HAS_MIGRATIONS = "SELECT 1 WHERE to_regclass('lgc_migrations') IS NOT NULL"
INSERT_VERSION = "INSERT INTO lgc_migrations (v) VALUES (%(v)s) ON CONFLICT (v) DO NOTHING"

RUN_COLUMNS = (
    "run_id, thread_id, status, created_at, updated_at, owner, parent_run_id, requested_at, "
    "requested_by, reason, observed_at, quiesced_at, tokens_after_cancel, report, last_token, "
    "tokens_used"
)
EFFECT_COLUMNS = f"{V0_EFFECT_COLUMNS}, release_at"

INSERT_RUN = f"""
INSERT INTO lgc_runs (run_id, thread_id, status, created_at, updated_at, owner, parent_run_id)
VALUES (%(run_id)s, %(thread_id)s, 'running', %(now)s, %(now)s, %(owner)s, %(parent_run_id)s)
ON CONFLICT DO NOTHING
RETURNING {RUN_COLUMNS}"""

# New input with the thread's lease taken first, in the same transaction (one round
# trip): the run row is written only if the lease (ACQUIRE_LEASE just before) is ours.
INSERT_RUN_LEASED = f"""
INSERT INTO lgc_runs (run_id, thread_id, status, created_at, updated_at, owner, parent_run_id)
SELECT %(run_id)s, %(thread_id)s, 'running', %(now)s, %(now)s, %(owner)s, %(parent_run_id)s
WHERE EXISTS (SELECT 1 FROM lgc_leases WHERE thread_id = %(thread_id)s AND owner = %(owner)s)
ON CONFLICT DO NOTHING
RETURNING {RUN_COLUMNS}"""

SELECT_RUN = f"SELECT {RUN_COLUMNS} FROM lgc_runs WHERE run_id = %(run_id)s"
SELECT_ACTIVE_RUN = f"""
SELECT {RUN_COLUMNS} FROM lgc_runs
WHERE thread_id = %(thread_id)s AND status NOT IN {TERMINAL_RUN_SQL}"""
SELECT_LATEST_RUN = f"""
SELECT {RUN_COLUMNS} FROM lgc_runs WHERE thread_id = %(thread_id)s
ORDER BY created_at DESC, run_id DESC LIMIT 1"""
SELECT_THREAD_RUNS = f"""
SELECT {RUN_COLUMNS} FROM lgc_runs WHERE thread_id = %(thread_id)s ORDER BY created_at, run_id"""
SELECT_CHILD_RUNS = f"""
SELECT {RUN_COLUMNS} FROM lgc_runs WHERE parent_run_id = %(run_id)s ORDER BY created_at"""
SELECT_RUNS_BY_STATUS = f"""
SELECT {RUN_COLUMNS} FROM lgc_runs WHERE status = %(status)s ORDER BY created_at LIMIT %(limit)s"""

REQUEST_CANCEL = f"""
UPDATE lgc_runs SET status = 'cancel_requested', requested_at = %(now)s, updated_at = %(now)s,
    requested_by = %(requested_by)s, reason = %(reason)s, last_token = %(token)s
WHERE run_id = %(run_id)s AND status = 'running'
RETURNING {RUN_COLUMNS}"""

MARK_OBSERVED = f"""
UPDATE lgc_runs SET status = 'cancelling', updated_at = %(now)s,
    observed_at = COALESCE(observed_at, %(now)s)
WHERE run_id = %(run_id)s AND status = 'cancel_requested'
RETURNING {RUN_COLUMNS}"""

FINISH_RUN = f"""
UPDATE lgc_runs SET status = %(status)s, updated_at = %(now)s, last_token = %(token)s,
    observed_at = CASE WHEN %(status)s = 'cancelled' THEN COALESCE(observed_at, %(now)s)
                       ELSE observed_at END,
    quiesced_at = COALESCE(%(quiesced_at)s, quiesced_at),
    tokens_after_cancel = COALESCE(%(tokens_after_cancel)s, tokens_after_cancel),
    report = COALESCE(%(report)s, report)
WHERE run_id = %(run_id)s AND status IN ({{allowed}})
RETURNING {RUN_COLUMNS}"""

ADD_TOKENS_AFTER_CANCEL = """
UPDATE lgc_runs SET tokens_after_cancel = COALESCE(tokens_after_cancel, 0) + %(tokens)s
WHERE run_id = %(run_id)s"""

ADD_TOKENS_USED = """
UPDATE lgc_runs SET tokens_used = tokens_used + %(tokens)s
WHERE run_id = %(run_id)s
RETURNING tokens_used"""

# One new effect row; ``INSERT_EFFECT`` returns it, SQLite's ``plan_many`` runs the
# bare insert for a whole batch (executemany) and reads the rows back once.
INSERT_EFFECT_ROW = """
INSERT INTO lgc_effects (effect_id, thread_id, run_id, tool_call_id, tool, kind, status,
    idempotency_key, args, seq, result, error, owner, next_action, approval, version, last_token,
    created_at, updated_at, dispatched_at, settled_at)
VALUES (%(effect_id)s, %(thread_id)s, %(run_id)s, %(tool_call_id)s, %(tool)s, %(kind)s,
    %(status)s, %(idempotency_key)s, %(args)s, %(seq)s, %(result)s, %(error)s, %(owner)s,
    %(next_action)s, %(approval)s, 1, %(token)s, %(now)s, %(now)s, %(dispatched_at)s,
    %(settled_at)s)
ON CONFLICT (effect_id) DO NOTHING"""
INSERT_EFFECT = f"""{INSERT_EFFECT_ROW}
RETURNING {EFFECT_COLUMNS}"""

SELECT_EFFECT = f"SELECT {EFFECT_COLUMNS} FROM lgc_effects WHERE effect_id = %(effect_id)s"
# The effects of several tool calls of one thread, in one read. SQLite gets an IN
# list (``{ids}``: bound placeholders); PostgreSQL binds one array.
SELECT_EFFECTS_IN = f"""
SELECT {EFFECT_COLUMNS} FROM lgc_effects WHERE effect_id IN ({{ids}})"""
SELECT_EFFECT_IDS_IN = """
SELECT effect_id FROM lgc_effects WHERE effect_id IN ({ids})"""
PG_SELECT_EFFECTS_ANY = f"""
SELECT {EFFECT_COLUMNS} FROM lgc_effects WHERE effect_id = ANY(%(ids)s::text[])"""

SELECT_EFFECT_BY_KEY = f"SELECT {EFFECT_COLUMNS} FROM lgc_effects WHERE idempotency_key = %(key)s"
# A key held by an effect that never left the process (dropped before dispatch, or
# rejected at approval) goes to the next call that asks for it: the holder keeps
# its record under a key that says where the original went. (A ``not_applied``
# holder is dropped first: ``Ledger._give_up_not_applied``.)
RELEASE_UNSENT_KEY = """
UPDATE lgc_effects SET idempotency_key = %(released)s
WHERE idempotency_key = %(key)s AND status IN ('dropped', 'rejected')
RETURNING effect_id"""
SELECT_THREAD_EFFECTS = f"""
SELECT {EFFECT_COLUMNS} FROM lgc_effects WHERE thread_id = %(thread_id)s
ORDER BY created_at, seq, effect_id"""
# Calls recorded as ``<tool_call_id>~<digest>``: their tool-call id already named
# another call's record. ``%(prefix)s`` is the id with LIKE's wildcards escaped.
SELECT_MOVED_EFFECTS = f"""
SELECT {EFFECT_COLUMNS} FROM lgc_effects
WHERE thread_id = %(thread_id)s AND tool_call_id LIKE %(prefix)s ESCAPE '!'
ORDER BY created_at, seq, effect_id"""
SELECT_RUN_EFFECTS = f"""
SELECT {EFFECT_COLUMNS} FROM lgc_effects WHERE run_id = %(run_id)s
ORDER BY created_at, seq, effect_id"""
SELECT_UNSETTLED = f"""
SELECT {EFFECT_COLUMNS} FROM lgc_effects
WHERE thread_id = %(thread_id)s AND status IN {UNSETTLED_SQL}
ORDER BY seq, created_at, effect_id"""
SELECT_BY_STATUS = f"""
SELECT {EFFECT_COLUMNS} FROM lgc_effects WHERE status = %(status)s
ORDER BY created_at, effect_id LIMIT %(limit)s"""

# The compare-and-set. ``{statuses}`` is filled with bound placeholders for the
# allowed "from" statuses; ``{guard}`` optionally adds the run-is-active check that
# makes "no dispatch after the cancel signal" a database fact (invariant I1).
#
# SQLite, inside one BEGIN IMMEDIATE: the audit row first (its "from" is the row's
# status before the update), then the update, both under the same compare-and-set
# predicate. ``last_token IS NOT`` (null-safe): a retry of a write that committed does
# not apply twice.
_SQLITE_CAS = """effect_id = %(effect_id)s AND status IN ({statuses})
    AND last_token IS NOT %(token)s {guard}"""

SQLITE_AUDIT_TRANSITION = f"""
INSERT INTO lgc_transitions (effect_id, from_status, to_status, at, actor, detail)
SELECT effect_id, status, %(to)s, %(now)s, %(actor)s, %(detail)s FROM lgc_effects
WHERE {_SQLITE_CAS}"""

SQLITE_TRANSITION_EFFECT = f"""
UPDATE lgc_effects SET status = %(to)s, version = version + 1, last_token = %(token)s,
    updated_at = %(now)s,
    result = CASE WHEN %(set_result)s = 1 THEN %(result)s ELSE result END,
    error = CASE WHEN %(set_error)s = 1 THEN %(error)s ELSE error END,
    owner = COALESCE(%(owner)s, owner),
    next_action = CASE WHEN %(set_next_action)s = 1 THEN %(next_action)s ELSE next_action END,
    approval = COALESCE(%(approval)s, approval),
    args = COALESCE(%(args)s, args),
    dispatched_at = CASE WHEN %(to)s = 'dispatched' THEN %(now)s ELSE dispatched_at END,
    settled_at = CASE WHEN %(settles)s = 1 THEN %(now)s ELSE settled_at END,
    release_at = COALESCE(%(release_at)s, release_at)
WHERE {_SQLITE_CAS}
RETURNING {EFFECT_COLUMNS}"""

# PostgreSQL: the compare-and-set and its audit row in ONE statement (one round
# trip, atomic without BEGIN/COMMIT). ``prev`` locks the row so the audit's
# "from" status is the one the update replaced.
PG_TRANSITION_EFFECT = f"""
WITH prev AS (
    SELECT effect_id, status AS from_status FROM lgc_effects
    WHERE effect_id = %(effect_id)s FOR UPDATE
), upd AS (
    UPDATE lgc_effects SET status = %(to)s, version = version + 1, last_token = %(token)s,
        updated_at = %(now)s,
        result = CASE WHEN %(set_result)s = 1 THEN %(result)s ELSE result END,
        error = CASE WHEN %(set_error)s = 1 THEN %(error)s ELSE error END,
        owner = COALESCE(%(owner)s, owner),
        next_action = CASE WHEN %(set_next_action)s = 1 THEN %(next_action)s
                           ELSE next_action END,
        approval = COALESCE(%(approval)s, approval),
        args = COALESCE(%(args)s, args),
        dispatched_at = CASE WHEN %(to)s = 'dispatched' THEN %(now)s ELSE dispatched_at END,
        settled_at = CASE WHEN %(settles)s = 1 THEN %(now)s ELSE settled_at END,
        release_at = COALESCE(%(release_at)s::timestamptz, release_at)
    FROM prev
    WHERE lgc_effects.effect_id = prev.effect_id AND lgc_effects.status IN ({{statuses}})
        -- a retry whose first attempt committed (lost ack) must not apply twice
        AND lgc_effects.last_token IS DISTINCT FROM %(token)s {{guard}}
    RETURNING {", ".join("lgc_effects." + c.strip() for c in EFFECT_COLUMNS.split(","))},
        prev.from_status
), audit AS (
    INSERT INTO lgc_transitions (effect_id, from_status, to_status, at, actor, detail)
    SELECT effect_id, from_status, %(to)s, %(now)s, %(actor)s, %(detail)s FROM upd
)
SELECT * FROM upd"""

# PostgreSQL: several compare-and-sets and their audit rows in ONE statement, whatever
# their number (one statement text, so one prepared plan). Each request is a row of
# ``%(rows)s``; its own allowed statuses and run guard travel with it. Rows are locked
# in effect-id order, so two writers' batches cannot deadlock. A request missing
# from the result did not apply; the caller reads the row to say why.
# The ids also travel as an array: the planner cannot count a jsonb row set (it
# assumes 100 rows) and, on a ledger of a few thousand rows, would scan the whole
# table twice per write; ``= ANY (ids)`` keeps both probes on the primary key.
PG_TRANSITION_EFFECTS = f"""
WITH req AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(n int, effect_id text, "to" text,
        token text, allowed text[], guard bool, set_result bool, result jsonb,
        set_error bool, error text, owner text, set_next_action bool, next_action text,
        approval jsonb, args jsonb, settles bool, actor text, detail jsonb,
        release_at timestamptz)
), prev AS (
    SELECT e.effect_id, e.status AS from_status FROM lgc_effects e
    WHERE e.effect_id = ANY (%(ids)s::text[]) ORDER BY e.effect_id FOR UPDATE
), upd AS (
    UPDATE lgc_effects e SET status = r."to", version = e.version + 1, last_token = r.token,
        updated_at = %(now)s,
        result = CASE WHEN r.set_result THEN r.result ELSE e.result END,
        error = CASE WHEN r.set_error THEN r.error ELSE e.error END,
        owner = COALESCE(r.owner, e.owner),
        next_action = CASE WHEN r.set_next_action THEN r.next_action ELSE e.next_action END,
        approval = COALESCE(r.approval, e.approval),
        args = COALESCE(r.args, e.args),
        dispatched_at = CASE WHEN r."to" = 'dispatched' THEN %(now)s ELSE e.dispatched_at END,
        settled_at = CASE WHEN r.settles THEN %(now)s ELSE e.settled_at END,
        release_at = COALESCE(r.release_at, e.release_at)
    FROM req r JOIN prev p ON p.effect_id = r.effect_id
    WHERE e.effect_id = ANY (%(ids)s::text[]) AND e.effect_id = r.effect_id
        AND e.status = ANY (r.allowed)
        -- a retry whose first attempt committed (lost ack) must not apply twice
        AND e.last_token IS DISTINCT FROM r.token
        AND (NOT r.guard
             OR (SELECT x.status FROM lgc_runs x WHERE x.run_id = e.run_id) = 'running')
    RETURNING r.n, {", ".join("e." + c.strip() for c in EFFECT_COLUMNS.split(","))},
        p.from_status, r.actor, r.detail AS audit_detail
), audit AS (
    INSERT INTO lgc_transitions (effect_id, from_status, to_status, at, actor, detail)
    SELECT effect_id, from_status, status, %(now)s, actor, audit_detail FROM upd ORDER BY n
)
SELECT n, {EFFECT_COLUMNS} FROM upd"""

PG_INSERT_EFFECT = f"""
WITH ins AS ({INSERT_EFFECT}
), audit AS (
    INSERT INTO lgc_transitions (effect_id, from_status, to_status, at, actor, detail)
    SELECT effect_id, NULL, status, %(now)s, %(actor)s, %(detail)s FROM ins
)
SELECT * FROM ins"""

# The rows of a batch to plan, one JSON document (``decisions.pg_plan_rows``).
_PG_NEW_EFFECT_ROWS = """SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(effect_id text,
        tool_call_id text, tool text, kind text, status text, idempotency_key text,
        args jsonb, seq int, result jsonb, error text, settles bool, detail jsonb)"""

# A scalar subquery, not EXISTS: the planner would flatten EXISTS into a join that
# walks every effect of the run; this stays a primary-key probe per row updated.
# PostgreSQL: a batch of new records and their audit rows in ONE statement, whatever
# the batch size (one statement text, so one prepared plan). Rows already recorded
# (a re-run) are left alone; the caller reads them back.
PG_INSERT_EFFECTS = f"""
WITH new AS (
    {_PG_NEW_EFFECT_ROWS}
), ins AS (
    INSERT INTO lgc_effects (effect_id, thread_id, run_id, tool_call_id, tool, kind, status,
        idempotency_key, args, seq, result, error, owner, next_action, approval, version,
        last_token, created_at, updated_at, dispatched_at, settled_at)
    SELECT effect_id, %(thread_id)s, %(run_id)s, tool_call_id, tool, kind, status,
        idempotency_key, args, seq, result, error, %(owner)s, NULL, NULL, 1, NULL,
        %(now)s, %(now)s, NULL, CASE WHEN settles THEN %(now)s::timestamptz END
    FROM new
    ON CONFLICT (effect_id) DO NOTHING
    RETURNING {EFFECT_COLUMNS}
), audit AS (
    INSERT INTO lgc_transitions (effect_id, from_status, to_status, at, actor, detail)
    SELECT ins.effect_id, NULL, ins.status, %(now)s, %(actor)s, new.detail
    FROM ins JOIN new ON new.effect_id = ins.effect_id
)
SELECT * FROM ins"""

# PostgreSQL: a batch planned as PG_INSERT_EFFECTS plans it, except that the new rows
# named in %(begin_ids)s go in already dispatched, each intent's audit row after its
# plan's, when their run is running: the plan and the intents of the calls to go out
# first in one commit. A row recorded before is left alone, so only a call this
# statement records starts here.
PG_INSERT_EFFECTS_BEGINNING = f"""
WITH new AS (
    {_PG_NEW_EFFECT_ROWS}
), go AS (
    SELECT DISTINCT b.effect_id FROM unnest(%(begin_ids)s::text[]) AS b(effect_id)
    WHERE (SELECT r.status FROM lgc_runs r WHERE r.run_id = %(run_id)s) = 'running'
), ins AS (
    INSERT INTO lgc_effects (effect_id, thread_id, run_id, tool_call_id, tool, kind, status,
        idempotency_key, args, seq, result, error, owner, next_action, approval, version,
        last_token, created_at, updated_at, dispatched_at, settled_at)
    SELECT new.effect_id, %(thread_id)s, %(run_id)s, tool_call_id, tool, kind,
        CASE WHEN go.effect_id IS NULL THEN status ELSE 'dispatched' END,
        idempotency_key, args, seq, result, error, %(owner)s, NULL, NULL,
        CASE WHEN go.effect_id IS NULL THEN 1 ELSE 2 END,
        CASE WHEN go.effect_id IS NULL THEN NULL ELSE %(token)s END,
        %(now)s, %(now)s, CASE WHEN go.effect_id IS NULL THEN NULL ELSE %(now)s::timestamptz END,
        CASE WHEN settles THEN %(now)s::timestamptz END
    FROM new LEFT JOIN go ON go.effect_id = new.effect_id
    ON CONFLICT (effect_id) DO NOTHING
    RETURNING {EFFECT_COLUMNS}
), audit AS (
    INSERT INTO lgc_transitions (effect_id, from_status, to_status, at, actor, detail)
    SELECT ins.effect_id, NULL, new.status, %(now)s, %(actor)s, new.detail
    FROM ins JOIN new ON new.effect_id = ins.effect_id
    UNION ALL
    SELECT ins.effect_id, new.status, ins.status, %(now)s, %(actor)s,
        jsonb_build_object('idempotency_key', ins.idempotency_key)
    FROM ins JOIN new ON new.effect_id = ins.effect_id
    WHERE ins.status <> new.status
)
SELECT * FROM ins"""

RUN_ACTIVE_GUARD = """AND (
    SELECT r.status FROM lgc_runs r WHERE r.run_id = lgc_effects.run_id) = 'running'"""

INSERT_TRANSITION = """
INSERT INTO lgc_transitions (effect_id, from_status, to_status, at, actor, detail)
VALUES (%(effect_id)s, %(from_status)s, %(to_status)s, %(now)s, %(actor)s, %(detail)s)"""

SELECT_TRANSITIONS = """
SELECT effect_id, from_status, to_status, at, actor, detail FROM lgc_transitions
WHERE effect_id = %(effect_id)s ORDER BY id"""

_TAKE_LEASE = """
INSERT INTO lgc_leases (thread_id, owner, acquired_at, heartbeat_at, expires_at)
VALUES (%(thread_id)s, %(owner)s, %(now)s, %(now)s, %(expires_at)s)
ON CONFLICT (thread_id) DO UPDATE SET
    owner = excluded.owner,
    acquired_at = CASE WHEN lgc_leases.owner = excluded.owner THEN lgc_leases.acquired_at
                       ELSE excluded.acquired_at END,
    heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at
WHERE lgc_leases.owner = excluded.owner OR lgc_leases.expires_at < excluded.heartbeat_at"""
ACQUIRE_LEASE = f"""{_TAKE_LEASE}
RETURNING thread_id, owner, acquired_at, heartbeat_at, expires_at"""

SELECT_LEASE = """
SELECT thread_id, owner, acquired_at, heartbeat_at, expires_at FROM lgc_leases
WHERE thread_id = %(thread_id)s"""

HEARTBEAT_LEASE = """
UPDATE lgc_leases SET heartbeat_at = %(now)s, expires_at = %(expires_at)s
WHERE thread_id = %(thread_id)s AND owner = %(owner)s"""

RELEASE_LEASE = "DELETE FROM lgc_leases WHERE thread_id = %(thread_id)s AND owner = %(owner)s"
# After FINISH_RUN, in the same transaction: the lease goes only if that finish wrote
# the run's terminal status (the run's last token is its token).
RELEASE_LEASE_AFTER_FINISH = """
DELETE FROM lgc_leases WHERE owner = %(lease_owner)s AND thread_id = (
    SELECT thread_id FROM lgc_runs WHERE run_id = %(run_id)s AND last_token = %(token)s)"""

# PostgreSQL: new input's lease, its run and whether the thread has unsettled effects,
# in one statement. The run is written only if the lease is ours (``lease`` returned its
# row); the statement returns no row when another owner holds the lease, and the run's
# columns empty when the thread already has a live run.
PG_START_RUN_LEASED = f"""
WITH lease AS ({_TAKE_LEASE}
RETURNING thread_id
), run AS (
    INSERT INTO lgc_runs (run_id, thread_id, status, created_at, updated_at, owner,
        parent_run_id)
    SELECT %(run_id)s, %(thread_id)s, 'running', %(now)s, %(now)s, %(owner)s, %(parent_run_id)s
    FROM lease
    ON CONFLICT DO NOTHING
    RETURNING {RUN_COLUMNS}
)
SELECT run.*, EXISTS (
    SELECT 1 FROM lgc_effects WHERE thread_id = %(thread_id)s AND status IN {UNSETTLED_SQL}
) AS unsettled_found
FROM lease LEFT JOIN run ON true"""

# PostgreSQL: FINISH_RUN (``{finish}``, its statuses filled in) and
# RELEASE_LEASE_AFTER_FINISH in one statement. The lease goes when this statement
# finishes the run, or when an earlier attempt with the same token did.
PG_FINISH_RUN_RELEASING = """
WITH finished AS ({finish}
), released AS (
    DELETE FROM lgc_leases WHERE owner = %(lease_owner)s AND thread_id IN (
        SELECT thread_id FROM finished
        UNION ALL
        SELECT thread_id FROM lgc_runs WHERE run_id = %(run_id)s AND last_token = %(token)s)
)
SELECT * FROM finished"""

# A lease taken from a holder known to be gone: only if that holder still has it.
TAKE_OVER_LEASE = """
UPDATE lgc_leases SET owner = %(owner)s, acquired_at = %(now)s, heartbeat_at = %(now)s,
    expires_at = %(expires_at)s
WHERE thread_id = %(thread_id)s AND owner = %(previous_owner)s
RETURNING thread_id, owner, acquired_at, heartbeat_at, expires_at"""

INSERT_LEASE_TAKEOVER = """
INSERT INTO lgc_lease_takeovers (thread_id, previous_owner, owner, cause, at)
VALUES (%(thread_id)s, %(previous_owner)s, %(owner)s, %(cause)s, %(now)s)"""

SELECT_LEASE_TAKEOVERS = """
SELECT thread_id, previous_owner, owner, cause, at FROM lgc_lease_takeovers
WHERE thread_id = %(thread_id)s ORDER BY id"""

SELECT_LEASES = """
SELECT thread_id, owner, acquired_at, heartbeat_at, expires_at FROM lgc_leases
ORDER BY thread_id"""

SELECT_EXPIRED_LEASES = """
SELECT thread_id, owner, acquired_at, heartbeat_at, expires_at FROM lgc_leases
WHERE expires_at < %(now)s ORDER BY expires_at"""

DELETE_THREAD_EFFECTS = "DELETE FROM lgc_effects WHERE thread_id = %(thread_id)s"
DELETE_THREAD_RUNS = "DELETE FROM lgc_runs WHERE thread_id = %(thread_id)s"

NOTIFY_CANCEL = "SELECT pg_notify('lgc_cancel', %(payload)s)"

# The ledger's hot writes and a run's start, each beside its variant that commits
# before the WAL flush.
PG_COMMITTING_BEFORE_FLUSH: dict[str, str] = {
    statement: pg_committing_before_flush(statement)
    for statement in (
        PG_INSERT_EFFECT,
        PG_INSERT_EFFECTS,
        PG_TRANSITION_EFFECT,
        PG_TRANSITION_EFFECTS,
        PG_START_RUN_LEASED,
    )
}

_PARAM = re.compile(r"%\((\w+)\)s")


def to_sqlite(sql: str) -> str:
    """Rewrite psycopg named placeholders as SQLite named placeholders."""
    return _PARAM.sub(r":\1", sql)

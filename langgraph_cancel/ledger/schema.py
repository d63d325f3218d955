"""The ledger's schema: its tables, indexes and trigger, as migrations per dialect.

Migrations are append-only lists whose index is the schema version, as in
``langgraph-checkpoint-postgres``: a released migration is never edited, a change
is a new entry. The status lists are shared with the statements (``sql.py``).
"""

from __future__ import annotations

TERMINAL_RUN_SQL = "('cancelled', 'completed', 'failed')"
UNSETTLED_SQL = (
    "('planned', 'pending_approval', 'approved', 'dispatched', 'unknown', 'compensating')"
)

_EFFECT_STATUSES_V0 = (
    "'planned', 'pending_approval', 'approved', 'dispatched', 'committed', 'compensating', "
    "'compensated', 'compensation_failed', 'failed', 'not_applied', 'unknown', 'rejected', "
    "'dropped'"
)
# v4: the delay window's statuses.
_EFFECT_STATUSES = f"{_EFFECT_STATUSES_V0}, 'scheduled', 'revoked'"
_RUN_STATUSES = "'running', 'cancel_requested', 'cancelling', 'cancelled', 'completed', 'failed'"


def _effects_table(
    ts: str, js: str, statuses: str, *, name: str = "lgc_effects", release: bool = False
) -> list[str]:
    """The effects table and its indexes (``release``: with the v4 ``release_at`` column)."""
    release_column = f"release_at {ts},\n            " if release else ""
    return [
        f"""CREATE TABLE IF NOT EXISTS {name} (
            effect_id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('read_only', 'reversible', 'irreversible')),
            status TEXT NOT NULL CHECK (status IN ({statuses})),
            idempotency_key TEXT NOT NULL UNIQUE,
            args {js} NOT NULL,
            seq INTEGER NOT NULL DEFAULT 0,
            result {js},
            error TEXT,
            owner TEXT,
            next_action TEXT,
            approval {js},
            version INTEGER NOT NULL DEFAULT 1,
            last_token TEXT,
            created_at {ts} NOT NULL,
            updated_at {ts} NOT NULL,
            dispatched_at {ts},
            settled_at {ts},
            {release_column}CHECK (status <> 'unknown'
                OR (owner IS NOT NULL AND next_action IS NOT NULL))
        )""",
        *_EFFECT_INDEXES,
    ]


_EFFECT_INDEXES = [
    # Partial index: the cost of "what is unsettled in this thread" does not
    # grow with the settled history.
    f"""CREATE INDEX IF NOT EXISTS lgc_effects_unsettled ON lgc_effects (thread_id, seq)
        WHERE status IN {UNSETTLED_SQL}""",
    "CREATE INDEX IF NOT EXISTS lgc_effects_thread ON lgc_effects (thread_id, created_at)",
    "CREATE INDEX IF NOT EXISTS lgc_effects_run ON lgc_effects (run_id, seq)",
    "CREATE INDEX IF NOT EXISTS lgc_effects_status ON lgc_effects (status)",
]


def _tables(ts: str, js: str, serial: str) -> list[str]:
    return [
        """CREATE TABLE IF NOT EXISTS lgc_migrations (v INTEGER PRIMARY KEY)""",
        f"""CREATE TABLE IF NOT EXISTS lgc_runs (
            run_id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ({_RUN_STATUSES})),
            created_at {ts} NOT NULL,
            updated_at {ts} NOT NULL,
            owner TEXT,
            parent_run_id TEXT,
            requested_at {ts},
            requested_by TEXT,
            reason TEXT,
            observed_at {ts},
            quiesced_at {ts},
            tokens_after_cancel INTEGER,
            report {js}
        )""",
        "CREATE INDEX IF NOT EXISTS lgc_runs_thread ON lgc_runs (thread_id, created_at)",
        # One live run per thread, enforced by the database.
        f"""CREATE UNIQUE INDEX IF NOT EXISTS lgc_runs_one_active ON lgc_runs (thread_id)
            WHERE status NOT IN {TERMINAL_RUN_SQL}""",
        "CREATE INDEX IF NOT EXISTS lgc_runs_parent ON lgc_runs (parent_run_id)",
        *_effects_table(ts, js, _EFFECT_STATUSES_V0),
        f"""CREATE TABLE IF NOT EXISTS lgc_transitions (
            id {serial},
            effect_id TEXT NOT NULL,
            from_status TEXT,
            to_status TEXT NOT NULL,
            at {ts} NOT NULL,
            actor TEXT NOT NULL,
            detail {js}
        )""",
        "CREATE INDEX IF NOT EXISTS lgc_transitions_effect ON lgc_transitions (effect_id, id)",
        f"""CREATE TABLE IF NOT EXISTS lgc_leases (
            thread_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            acquired_at {ts} NOT NULL,
            heartbeat_at {ts} NOT NULL,
            expires_at {ts} NOT NULL
        )""",
    ]


# v4: the delay window. Effects get a release time and two statuses, ``scheduled``
# (revocable until ``release_at``) and ``revoked``; the outbox finds due held calls
# through a partial index. SQLite cannot alter a CHECK constraint: the table is
# rebuilt under the same name, in the migration's transaction.
V0_EFFECT_COLUMNS = (
    "effect_id, thread_id, run_id, tool_call_id, tool, kind, status, idempotency_key, args, seq, "
    "result, error, owner, next_action, approval, version, last_token, created_at, updated_at, "
    "dispatched_at, settled_at"
)
_RELEASE_INDEX = """CREATE INDEX IF NOT EXISTS lgc_effects_release ON lgc_effects (release_at)
    WHERE status = 'scheduled'"""

# v1: runs carry a write token, as effects do: a retried cancel request or terminal
# transition whose first attempt committed (its acknowledgement lost) knows it won.
_RUN_TOKEN = "ALTER TABLE lgc_runs ADD COLUMN last_token TEXT"
# v3: runs count the model tokens they used, so that a token budget survives a resume.
_RUN_TOKENS_USED = "ALTER TABLE lgc_runs ADD COLUMN tokens_used INTEGER NOT NULL DEFAULT 0"


# v2: the audit trail of leases taken from a holder that had not let go (a dead worker
# of this host, found at once, or an expired lease).
def _lease_takeovers(ts: str, serial: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS lgc_lease_takeovers (
            id {serial},
            thread_id TEXT NOT NULL,
            previous_owner TEXT NOT NULL,
            owner TEXT NOT NULL,
            cause TEXT NOT NULL,
            at {ts} NOT NULL
        )""",
        """CREATE INDEX IF NOT EXISTS lgc_lease_takeovers_thread
            ON lgc_lease_takeovers (thread_id, id)""",
    ]


SQLITE_MIGRATIONS: list[list[str]] = [
    [
        *_tables("TEXT", "TEXT", "INTEGER PRIMARY KEY AUTOINCREMENT"),
        f"""CREATE TRIGGER IF NOT EXISTS lgc_runs_terminal_once
            BEFORE UPDATE OF status ON lgc_runs
            WHEN OLD.status IN {TERMINAL_RUN_SQL} AND NEW.status <> OLD.status
            BEGIN SELECT RAISE(ABORT, 'lgc: run is already terminal'); END""",
    ],
    [_RUN_TOKEN],
    _lease_takeovers("TEXT", "INTEGER PRIMARY KEY AUTOINCREMENT"),
    [_RUN_TOKENS_USED],
    [
        _effects_table("TEXT", "TEXT", _EFFECT_STATUSES, name="lgc_effects_v2", release=True)[0],
        f"""INSERT INTO lgc_effects_v2 ({V0_EFFECT_COLUMNS})
            SELECT {V0_EFFECT_COLUMNS} FROM lgc_effects""",
        "DROP TABLE lgc_effects",
        "ALTER TABLE lgc_effects_v2 RENAME TO lgc_effects",
        *_EFFECT_INDEXES,
        _RELEASE_INDEX,
    ],
]

POSTGRES_MIGRATIONS: list[list[str]] = [
    [
        *_tables("TIMESTAMPTZ", "JSONB", "BIGSERIAL PRIMARY KEY"),
        f"""CREATE OR REPLACE FUNCTION lgc_runs_terminal_once() RETURNS trigger AS $$
            BEGIN
                IF OLD.status IN {TERMINAL_RUN_SQL} AND NEW.status <> OLD.status THEN
                    RAISE EXCEPTION 'lgc: run is already terminal'
                        USING ERRCODE = 'check_violation';
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql""",
        "DROP TRIGGER IF EXISTS lgc_runs_terminal_once ON lgc_runs",
        """CREATE TRIGGER lgc_runs_terminal_once BEFORE UPDATE OF status ON lgc_runs
            FOR EACH ROW EXECUTE FUNCTION lgc_runs_terminal_once()""",
    ],
    [_RUN_TOKEN],
    _lease_takeovers("TIMESTAMPTZ", "BIGSERIAL PRIMARY KEY"),
    [_RUN_TOKENS_USED],
    [
        "ALTER TABLE lgc_effects ADD COLUMN IF NOT EXISTS release_at TIMESTAMPTZ",
        "ALTER TABLE lgc_effects DROP CONSTRAINT IF EXISTS lgc_effects_status_check",
        f"""ALTER TABLE lgc_effects ADD CONSTRAINT lgc_effects_status_check
            CHECK (status IN ({_EFFECT_STATUSES}))""",
        _RELEASE_INDEX,
    ],
]


__all__ = [
    "POSTGRES_MIGRATIONS",
    "SQLITE_MIGRATIONS",
    "TERMINAL_RUN_SQL",
    "UNSETTLED_SQL",
    "V0_EFFECT_COLUMNS",
]

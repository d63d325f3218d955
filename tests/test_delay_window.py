"""Delay windows in the ledger: the ``scheduled`` and ``revoked`` statuses, ``release_at``,
the migration that adds them, and the report's buckets for them."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.schema import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS
from langgraph_cancel.report import BUCKETS, bucket_of, build_report
from langgraph_cancel.types import (
    EFFECT_TRANSITIONS,
    UNSETTLED_STATUSES,
    EffectKind,
    EffectStatus,
    TransitionRequest,
    utcnow,
)
from ledger_util import make_effect

_OLD_EFFECT = (
    "INSERT INTO lgc_effects (effect_id, thread_id, run_id, tool_call_id, tool, kind, status,"
    " idempotency_key, args, created_at, updated_at) VALUES ('e0', 't0', 'r0', 'c0', 'refund',"
    " 'irreversible', 'committed', 'k0', '{}', '2026-01-01T00:00:00+00:00',"
    " '2026-01-01T00:00:00+00:00')"
)


def _schedule(ledger: Ledger, effect_id: str, release_in: timedelta) -> None:
    (done,) = ledger.transition_many(
        [
            TransitionRequest(
                effect_id=effect_id,
                to=EffectStatus.SCHEDULED,
                expected=frozenset({EffectStatus.DISPATCHED}),
                result={"content": "handle", "status": "success"},
                release_at=utcnow() + release_in,
            )
        ]
    )
    assert not isinstance(done, Exception), done


def test_a_version_1_sqlite_ledger_gets_the_window_statuses_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    for version in (0, 1):
        for statement in SQLITE_MIGRATIONS[version]:
            conn.execute(statement)
        conn.execute("INSERT INTO lgc_migrations (v) VALUES (?)", (version,))
    conn.execute(_OLD_EFFECT)
    conn.commit()
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(_OLD_EFFECT.replace("'committed'", "'scheduled'").replace("'e0'", "'e1'"))
    conn.close()
    with Ledger.from_url(f"sqlite:///{path}") as ledger:
        old = ledger.get_effect("e0")
        assert old.status is EffectStatus.COMMITTED and old.release_at is None
        run = ledger.start_run("t1")
        rec = make_effect(ledger, EffectStatus.DISPATCHED, thread_id="t1", run_id=run.run_id)
        _schedule(ledger, rec.effect_id, timedelta(minutes=5))
        revoked = ledger.transition(rec.effect_id, EffectStatus.REVOKED)
        assert revoked.status is EffectStatus.REVOKED and revoked.release_at is not None
        with ledger.backend.transaction() as cur:
            cur.execute("SELECT v FROM lgc_migrations ORDER BY v")
            versions = [r["v"] for r in cur.fetchall()]
            cur.execute("SELECT name FROM sqlite_master WHERE type = 'index' ORDER BY name")
            indexes = {r["name"] for r in cur.fetchall()}
    assert versions == list(range(len(SQLITE_MIGRATIONS)))
    assert {
        "lgc_effects_unsettled",
        "lgc_effects_thread",
        "lgc_effects_run",
        "lgc_effects_status",
        "lgc_effects_release",
    } <= indexes
    # Still rejected: a status nobody defined.
    with sqlite3.connect(path) as raw, pytest.raises(sqlite3.IntegrityError):
        raw.execute(_OLD_EFFECT.replace("'committed'", "'sent'").replace("'e0'", "'e2'"))


@pytest.mark.postgres
def test_a_version_1_postgres_ledger_gets_the_window_statuses_and_keeps_its_rows(
    pg_url: str,
) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        for version in (0, 1):
            for statement in POSTGRES_MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute("INSERT INTO lgc_migrations (v) VALUES (%s)", (version,))
        conn.execute(_OLD_EFFECT)
    with Ledger.from_url(pg_url) as ledger:
        assert ledger.get_effect("e0").status is EffectStatus.COMMITTED
        run = ledger.start_run("t1")
        rec = make_effect(ledger, EffectStatus.DISPATCHED, thread_id="t1", run_id=run.run_id)
        _schedule(ledger, rec.effect_id, timedelta(minutes=5))
        assert ledger.transition(rec.effect_id, EffectStatus.REVOKED).status is (
            EffectStatus.REVOKED
        )
    with psycopg.connect(pg_url, autocommit=True) as conn:
        versions = [r[0] for r in conn.execute("SELECT v FROM lgc_migrations ORDER BY v")]
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(_OLD_EFFECT.replace("'committed'", "'sent'").replace("'e0'", "'e2'"))
    assert versions == list(range(len(POSTGRES_MIGRATIONS)))


def test_the_window_statuses_in_the_state_machine() -> None:
    assert EFFECT_TRANSITIONS[EffectStatus.REVOKED] == frozenset()
    assert EffectStatus.SCHEDULED in EFFECT_TRANSITIONS[EffectStatus.DISPATCHED]
    # A scheduled effect holds nothing up: it is not unsettled.
    assert EffectStatus.SCHEDULED not in UNSETTLED_STATUSES
    assert {"scheduled", "revoked"} <= set(BUCKETS)


def test_release_at_round_trips_and_the_report_buckets_each_once(ledger: Ledger) -> None:
    run = ledger.start_run("t-window")
    scheduled = make_effect(
        ledger, EffectStatus.DISPATCHED, thread_id="t-window", run_id=run.run_id, seq=0
    )
    revoked = make_effect(
        ledger, EffectStatus.DISPATCHED, thread_id="t-window", run_id=run.run_id, seq=1
    )
    _schedule(ledger, scheduled.effect_id, timedelta(minutes=5))
    _schedule(ledger, revoked.effect_id, timedelta(minutes=5))
    ledger.transition(revoked.effect_id, EffectStatus.REVOKED, actor="test")
    now = utcnow()
    current = ledger.get_effect(scheduled.effect_id)
    assert current.release_at is not None
    assert timedelta(minutes=4) < current.release_at - now <= timedelta(minutes=5)
    assert current.revocable(now) and not current.revocable(now + timedelta(minutes=6))
    assert not current.held  # dispatched: its provider holds it
    assert current.kind is EffectKind.IRREVERSIBLE
    assert bucket_of(current) == "scheduled"
    assert bucket_of(ledger.get_effect(revoked.effect_id)) == "revoked"
    report = build_report(ledger, ledger.get_run(run.run_id))
    assert [e.effect_id for e in report.scheduled] == [scheduled.effect_id]
    assert [e.effect_id for e in report.revoked] == [revoked.effect_id]
    assert report.revoked[0].release_at is not None
    assert len(report.entries()) == 2
    assert "1 refund revoked inside the delay window" in report.summary
    # The release time is kept through later moves that do not name it.
    assert ledger.get_effect(revoked.effect_id).release_at is not None
    history = ledger.history(revoked.effect_id)
    assert [h.to_status for h in history][-2:] == [EffectStatus.SCHEDULED, EffectStatus.REVOKED]

"""Tests of the test harness itself (tests/conftest.py and ./scripts/test)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from conftest import PgServer, selected_backends, with_dbname

_created: list[str] = []


def test_pg_url_is_a_fresh_database(pg_url: str) -> None:
    import psycopg

    assert pg_url.startswith("postgresql://")
    dbname = urlsplit(pg_url).path.lstrip("/")
    assert dbname.startswith("lgc_") and len(dbname) == len("lgc_") + 12
    _created.append(dbname)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SELECT current_database()").fetchone() == (dbname,)
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
        assert tables == (0,)


def test_pg_server_settings_and_cleanup(pg_dsn: str) -> None:
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        if os.environ.get("PG_CTL_DATADIR"):  # the server ./scripts/test started
            row = conn.execute("SHOW max_connections").fetchone()
            assert row is not None and int(row[0]) >= 200
        # The database of the test above was dropped at its teardown.
        for dbname in _created:
            found = conn.execute(
                "SELECT count(*) FROM pg_database WHERE datname = %s", (dbname,)
            ).fetchone()
            assert found == (0,), f"{dbname} was not dropped"


def test_db_url_scheme(db_url: str, request: pytest.FixtureRequest) -> None:
    backend = request.node.callspec.params["db_url"]
    assert backend in selected_backends()
    expected = {"memory": "memory://", "sqlite": "sqlite:////", "postgres": "postgresql://"}
    assert db_url.startswith(expected[backend])
    if backend == "memory":
        assert db_url == "memory://"
    if backend == "sqlite":
        assert db_url.endswith("/ledger.db")


def test_sqlite_url_is_absolute(sqlite_url: str, tmp_path: object) -> None:
    assert sqlite_url == f"sqlite:///{tmp_path}/ledger.db"
    assert sqlite_url.startswith("sqlite:////")


def test_with_dbname_handles_urls_and_conninfo() -> None:
    assert (
        with_dbname("postgresql://postgres@127.0.0.1:5432/postgres?sslmode=disable", "lgc_x")
        == "postgresql://postgres@127.0.0.1:5432/lgc_x?sslmode=disable"
    )
    assert (
        with_dbname("host=127.0.0.1 port=5433 user=bob password=s3cr3t dbname=postgres", "d")
        == "postgresql://bob:s3cr3t@127.0.0.1:5433/d"
    )


def test_pg_server_restart_keeps_port_and_data(pg_server: PgServer, pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (42)")
    before = pg_server.pid()
    assert before is not None
    pg_server.restart()
    after = pg_server.pid()
    assert after is not None and after != before
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT x FROM t").fetchone() == (42,)


def test_pg_server_kill9_and_start(pg_server: PgServer, pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (7)")
    pg_server.kill9()
    assert pg_server.pid() is None
    pg_server.start()
    assert pg_server.pid() is not None
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT x FROM t").fetchone() == (7,)

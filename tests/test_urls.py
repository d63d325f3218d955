"""``langgraph_cancel.urls``: every spelling of a database, and a clear error for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from langgraph_cancel.errors import InvalidURLError
from langgraph_cancel.urls import Backend, parse_database_url, redact


@pytest.mark.parametrize(
    ("given", "backend", "url", "path"),
    [
        ("memory://", Backend.MEMORY, "memory://", None),
        ("memory", Backend.MEMORY, "memory://", None),
        (":memory:", Backend.MEMORY, "memory://", None),
        ("sqlite:///:memory:", Backend.MEMORY, "memory://", None),
        ("sqlite:///agent.db", Backend.SQLITE, "sqlite:///agent.db", "agent.db"),
        ("sqlite:////srv/agent.db", Backend.SQLITE, "sqlite:////srv/agent.db", "/srv/agent.db"),
        ("agent.db", Backend.SQLITE, "sqlite:///agent.db", "agent.db"),
        ("data/agent.sqlite", Backend.SQLITE, "sqlite:///data/agent.sqlite", "data/agent.sqlite"),
        ("  /srv/agent.db  ", Backend.SQLITE, "sqlite:////srv/agent.db", "/srv/agent.db"),
        (
            "postgresql://me:pw@db:5432/app",
            Backend.POSTGRES,
            "postgresql://me:pw@db:5432/app",
            None,
        ),
        ("postgres://db/app", Backend.POSTGRES, "postgresql://db/app", None),
        ("postgresql+psycopg://db/app", Backend.POSTGRES, "postgresql://db/app", None),
        ("postgresql:///app", Backend.POSTGRES, "postgresql:///app", None),
        (
            "postgresql://db/app?sslmode=require",
            Backend.POSTGRES,
            "postgresql://db/app?sslmode=require",
            None,
        ),
    ],
)
def test_accepted(given: str, backend: Backend, url: str, path: str | None) -> None:
    parsed = parse_database_url(given)
    assert (parsed.backend, parsed.url, parsed.path, parsed.given) == (backend, url, path, given)


def test_home_is_expanded() -> None:
    parsed = parse_database_url("~/agent.db")
    assert parsed.path == str(Path.home() / "agent.db")


def test_absolute_pins_a_relative_sqlite_path(tmp_path: Path) -> None:
    relative = parse_database_url("sqlite:///sub/agent.db")
    pinned = relative.absolute(tmp_path)
    assert pinned.path == str(tmp_path / "sub" / "agent.db")
    assert pinned.url == "sqlite:///" + str(tmp_path / "sub" / "agent.db")
    assert pinned.absolute(tmp_path / "elsewhere") == pinned  # already absolute
    postgres = parse_database_url("postgresql://db/app")
    assert postgres.absolute(tmp_path) is postgres


@pytest.mark.parametrize(
    ("given", "expect"),
    [
        ("postgresql:/bad", "malformed PostgreSQL URL 'postgresql:/bad'"),
        ("postgres:db/app", "malformed PostgreSQL URL"),
        ("postgresql://db:port/app", "cannot read its host and port"),
        ("sqlite:/agent.db", "malformed SQLite URL 'sqlite:/agent.db'"),
        ("sqlite:agent.db", "three slashes"),
        ("sqlite:///", "names no file"),
        ("mysql://root@localhost/app", "unsupported database URL 'mysql://root@localhost/app'"),
        ("file:/tmp/agent.db", "unsupported database URL"),
        ("host=localhost dbname=app", "libpq keyword/value string"),
        ("", "empty database URL"),
        ("   ", "empty database URL"),
    ],
)
def test_refused_with_what_to_write(given: str, expect: str) -> None:
    with pytest.raises(InvalidURLError) as caught:
        parse_database_url(given)
    message = str(caught.value)
    assert expect in message, message
    assert "postgresql://user:password@host:port/dbname" in message or "sqlite:///" in message


def test_errors_never_show_a_password() -> None:
    for given in ("postgresql://me:s3cret#x@db/app", "postgresql://me:s3cret@db:port/app"):
        with pytest.raises(InvalidURLError) as caught:
            parse_database_url(given)
        assert "s3cret" not in str(caught.value), caught.value


def test_redacted() -> None:
    assert parse_database_url("postgresql://me:pw@db/app").redacted == "postgresql://me:***@db/app"
    assert parse_database_url("postgresql://me@db/app").redacted == "postgresql://me@db/app"
    assert redact("postgresql://me:p@ss@db/app") == "postgresql://me:***@db/app"
    assert parse_database_url("agent.db").redacted == "sqlite:///agent.db"


def test_non_string_is_refused() -> None:
    with pytest.raises(InvalidURLError, match="a database URL is a string"):
        parse_database_url(42)  # type: ignore[arg-type]

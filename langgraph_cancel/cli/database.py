"""Opening the database a command names: checked first, so a mistake is one clear line.

A missing SQLite file is an error (a typo must not create an empty
database), except for the demo, which creates its own. A PostgreSQL server is
tried once with a short timeout before the ledger's pool is opened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langgraph_cancel.cli.config import PROG, Database
from langgraph_cancel.errors import CommandLineError
from langgraph_cancel.urls import ENV_DB, DatabaseURL

if TYPE_CHECKING:
    from langgraph_cancel.ledger import Ledger

#: Seconds to wait for a PostgreSQL server before saying it cannot be reached.
CONNECT_TIMEOUT = 5
#: Connections of a command's PostgreSQL saver, shared with its ledger.
SAVER_POOL_SIZE = 4
#: Seconds a command waits for one of them (after a server restart, the pool
#: reconnects with a growing backoff): then its step fails, and ``sweep --watch``
#: tries again at its next pass.
SAVER_POOL_TIMEOUT = 10.0


def check_reachable(url: DatabaseURL, *, create: bool = False) -> None:
    """Make sure the database exists and answers.

    Args:
        url: The database (a SQLite path already absolute).
        create: Create a missing SQLite file's directory instead of refusing.

    Raises:
        CommandLineError: No such SQLite file, the PostgreSQL extra is not
            installed, or the server does not answer.
    """
    if url.is_sqlite:
        assert url.path is not None
        path = Path(url.path)
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.is_file():
            raise CommandLineError(
                f"no database at {path} (run `{PROG} demo`, or point --db or ${ENV_DB} at "
                "your agent's database)"
            )
        return
    if url.is_postgres:
        try:
            import psycopg
        except ImportError as exc:
            raise CommandLineError(
                "PostgreSQL needs the extra: pip install 'langgraph-cancel[postgres]'"
            ) from exc
        try:
            with psycopg.connect(url.url, connect_timeout=CONNECT_TIMEOUT):
                pass
        except psycopg.Error as exc:
            text = str(exc).strip()
            first = text.splitlines()[0] if text else type(exc).__name__
            raise CommandLineError(f"cannot connect to {url.redacted}: {first}") from exc


@contextlib.contextmanager
def open_ledger(db: Database, *, create: bool = False) -> Iterator[Ledger]:
    """The ledger on ``db``, closed afterwards."""
    from langgraph_cancel.ledger import Ledger

    check_reachable(db.url, create=create)
    ledger = Ledger.from_url(db.url.url)
    try:
        yield ledger
    finally:
        ledger.close()


@contextlib.contextmanager
def open_saver(db: Database, *, create: bool = False) -> Iterator[Any]:
    """A cancel-aware checkpointer on ``db``, set up: memory, SQLite or PostgreSQL."""
    check_reachable(db.url, create=create)
    if db.url.is_memory:
        from langgraph_cancel.checkpointers.memory import MemoryCancelSaver

        yield MemoryCancelSaver()
        return
    if db.url.is_sqlite:
        from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver

        assert db.url.path is not None
        with SqliteCancelSaver.from_conn_string(db.url.path) as saver:
            saver.setup()
            yield saver
        return
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

    # A pool that checks each connection it hands out, rather than the one connection
    # of ``from_conn_string``: ``sweep --watch`` runs for as long as the workers do, and
    # must outlive a restart of the server, or connections it terminates, as they do.
    with ConnectionPool(
        db.url.url,
        min_size=1,
        max_size=SAVER_POOL_SIZE,
        check=ConnectionPool.check_connection,
        timeout=SAVER_POOL_TIMEOUT,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    ) as pool:
        pg_saver = PostgresCancelSaver(pool)
        pg_saver.setup()
        yield pg_saver


__all__ = ["CONNECT_TIMEOUT", "check_reachable", "open_ledger", "open_saver"]

"""Which ledger a run uses: the ledger follows the checkpointer.

In order:

1. the one given explicitly: ``add_cancellation(..., ledger=)`` or a node's
   ``ledger=`` (a ``Ledger`` or a URL), or ``config["configurable"]
   ["langgraph_cancel_ledger"]``;
2. the graph's checkpointer's own, for our savers (``saver.ledger``);
3. ``$LANGGRAPH_CANCEL_DB`` (how a served graph finds its ledger);
4. for LangGraph's official savers (``SqliteSaver``, ``AsyncSqliteSaver``,
   ``PostgresSaver``, ``AsyncPostgresSaver``), a ledger in the same database;
5. for any other checkpointer (``InMemorySaver``, a server's in-memory saver),
   an in-memory ledger that lives as long as that checkpointer;
6. no checkpointer, or no thread: an in-memory ledger for this run alone
   (``None`` here: the caller makes it).

For 5 and 6 one warning says that nothing is durable. A library call never
creates a file on its own.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import warnings
import weakref
from typing import Any

from langchain_core.runnables import RunnableConfig

from langgraph_cancel.errors import ConfigurationError
from langgraph_cancel.ledger import Ledger, PostgresBackend, SqliteBackend
from langgraph_cancel.urls import ENV_DB

logger = logging.getLogger("langgraph_cancel")

CONFIG_KEY_LEDGER = "langgraph_cancel_ledger"
_CONFIG_KEY_CHECKPOINTER = "__pregel_checkpointer"

# Process-wide (see ``langgraph_cancel.process``): one ledger, so one connection pool,
# per database and one per checkpointer, shared by every run that uses it. The ones
# beside a saver are weak, so they end with their saver.
#: Guards ``LEDGERS_BY_URL``, ``LEDGERS_BY_SAVER`` and ``WARNED_NOT_DURABLE``.
LEDGERS_LOCK = threading.Lock()
LEDGERS_BY_URL: dict[str, Ledger] = {}
LEDGERS_BY_SAVER: weakref.WeakKeyDictionary[Any, Ledger] = weakref.WeakKeyDictionary()
#: One warning per process for each in-memory ledger, not one per run.
WARNED_NOT_DURABLE: set[str] = set()


class NotDurableWarning(UserWarning):
    """The run's ledger is in memory: nothing of it survives the process."""


def ledger_for_url(url: str) -> Ledger:
    """A process-wide ledger per URL (opened and set up once)."""
    with LEDGERS_LOCK:
        ledger = LEDGERS_BY_URL.get(url)
        if ledger is None:
            ledger = LEDGERS_BY_URL[url] = Ledger.from_url(url)
        return ledger


def forget_url(url: str) -> None:
    """Close and forget the process-wide ledger of ``url``, if one is open."""
    with LEDGERS_LOCK:
        opened = LEDGERS_BY_URL.pop(url, None)
    if opened is not None:
        opened.close()


def coerce_ledger(target: Any) -> Ledger:
    """A ``Ledger`` from a ledger, a cancel-aware saver, or a database URL.

    Raises:
        ConfigurationError: For anything else.
    """
    if isinstance(target, Ledger):
        return target
    ledger = getattr(target, "ledger", None)
    if isinstance(ledger, Ledger):
        return ledger
    if isinstance(target, str):
        return ledger_for_url(target)
    raise ConfigurationError(
        f"cannot find a ledger in {type(target).__name__}: pass a Ledger, a *CancelSaver "
        "or a database URL"
    )


def checkpointer_of(config: RunnableConfig | None) -> Any:
    """The checkpointer LangGraph runs the graph with (None outside a graph, or without one)."""
    return ((config or {}).get("configurable") or {}).get(_CONFIG_KEY_CHECKPOINTER)


def explicit_source(config: RunnableConfig | None, bound: Any) -> Any:
    """The ledger named explicitly (rules 1-3), or None."""
    if bound is not None:
        return bound
    named = ((config or {}).get("configurable") or {}).get(CONFIG_KEY_LEDGER)
    if named is not None:
        return named
    saver = checkpointer_of(config)
    if saver is not None and isinstance(getattr(saver, "ledger", None), Ledger):
        return saver.ledger
    return os.environ.get(ENV_DB) or None


def resolve_ledger(config: RunnableConfig | None, bound: Any = None) -> Ledger | None:
    """The run's ledger by the rules above; None for a ledger of the run's own (rule 6).

    Raises:
        ConfigurationError: An official saver whose database cannot be found from
            this thread (a SQLite connection opened with ``check_same_thread=True``).
    """
    source = explicit_source(config, bound)
    if source is not None:
        ledger = coerce_ledger(source)
        if source is not bound and isinstance(source, Ledger):
            ledger.setup()  # the checkpointer's: it may not have been set up yet
        return ledger
    saver = checkpointer_of(config)
    if saver is None:
        _warn_once(
            "no-checkpointer",
            "langgraph-cancel: no checkpointer, so the effect ledger is in memory for this "
            "run only: nothing is durable and another process cannot cancel the run. Compile "
            "with a checkpointer, pass ledger=, or set LANGGRAPH_CANCEL_DB.",
        )
        return None
    return _saver_ledger(saver)


def known_saver_ledger(saver: Any) -> Ledger | None:
    """The ledger already opened beside ``saver`` (rules 4 and 5), if any."""
    with LEDGERS_LOCK:
        return LEDGERS_BY_SAVER.get(saver)


def _saver_ledger(saver: Any) -> Ledger:
    with LEDGERS_LOCK:
        found = LEDGERS_BY_SAVER.get(saver)
    if found is not None:
        return found
    ledger = _open_beside(saver)
    with LEDGERS_LOCK:
        return LEDGERS_BY_SAVER.setdefault(saver, ledger)


def _open_beside(saver: Any) -> Ledger:
    """A ledger in the saver's own database, or in memory beside it."""
    module = type(saver).__module__
    conn = getattr(saver, "conn", None)
    if module.startswith("langgraph.checkpoint.sqlite") and conn is not None:
        path = _sqlite_path(conn)
        if path:
            return ledger_for_url(f"sqlite:///{path}")
    elif module.startswith("langgraph.checkpoint.postgres") and conn is not None:
        ledger = Ledger(PostgresBackend(_pg_conninfo(conn), max_size=4))
        ledger.setup()
        return ledger
    return _memory_beside(type(saver).__name__)


def _memory_beside(name: str) -> Ledger:
    _warn_once(
        f"memory:{name}",
        f"langgraph-cancel: {name} keeps checkpoints in memory, so the effect ledger is in "
        "memory too: it lives as long as that checkpointer, and nothing survives the "
        "process. Use SqliteCancelSaver/PostgresCancelSaver, pass ledger=, or set "
        "LANGGRAPH_CANCEL_DB for a durable one.",
    )
    ledger = Ledger(SqliteBackend(":memory:"))
    ledger.setup()
    return ledger


def _sqlite_path(conn: Any) -> str | None:
    """The file of a SQLite connection (None: an in-memory database)."""
    raw = conn
    if not isinstance(raw, sqlite3.Connection):
        raw = getattr(conn, "_connection", None)  # aiosqlite's underlying connection
    if not isinstance(raw, sqlite3.Connection):
        raise ConfigurationError(
            f"cannot find the database of {type(conn).__name__}; pass ledger= or set {ENV_DB}"
        )
    try:
        rows = raw.execute("PRAGMA database_list").fetchall()
    except sqlite3.ProgrammingError as exc:
        raise ConfigurationError(
            "cannot read which file the SqliteSaver's connection uses from this thread "
            f"({exc}); open it with check_same_thread=False, pass ledger=, or set {ENV_DB}"
        ) from exc
    path = next((str(row[2]) for row in rows if row[1] == "main"), "")
    return path or None


async def aresolve_ledger(config: RunnableConfig | None, bound: Any = None) -> Ledger | None:
    """``resolve_ledger`` on an event loop (an async SQLite saver is asked on its own loop)."""
    if explicit_source(config, bound) is None:
        saver = checkpointer_of(config)
        conn = getattr(saver, "conn", None)
        if (
            saver is not None
            and type(saver).__module__.startswith("langgraph.checkpoint.sqlite")
            and conn is not None
            and not isinstance(conn, sqlite3.Connection)
        ):
            with LEDGERS_LOCK:
                found = LEDGERS_BY_SAVER.get(saver)
            if found is not None:
                return found
            cursor = await conn.execute("PRAGMA database_list")
            rows = await cursor.fetchall()
            path = next((str(row[2]) for row in rows if row[1] == "main"), "")
            ledger = (
                ledger_for_url(f"sqlite:///{path}") if path else _memory_beside("AsyncSqliteSaver")
            )
            with LEDGERS_LOCK:
                return LEDGERS_BY_SAVER.setdefault(saver, ledger)
    import asyncio

    return await asyncio.to_thread(resolve_ledger, config, bound)


def _pg_conninfo(conn: Any) -> str:
    """A connection string for a side pool on a saver's database (password included)."""
    conninfo = getattr(conn, "conninfo", None)  # a pool
    if isinstance(conninfo, str):
        return conninfo
    info = conn.info
    dsn: str = info.dsn
    password = getattr(info, "password", None)
    if password and "password=" not in dsn:
        dsn = f"{dsn} password={password}"
    return dsn


def _warn_once(key: str, text: str) -> None:
    with LEDGERS_LOCK:
        if key in WARNED_NOT_DURABLE:
            return
        WARNED_NOT_DURABLE.add(key)
    warnings.warn(text, NotDurableWarning, stacklevel=3)


__all__ = [
    "CONFIG_KEY_LEDGER",
    "ENV_DB",
    "NotDurableWarning",
    "aresolve_ledger",
    "checkpointer_of",
    "coerce_ledger",
    "explicit_source",
    "forget_url",
    "known_saver_ledger",
    "ledger_for_url",
    "resolve_ledger",
]

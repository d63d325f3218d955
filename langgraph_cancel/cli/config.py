"""What every command shares: the program's name, its default database, its version.

Standard library only: the parser and ``--version`` import this module, and
they must start at once.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from langgraph_cancel.urls import DEFAULT_DB_URL, ENV_DB, DatabaseURL, parse_database_url

PROG = "langgraph-cancel"

#: Set to print a traceback under an error's one line.
DEBUG_ENV = "LANGGRAPH_CANCEL_DEBUG"

#: How long a crashed worker's lease stays live (the library's default lease TTL).
LEASE_TTL_NOTE = "30 s"

#: The graph ``compensate``, ``resume`` and ``reconcile`` load without ``--graph``.
DEFAULT_GRAPH = "langgraph_cancel.demo.graph:graph"


@dataclass(frozen=True, slots=True)
class Database:
    """The database a command works on, and how to name it again.

    Attributes:
        url: The parsed URL, a SQLite path made absolute.
        flag: `` --db X`` to repeat in a suggested command; empty when the
            database was not given on the command line (the suggestion then
            finds it the same way).
        builtin: True for the command line's own default file (no ``--db``,
            no ``$LANGGRAPH_CANCEL_DB``).
    """

    url: DatabaseURL
    flag: str
    builtin: bool


def resolve_database(given: DatabaseURL | None) -> Database:
    """The database of ``--db`` (already parsed), else ``$LANGGRAPH_CANCEL_DB``, else the default.

    Raises:
        InvalidURLError: When ``$LANGGRAPH_CANCEL_DB`` is malformed.
    """
    if given is not None:
        return Database(given.absolute(), f" --db {shlex.quote(given.given)}", builtin=False)
    from_env = os.environ.get(ENV_DB, "").strip()
    if from_env:
        return Database(parse_database_url(from_env).absolute(), "", builtin=False)
    return Database(parse_database_url(DEFAULT_DB_URL).absolute(), "", builtin=True)


def version() -> str:
    """The package's version (the one its distribution is built with)."""
    from langgraph_cancel import __version__

    return __version__

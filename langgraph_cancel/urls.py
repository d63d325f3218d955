"""Database URLs: one parser for every place that takes one.

A database is named by a URL or by a bare file path:

========================================= ===========================================
``memory://`` (also ``memory``, ``:memory:``) this process's memory: nothing persists
``sqlite:///relative/file.db``              a SQLite file, relative to the working directory
``sqlite:////absolute/file.db``             a SQLite file, absolute path (four slashes)
``path/to/file.db``, ``~/agent.db``         a bare path: a SQLite file
``postgresql://user:pw@host:port/dbname``   a PostgreSQL database (``postgres://`` and
                                            ``postgresql+psycopg://`` are the same)
========================================= ===========================================

Anything that looks like a URL but is not one of these (``postgresql:/bad``,
``mysql://...``, a libpq ``host=... dbname=...`` string) raises
:class:`~langgraph_cancel.errors.InvalidURLError` with a message saying what to
write instead, rather than being taken for a file name.

The module imports nothing beyond the standard library, so a command line can
parse its ``--db`` before deciding what else to import.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from enum import Enum
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from langgraph_cancel.errors import InvalidURLError

#: The environment variable naming the database when none is given.
ENV_DB = "LANGGRAPH_CANCEL_DB"

#: The command line's own database when neither ``--db`` nor ``$LANGGRAPH_CANCEL_DB``
#: names one: an embedded SQLite file in the working directory (the library itself
#: never picks a file).
DEFAULT_DB_URL = "sqlite:///.langgraph-cancel.db"

_MEMORY_SPELLINGS = frozenset(
    {"memory", ":memory:", "memory://", "sqlite://", "sqlite:///:memory:"}
)
_POSTGRES_SCHEMES = frozenset({"postgresql", "postgres", "postgresql+psycopg"})
_KNOWN_SCHEMES = _POSTGRES_SCHEMES | {"sqlite", "memory"}
# A scheme followed by ':' and at least one '/', or a known scheme followed by ':'.
_URL_LIKE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?P<rest>.*)$", re.DOTALL)
# The password of a URL's user info ("//user:password@"), whatever it contains.
_PASSWORD = re.compile(r"(?P<user>//[^:/@]*:)[^/]*@(?=[^@]*$)")
# A libpq keyword/value string: "host=localhost dbname=app user=me".
_CONNINFO = re.compile(r"^\s*[A-Za-z_]+\s*=\s*\S")

_SQLITE_HINT = "use sqlite:///relative/file.db, sqlite:////absolute/file.db or a file path"
_POSTGRES_HINT = "use postgresql://user:password@host:port/dbname"


class Backend(str, Enum):
    """Which kind of database a URL names."""

    MEMORY = "memory"
    SQLITE = "sqlite"
    POSTGRES = "postgres"


#: The values of :class:`Backend`, for type hints of plain strings.
BackendName = Literal["memory", "sqlite", "postgres"]


@dataclass(frozen=True, slots=True)
class DatabaseURL:
    """A parsed database URL.

    Attributes:
        backend: The kind of database.
        url: The canonical URL: ``memory://``, ``sqlite:///<path>`` or
            ``postgresql://...`` (``postgres://`` and ``postgresql+psycopg://``
            are rewritten to ``postgresql://``). What ``Ledger.from_url`` takes.
        path: The SQLite file (as written, ``~`` expanded), else ``None``.
        given: The text the URL was parsed from.
    """

    backend: Backend
    url: str
    path: str | None
    given: str

    @property
    def is_memory(self) -> bool:
        """True for ``memory://``: nothing outlives the process."""
        return self.backend is Backend.MEMORY

    @property
    def is_sqlite(self) -> bool:
        """True for a SQLite file."""
        return self.backend is Backend.SQLITE

    @property
    def is_postgres(self) -> bool:
        """True for a PostgreSQL database."""
        return self.backend is Backend.POSTGRES

    @property
    def redacted(self) -> str:
        """The URL with its password, if any, replaced by ``***`` (for messages and logs)."""
        return redact(self.url) if self.is_postgres else self.url

    def absolute(self, base: str | os.PathLike[str] | None = None) -> DatabaseURL:
        """The same database with a SQLite path made absolute.

        Args:
            base: The directory a relative path is taken from (default: the
                working directory).

        Returns:
            A new ``DatabaseURL`` (``self`` for memory and PostgreSQL URLs).
        """
        if self.path is None or os.path.isabs(self.path):
            return self
        root = os.fspath(base) if base is not None else os.getcwd()
        path = os.path.normpath(os.path.join(root, self.path))
        return replace(self, url="sqlite:///" + path, path=path)


def parse_database_url(value: str) -> DatabaseURL:
    """Parse a database URL or a bare SQLite file path.

    Args:
        value: ``memory://``, ``sqlite:///file.db``, ``postgresql://...``,
            ``postgres://...`` or a file path (see the module docstring).

    Returns:
        The parsed URL. A relative SQLite path stays relative; call
        :meth:`DatabaseURL.absolute` to pin it to a directory.

    Raises:
        InvalidURLError: For an empty value, a URL of an unsupported scheme, a
            malformed SQLite or PostgreSQL URL (``postgresql:/bad``), or a libpq
            keyword/value string.
    """
    if not isinstance(value, str):
        raise InvalidURLError(f"a database URL is a string, not {type(value).__name__}")
    text = value.strip()
    if not text:
        raise InvalidURLError(f"empty database URL: {_SQLITE_HINT}, or {_POSTGRES_HINT}")
    if text.lower() in _MEMORY_SPELLINGS or text.lower().startswith("memory://"):
        return DatabaseURL(Backend.MEMORY, "memory://", None, value)
    match = _URL_LIKE.match(text)
    if match is not None:
        scheme = match["scheme"].lower()
        rest = match["rest"]
        if scheme == "sqlite":
            return _parse_sqlite(text, rest, value)
        if scheme in _POSTGRES_SCHEMES:
            return _parse_postgres(text, scheme, value)
        if scheme in _KNOWN_SCHEMES or rest.startswith("/"):
            raise InvalidURLError(
                f"unsupported database URL {_shown(text)}: {_SQLITE_HINT}, or {_POSTGRES_HINT}"
            )
    if _CONNINFO.match(text):
        raise InvalidURLError(
            f"{_shown(text)} looks like a libpq keyword/value string, not a URL: {_POSTGRES_HINT}"
        )
    path = os.path.expanduser(text)
    return DatabaseURL(Backend.SQLITE, "sqlite:///" + path, path, value)


def redact(url: str) -> str:
    """``url`` with the password of its user info replaced by ``***``."""
    return _PASSWORD.sub(r"\g<user>***@", url)


def _shown(text: str) -> str:
    return repr(redact(text))


def _parse_sqlite(text: str, rest: str, given: str) -> DatabaseURL:
    if not rest.startswith("///"):
        raise InvalidURLError(
            f"malformed SQLite URL {text!r}: {_SQLITE_HINT} (three slashes before the path)"
        )
    path = os.path.expanduser(rest[3:])
    if not path:
        raise InvalidURLError(f"SQLite URL {text!r} names no file: {_SQLITE_HINT}")
    if path == ":memory:":
        return DatabaseURL(Backend.MEMORY, "memory://", None, given)
    return DatabaseURL(Backend.SQLITE, "sqlite:///" + path, path, given)


def _parse_postgres(text: str, scheme: str, given: str) -> DatabaseURL:
    if not text[len(scheme) + 1 :].startswith("//"):
        raise InvalidURLError(f"malformed PostgreSQL URL {_shown(text)}: {_POSTGRES_HINT}")
    try:
        parts: SplitResult = urlsplit(text)
        parts.port  # noqa: B018  (parses the port: a bad one raises ValueError)
    except ValueError:
        # Not the parser's message: it may quote part of a password.
        raise InvalidURLError(
            f"malformed PostgreSQL URL {_shown(text)}: cannot read its host and port "
            f"(in a password, '#', '/', '?' and '@' are written %23, %2F, %3F and %40); "
            f"{_POSTGRES_HINT}"
        ) from None
    if parts.fragment:
        raise InvalidURLError(
            f"malformed PostgreSQL URL {_shown(text)}: a '#' must be written %23; {_POSTGRES_HINT}"
        )
    # Rebuilt by hand: urlunsplit drops the "//" of an empty host (postgresql:///db).
    url = "postgresql:" + text[len(scheme) + 1 :]
    return DatabaseURL(Backend.POSTGRES, url, None, given)


__all__ = [
    "DEFAULT_DB_URL",
    "ENV_DB",
    "Backend",
    "BackendName",
    "DatabaseURL",
    "parse_database_url",
    "redact",
]

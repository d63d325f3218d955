"""Shared test fixtures: database URLs for every backend and the PostgreSQL harness.

Run the suite with ``./scripts/test``: it starts a throwaway PostgreSQL server and
exports the environment variables read here.

Fixtures (use them by name in a test's arguments):

``pg_dsn`` (session)
    DSN of the PostgreSQL *server* (from ``LANGGRAPH_CANCEL_TEST_PG_DSN``). Without
    it a test needing PostgreSQL is skipped locally and FAILS in CI (``CI=true``).
``pg_url`` (function)
    ``postgresql://...`` URL of a fresh, empty database created for this test and
    dropped (``WITH (FORCE)``) afterwards.
``sqlite_url`` (function)
    ``sqlite:////abs/path/ledger.db`` in the test's ``tmp_path`` (four slashes:
    absolute path, SQLAlchemy style).
``db_url`` (function, parametrised)
    One run per backend: ``"memory://"``, ``sqlite_url`` and ``pg_url`` (the last
    one marked ``postgres``). ``LGC_BACKENDS=memory,sqlite`` restricts the list.
    PostgreSQL is only required by the ``postgres`` parameter.
``ledger`` (function, parametrised like ``db_url``)
    A set-up ``Ledger`` on ``db_url``, closed afterwards.
``pg_server`` (function)
    A :class:`PgServer` handle on the server started by ``./scripts/test``
    (``stop()``, ``start()``, ``restart()``, ``kill9()``), for crash and
    reconnection tests. Skipped/failed like ``pg_dsn`` when the server was not
    started by the script (``PG_CTL_DATADIR`` unset).

Every test that (directly or through other fixtures) uses ``pg_dsn`` gets the
``postgres`` marker automatically, so ``-m "not postgres"`` deselects them.

Every test runs in an empty working directory of its own (and the session's
module-scoped fixtures in one of the session's), so a default file a test
creates lands in a temporary directory, never in the repository.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import pytest

from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledgers import forget_url

PG_DSN_ENV = "LANGGRAPH_CANCEL_TEST_PG_DSN"

# Hypothesis keeps its caches (the Unicode tables, ...) in ./.hypothesis of the directory
# it was imported in, here the repository; keep them in the temporary directory instead.
os.environ.setdefault(
    "HYPOTHESIS_STORAGE_DIRECTORY",
    str(Path(tempfile.gettempdir()) / "langgraph-cancel-hypothesis-home"),
)
BACKENDS_ENV = "LGC_BACKENDS"
ALL_BACKENDS: tuple[str, ...] = ("memory", "sqlite", "postgres")


def in_ci() -> bool:
    """True when running in CI (``CI`` is ``true`` or ``1``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require_or_skip(reason: str) -> None:
    """Skip the test locally, but fail it in CI, where nothing may be skipped silently."""
    if in_ci():
        pytest.fail(f"{reason} (CI must run the PostgreSQL tests; run via ./scripts/test)")
    pytest.skip(reason)


def selected_backends() -> tuple[str, ...]:
    """The backends named by ``LGC_BACKENDS`` (comma separated), default all of them."""
    raw = os.environ.get(BACKENDS_ENV, "").strip()
    if not raw:
        return ALL_BACKENDS
    chosen = [b.strip().lower() for b in raw.split(",") if b.strip()]
    return tuple(b for b in ALL_BACKENDS if b in chosen)


def pytest_configure(config: pytest.Config) -> None:
    raw = os.environ.get(BACKENDS_ENV, "").strip()
    if raw:
        unknown = {b.strip().lower() for b in raw.split(",") if b.strip()} - set(ALL_BACKENDS)
        if unknown:
            raise pytest.UsageError(
                f"{BACKENDS_ENV}: unknown backend(s) {sorted(unknown)}; "
                f"choose from {', '.join(ALL_BACKENDS)}"
            )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "pg_dsn" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


# --------------------------------------------------------------------------- working directory


@pytest.fixture(scope="session", autouse=True)
def _session_working_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The session's fixtures run in a temporary directory, not where pytest started."""
    before = Path.cwd()
    os.chdir(tmp_path_factory.mktemp("session-cwd"))
    try:
        yield
    finally:
        os.chdir(before)


@pytest.fixture(autouse=True)
def _test_working_directory(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test runs in an empty directory of its own (apart from its ``tmp_path``)."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


# --------------------------------------------------------------------------- PostgreSQL


def with_dbname(dsn: str, dbname: str) -> str:
    """Return a ``postgresql://`` URL for database ``dbname`` on the server of ``dsn``.

    Args:
        dsn: A ``postgresql://`` / ``postgres://`` URL or a ``key=value`` conninfo string.
        dbname: The database to point at.
    """
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        return urlunsplit(("postgresql", parts.netloc, "/" + quote(dbname), parts.query, ""))
    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    user = params.pop("user", "")
    password = params.pop("password", "")
    host = params.pop("host", "")
    port = params.pop("port", "")
    params.pop("dbname", None)
    auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
    netloc = (auth + "@" if auth else "") + host + (":" + port if port else "")
    return urlunsplit(("postgresql", netloc, "/" + quote(dbname), urlencode(params), ""))


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """DSN of the PostgreSQL test server (``LANGGRAPH_CANCEL_TEST_PG_DSN``).

    Skips the test when unset, except in CI, where it fails it.
    """
    dsn = os.environ.get(PG_DSN_ENV, "").strip()
    if not dsn:
        if in_ci():
            pytest.fail(
                f"{PG_DSN_ENV} is not set: PostgreSQL tests must run in CI. "
                "Run the suite with ./scripts/test, which starts a PostgreSQL server."
            )
        pytest.skip("no PostgreSQL: run ./scripts/test")
    return dsn


def _admin_execute(dsn: str, statement: str, dbname: str) -> None:
    import psycopg
    from psycopg import sql

    query = sql.SQL(statement).format(sql.Identifier(dbname))
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(query)


@contextlib.contextmanager
def fresh_database(dsn: str, prefix: str = "lgc") -> Iterator[str]:
    """URL of a fresh database ``<prefix>_<12 hex>`` on ``dsn``'s server, dropped on exit."""
    dbname = f"{prefix}_{uuid.uuid4().hex[:12]}"
    _admin_execute(dsn, "CREATE DATABASE {}", dbname)
    url = with_dbname(dsn, dbname)
    try:
        yield url
    finally:
        # The ledger the package keeps for a URL handed to its API (``request_cancel``,
        # ``get_report``) would outlive the database: its pool would keep dialling it.
        forget_url(url)
        # The test may have restarted or stopped the server: retry for a little while.
        last: Exception | None = None
        for _ in range(20):
            try:
                _admin_execute(dsn, "DROP DATABASE IF EXISTS {} WITH (FORCE)", dbname)
                break
            except Exception as exc:  # pragma: no cover - depends on the test's doings
                last = exc
                time.sleep(0.5)
        else:
            warnings.warn(f"could not drop test database {dbname}: {last}", stacklevel=1)


@pytest.fixture
def pg_url(pg_dsn: str) -> Iterator[str]:
    """URL of a fresh database ``lgc_<12 hex>`` on the test server, dropped afterwards."""
    with fresh_database(pg_dsn) as url:
        yield url


# --------------------------------------------------------------------------- SQLite / db_url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """``sqlite:////<tmp_path>/ledger.db`` (absolute path, four slashes)."""
    return "sqlite:///" + str((tmp_path / "ledger.db").resolve())


@pytest.fixture(
    params=[
        pytest.param(b, id=b, marks=[pytest.mark.postgres] if b == "postgres" else [])
        for b in selected_backends()
    ]
)
def db_url(request: pytest.FixtureRequest) -> str:
    """One database URL per backend: ``memory://``, ``sqlite:////...``, ``postgresql://...``.

    The backend name is ``request.param`` (also the test id suffix, e.g.
    ``test_x[sqlite]``). Restrict with ``LGC_BACKENDS=memory,sqlite``.
    """
    backend: str = request.param
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        url: str = request.getfixturevalue("sqlite_url")
        return url
    url = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    """A set-up ``Ledger`` on ``db_url`` (every backend), closed afterwards."""
    led = Ledger.from_url(db_url)
    try:
        yield led
    finally:
        led.close()


# --------------------------------------------------------------------------- server control


@dataclass
class PgServer:
    """Handle on the throwaway PostgreSQL server started by ``./scripts/test``.

    Attributes:
        dsn: Server DSN (the ``postgres`` database).
        datadir: The cluster's data directory (``PG_CTL_DATADIR``).
        bin_dir: Directory holding ``pg_ctl`` (``PG_BIN_DIR``).
        os_user: OS user owning the cluster (``PG_CTL_USER``) when it differs from
            the current one (the script runs PostgreSQL as ``postgres`` under root).
    """

    dsn: str
    datadir: Path
    bin_dir: Path
    os_user: str | None = None

    def pg_ctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``pg_ctl -D <datadir> <args>`` as the cluster's OS user; raise on failure."""
        cmd = [str(self.bin_dir / "pg_ctl"), "-D", str(self.datadir), *args]
        if self.os_user and os.geteuid() == 0:
            if shutil.which("runuser"):
                cmd = ["runuser", "-u", self.os_user, "--", *cmd]
            else:
                cmd = ["su", "-s", "/bin/sh", self.os_user, "-c", subprocess.list2cmdline(cmd)]
        # Output goes to a file, not a pipe: a postmaster started by pg_ctl could
        # inherit the pipe and keep it open, and we would wait for EOF forever.
        with tempfile.TemporaryFile(mode="w+") as out:
            proc = subprocess.run(
                cmd,
                cwd=self.datadir.parent,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
            )
            out.seek(0)
            output = out.read()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output}")
        return subprocess.CompletedProcess(cmd, proc.returncode, output, "")

    def pid(self) -> int | None:
        """The postmaster's pid, or None when the server is not running."""
        try:
            first = (self.datadir / "postmaster.pid").read_text().splitlines()[0]
            pid = int(first)
            os.kill(pid, 0)
        except (FileNotFoundError, IndexError, ValueError, ProcessLookupError):
            return None
        except PermissionError:
            return int(first)
        return pid

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode``: smart, fast or immediate) and wait for it."""
        self.pg_ctl("stop", "-m", mode, "-w")

    @property
    def logfile(self) -> Path:
        """The server log (next to the data directory)."""
        return self.datadir.parent / "postgres.log"

    def start(self) -> None:
        """Start the server (same port and settings) and wait until it accepts connections."""
        self.pg_ctl("start", "-w", "-t", "60", "-l", str(self.logfile))

    def restart(self, mode: str = "fast") -> None:
        """Restart the server, dropping every connection, and wait until it is back."""
        self.pg_ctl("restart", "-m", mode, "-w", "-t", "60", "-l", str(self.logfile))

    def kill9(self, *, flush_first: bool = True) -> None:
        """SIGKILL the postmaster (a server crash); call :meth:`start` to recover.

        The test server runs with ``synchronous_commit=off``, so a commit acknowledged
        less than ~0.6 s before a crash can be lost. With ``flush_first`` (the default)
        a ``CHECKPOINT`` runs first, so every acknowledged commit survives, as it would
        on a production server; pass ``False`` to crash with unflushed WAL.
        """
        pid = self.pid()
        if pid is None:
            raise RuntimeError("PostgreSQL is not running")
        if flush_first:
            import psycopg

            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                conn.execute("CHECKPOINT")
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if self.pid() is None:
                break
            time.sleep(0.1)
        # Children notice the dead postmaster and exit; wait for the port to free up.
        time.sleep(1.0)


@pytest.fixture
def pg_server(pg_dsn: str) -> Iterator[PgServer]:
    """Control of the test server; makes sure it is running again after the test."""
    datadir = os.environ.get("PG_CTL_DATADIR", "").strip()
    if not datadir:
        require_or_skip("PG_CTL_DATADIR not set: server control needs ./scripts/test's PostgreSQL")
    bin_dir = os.environ.get("PG_BIN_DIR", "").strip()
    if not bin_dir:
        found = shutil.which("pg_ctl")
        bin_dir = str(Path(found).resolve().parent) if found else ""
    if not bin_dir:
        require_or_skip("PG_BIN_DIR not set and pg_ctl not on PATH")
    server = PgServer(
        dsn=pg_dsn,
        datadir=Path(datadir),
        bin_dir=Path(bin_dir),
        os_user=os.environ.get("PG_CTL_USER", "").strip() or None,
    )
    yield server
    if server.pid() is None:
        server.start()

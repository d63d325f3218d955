"""The providers' SQLite file: transactions, record numbers and idempotency keys.

Every provider keeps its truth in this one file, apart from the agent's database, so a
test can compare what the agent's ledger *believes* with what the world *did*, across
processes and across ``kill -9``. Each call opens the file (WAL mode, a busy timeout),
does its work in one ``BEGIN IMMEDIATE`` transaction and closes it.

Every mutating call goes through :meth:`ProviderStore.mutate`, which honours
idempotency keys as Stripe does: the first request with a key is applied and its
response stored; a repeat of the key replays the stored response and applies nothing;
reusing a key for a different request raises
:class:`~langgraph_cancel.demo.providers.errors.IdempotencyKeyReused`; a request
arriving while another with the same key is still being processed waits for it.
Armed faults (:mod:`~langgraph_cancel.demo.providers.faults`) fire on the way.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from langgraph_cancel.demo.providers.errors import IdempotencyKeyReused
from langgraph_cancel.demo.providers.faults import (
    Fault,
    check_operation,
    parse_mode,
    store_fault,
    take_fault,
)
from langgraph_cancel.demo.providers.schema import (
    COUNTER_STARTS,
    ID_PREFIX,
    SCHEMA,
    SCHEMA_VERSION,
    SEED_ORDERS,
    SEED_POLICIES,
)

#: Seconds between two looks at a key another caller is still processing.
BUSY_POLL = 0.02

#: What a mutating call applies inside the store's transaction: its response.
Apply = Callable[[sqlite3.Connection], dict[str, Any]]


def now_iso() -> str:
    """The time now, as the providers stamp their records (UTC, milliseconds)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def row_dict(row: sqlite3.Row | None, json_columns: Sequence[str] = ()) -> dict[str, Any] | None:
    """A row as a dict, its JSON columns decoded (``None`` for no row)."""
    if row is None:
        return None
    data = {name: row[name] for name in row.keys()}  # noqa: SIM118 - sqlite3.Row
    for column in json_columns:
        if data.get(column) is not None:
            data[column] = json.loads(data[column])
    return data


def require_row(row: dict[str, Any] | None) -> dict[str, Any]:
    """A row just written in the same transaction, which cannot be missing."""
    if row is None:  # pragma: no cover - rows just written
        raise RuntimeError("row vanished inside its own transaction")
    return row


def _canonical(request: Mapping[str, Any]) -> str:
    return json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key.strip():
        raise ValueError("an idempotency key must be a non-empty string")


class ProviderStore:
    """The SQLite file the providers share, and the idempotency of their calls.

    Instances hold no state but the path and two timeouts, so they are cheap, and any
    number of processes may use the same file.

    Args:
        path: The SQLite file (created and seeded on first open).
        busy_timeout: Seconds to wait for another process's write lock.
        in_flight_grace: Seconds after a ``hang`` fault's end before a request
            still marked in flight is presumed lost (its process died).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        in_flight_grace: float = 5.0,
    ) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self.in_flight_grace = in_flight_grace
        self._ensure_schema()

    def __repr__(self) -> str:
        return f"ProviderStore({str(self.path)!r})"

    # ------------------------------------------------------------ connections

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        return conn

    @contextmanager
    def transaction(self, mode: str = "IMMEDIATE") -> Iterator[sqlite3.Connection]:
        """A connection in one transaction (``BEGIN mode``), committed unless it raises."""
        conn = self._connect()
        try:
            conn.execute(f"BEGIN {mode}")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    def _ensure_schema(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = self._connect()
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            try:
                found = conn.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
            except sqlite3.OperationalError:
                found = None
        finally:
            conn.close()
        if found is not None and found["v"] == SCHEMA_VERSION:
            return
        with self.transaction() as conn:
            for statement in SCHEMA:
                conn.execute(statement)
            if conn.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone() is not None:
                return  # another process seeded it meanwhile
            self._seed(conn)

    @staticmethod
    def _seed(conn: sqlite3.Connection) -> None:
        now = now_iso()
        conn.executemany(
            "INSERT INTO orders (order_id, customer, email, total, currency, status, note,"
            " updated_at) VALUES (?, ?, ?, ?, 'USD', ?, '', ?)",
            [
                (order_id, name, mail, total, status, now)
                for order_id, name, mail, total, status in SEED_ORDERS
            ],
        )
        conn.executemany(
            "INSERT INTO policies (policy_id, title, body) VALUES (?, ?, ?)", SEED_POLICIES
        )
        conn.executemany(
            "INSERT INTO counters (name, next) VALUES (?, ?)", list(COUNTER_STARTS.items())
        )
        conn.execute("INSERT INTO meta (k, v) VALUES ('schema', ?)", (SCHEMA_VERSION,))

    @staticmethod
    def next_id(conn: sqlite3.Connection, counter: str) -> str:
        """The next id of a kind of record (``r-4471``), taken inside ``conn``'s transaction."""
        row = conn.execute("SELECT next FROM counters WHERE name = ?", (counter,)).fetchone()
        number = int(row["next"])
        conn.execute("UPDATE counters SET next = ? WHERE name = ?", (number + 1, counter))
        return f"{ID_PREFIX[counter]}-{number}"

    # ------------------------------------------------------------------ faults

    def set_fault(self, operation: str, mode: str, *, times: int | None = None) -> None:
        """Arm (or clear, with ``mode="none"``) a fault for one operation.

        The fault is stored in the file, so it fires in whichever process makes
        the next request.

        Args:
            operation: One of :data:`~langgraph_cancel.demo.providers.faults.OPERATIONS`,
                e.g. ``"refund"`` or ``"find_refund"``.
            mode: ``none``, ``fail_before``, ``fail_after`` or ``hang:SECONDS``.
            times: Fire for this many requests, then clear; ``None``: until cleared.

        Raises:
            ValueError: For an unknown operation or mode, or ``times < 1``.
        """
        check_operation(operation)
        parsed = parse_mode(mode)
        if times is not None and times < 1:
            raise ValueError("times must be at least 1")
        with self.transaction() as conn:
            store_fault(conn, operation, parsed, times)

    def clear_faults(self) -> None:
        """Disarm every fault."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM faults")

    def faults(self) -> dict[str, Fault]:
        """The armed faults, by operation."""
        with self.transaction("DEFERRED") as conn:
            rows = conn.execute("SELECT operation, mode, remaining FROM faults").fetchall()
        return {
            row["operation"]: Fault(row["operation"], row["mode"], row["remaining"]) for row in rows
        }

    # ------------------------------------------------------------------ reads

    def read(self, operation: str, query: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run a read under the operation's fault, if one is armed."""
        with self.transaction() as conn:
            fault = take_fault(conn, operation)
        if fault is not None and fault.mode == "fail_before":
            raise ConnectionError(f"injected fault: {operation} failed before reaching the server")
        if fault is not None and fault.hang_seconds:
            time.sleep(fault.hang_seconds)
        with self.transaction("DEFERRED") as conn:
            result = query(conn)
        if fault is not None and fault.mode == "fail_after":
            raise TimeoutError(f"injected fault: {operation} response lost")
        return result

    def find(
        self, operation: str, table: str, key: str, json_columns: Sequence[str] = ()
    ) -> dict[str, Any] | None:
        """The row of ``table`` made with ``key`` (a read named ``operation``), or ``None``."""

        def query(conn: sqlite3.Connection) -> dict[str, Any] | None:
            row = conn.execute(f"SELECT * FROM {table} WHERE key = ?", (key,)).fetchone()
            return row_dict(row, json_columns)

        result: dict[str, Any] | None = self.read(operation, query)
        return result

    # ------------------------------------------------------------ idempotency

    def mutate(
        self, operation: str, key: str, request: Mapping[str, Any], apply: Apply
    ) -> dict[str, Any]:
        """Apply ``apply`` at most once per key; replay the stored response on repeats.

        Args:
            operation: The operation's name (its faults, and the key's record).
            key: The idempotency key.
            request: What was asked, compared with the key's first request.
            apply: Does the work inside the store's transaction and returns the response.

        Raises:
            IdempotencyKeyReused: The key was used for a different request.
            ConnectionError, TimeoutError: Injected faults.
        """
        _check_key(key)
        request_json = _canonical(request)
        caller = uuid.uuid4().hex
        fault = self._arrive(operation, key, request_json, caller)
        if fault is not None and fault.mode == "fail_before":
            raise ConnectionError(
                f"injected fault: {operation} failed before reaching the server (key {key!r})"
            )
        if fault is not None and fault.hang_seconds:
            time.sleep(fault.hang_seconds)
        response = self._process(key, caller, apply)
        if fault is not None and fault.mode == "fail_after":
            raise TimeoutError(
                f"injected fault: {operation} was applied but the response was lost (key {key!r})"
            )
        return response

    def _arrive(self, operation: str, key: str, request_json: str, caller: str) -> Fault | None:
        """The request arrives: count it, consult the fault, dedupe."""
        with self.transaction() as conn:
            fault = take_fault(conn, operation)
            row = conn.execute("SELECT * FROM idempotency WHERE key = ?", (key,)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO idempotency (key, operation, request, attempts, first_seen_at) "
                    "VALUES (?, ?, ?, 1, ?)",
                    (key, operation, request_json, now_iso()),
                )
            else:
                conn.execute("UPDATE idempotency SET attempts = attempts + 1 WHERE key = ?", (key,))
            if fault is not None and fault.mode == "fail_before":
                pass  # the request never reached the server: apply nothing
            elif row is not None and row["state"] in ("applied", "in_flight"):
                # Replays and concurrent duplicates must be the same request.
                _check_same_request(key, row, operation, request_json)
            else:
                conn.execute(
                    "UPDATE idempotency SET operation = ?, request = ? WHERE key = ?",
                    (operation, request_json, key),
                )
                hang = fault.hang_seconds if fault is not None else 0.0
                if hang:
                    conn.execute(
                        "UPDATE idempotency SET state = 'in_flight', in_flight_owner = ?, "
                        "in_flight_until = ? WHERE key = ?",
                        (caller, time.time() + hang + self.in_flight_grace, key),
                    )
        return fault

    def _process(self, key: str, caller: str, apply: Apply) -> dict[str, Any]:
        """The server processes the request, unless someone else with the key is."""
        while True:
            try:
                response = self._try_apply(key, caller, apply)
            except Exception:
                with self.transaction() as conn:
                    conn.execute(
                        "UPDATE idempotency SET state = 'new', in_flight_owner = NULL, "
                        "in_flight_until = NULL WHERE key = ? AND state = 'in_flight' "
                        "AND in_flight_owner = ?",
                        (key, caller),
                    )
                raise
            if response is not None:
                return response
            time.sleep(BUSY_POLL)

    def _try_apply(self, key: str, caller: str, apply: Apply) -> dict[str, Any] | None:
        """The stored or new response, or ``None`` while another caller holds the key."""
        with self.transaction() as conn:
            row = conn.execute("SELECT * FROM idempotency WHERE key = ?", (key,)).fetchone()
            if row["state"] == "applied":
                stored: dict[str, Any] = json.loads(row["response"])
                return stored
            busy = (
                row["state"] == "in_flight"
                and row["in_flight_owner"] != caller
                and (row["in_flight_until"] or 0) > time.time()
            )
            if busy:
                return None
            response = apply(conn)
            conn.execute(
                "UPDATE idempotency SET state = 'applied', executions = executions"
                " + 1, response = ?, applied_at = ?, in_flight_owner = NULL,"
                " in_flight_until = NULL WHERE key = ?",
                (json.dumps(response, sort_keys=True), now_iso(), key),
            )
            return response

    # ------------------------------------------------------------ key counters

    def executions(self, key: str) -> int:
        """How many times a request with ``key`` was applied (0 or 1 when keys are honoured)."""
        return self._key_counter(key, "executions")

    def attempts(self, key: str) -> int:
        """How many requests with ``key`` arrived, applied or not (replays included)."""
        return self._key_counter(key, "attempts")

    def pending(self, key: str) -> bool:
        """True while a request with ``key`` is being processed (in flight, not yet applied)."""
        with self.transaction("DEFERRED") as conn:
            row = conn.execute(
                "SELECT state, in_flight_until FROM idempotency WHERE key = ?", (key,)
            ).fetchone()
        return (
            row is not None
            and row["state"] == "in_flight"
            and (row["in_flight_until"] or 0) > time.time()
        )

    def _key_counter(self, key: str, column: str) -> int:
        with self.transaction("DEFERRED") as conn:
            row = conn.execute(
                f"SELECT {column} AS n FROM idempotency WHERE key = ?", (key,)
            ).fetchone()
        return 0 if row is None else int(row["n"])


def _check_same_request(key: str, row: sqlite3.Row, operation: str, request_json: str) -> None:
    if row["operation"] != operation or row["request"] != request_json:
        raise IdempotencyKeyReused(
            f"idempotency key {key!r} was already used for {row['operation']} "
            f"{row['request']}; refusing {operation} {request_json}"
        )


__all__ = ["BUSY_POLL", "Apply", "ProviderStore", "now_iso", "require_row", "row_dict"]

"""The external systems the refund agent touches, faked with their own SQLite file.

These are the *other side* of every effect in the seed scenario: a payments
provider (refunds), an outbox (emails), an order database, a ticket desk and a
chat channel. They keep their truth in their own SQLite file, separate from the
agent's database, so a test can compare what the agent's ledger *believes* with
what the world *did* (invariant I6), across processes and across ``kill -9``.

They behave like real providers where it matters:

* **Idempotency keys, Stripe-style.** Every mutating call takes a key. The
  first request with a key is applied and its response stored; a repeat of the
  key replays the stored response and applies nothing. Reusing a key for a
  different request raises :class:`IdempotencyKeyReused`. A request arriving
  while another with the same key is still being processed waits for it.
  ``attempts(key)`` counts raw requests, ``executions(key)`` how many times the
  key was applied (0 or 1).
* **Safe across processes.** Each call opens the file, uses WAL mode, a busy
  timeout and ``BEGIN IMMEDIATE``, then closes it.
* **Fault injection stored in the file** (so a test can arm a fault that fires
  in another process): ``set_fault(operation, mode)`` with mode ``"none"``,
  ``"fail_before"`` (raise ``ConnectionError``; nothing applied),
  ``"fail_after"`` (apply, then raise ``TimeoutError`` as if the response was
  lost) or ``"hang:SECONDS"`` (the request is in flight for that long, then
  applied).

Command line::

    python -m langgraph_cancel.demo.services truth --db PATH
    python -m langgraph_cancel.demo.services set-fault update_order hang:5 --db PATH
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ENV_PROVIDERS_DB = "REFUND_AGENT_PROVIDERS_DB"
DEFAULT_PROVIDERS_DB = "./refund-providers.db"

#: Operations that change the world; each takes an idempotency key.
MUTATING_OPERATIONS: frozenset[str] = frozenset(
    {
        "refund",
        "send_email",
        "update_order",
        "restore_order",
        "create_ticket",
        "close_ticket",
        "post_message",
    }
)
#: Operations that only read.
READ_OPERATIONS: frozenset[str] = frozenset(
    {
        "get_order",
        "find_refund",
        "find_email",
        "find_update",
        "find_restore",
        "find_ticket",
        "find_message",
        "search_policy",
    }
)
OPERATIONS: frozenset[str] = MUTATING_OPERATIONS | READ_OPERATIONS

#: Order fields ``update_order`` may change (and ``restore_order`` may restore).
UPDATABLE_ORDER_FIELDS: frozenset[str] = frozenset({"status", "note"})

_SCHEMA_VERSION = "1"

_SCHEMA: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, next INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS idempotency (
        key TEXT PRIMARY KEY,
        operation TEXT NOT NULL,
        request TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        executions INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL DEFAULT 'new',
        in_flight_owner TEXT,
        in_flight_until REAL,
        response TEXT,
        first_seen_at TEXT NOT NULL,
        applied_at TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS faults (
        operation TEXT PRIMARY KEY,
        mode TEXT NOT NULL,
        remaining INTEGER
    )""",
    """CREATE TABLE IF NOT EXISTS orders (
        order_id TEXT PRIMARY KEY,
        customer TEXT NOT NULL,
        email TEXT NOT NULL,
        total REAL NOT NULL,
        currency TEXT NOT NULL,
        status TEXT NOT NULL,
        note TEXT NOT NULL DEFAULT '',
        updated_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS refunds (
        refund_id TEXT PRIMARY KEY,
        order_id TEXT NOT NULL,
        amount REAL NOT NULL,
        currency TEXT NOT NULL,
        status TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS emails (
        email_id TEXT PRIMARY KEY,
        to_addr TEXT NOT NULL,
        subject TEXT NOT NULL,
        body TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE,
        sent_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS order_updates (
        update_id TEXT PRIMARY KEY,
        order_id TEXT NOT NULL,
        fields TEXT NOT NULL,
        previous TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE,
        applied_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS order_restores (
        restore_id TEXT PRIMARY KEY,
        order_id TEXT NOT NULL,
        restored TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE,
        applied_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS tickets (
        ticket_id TEXT PRIMARY KEY,
        order_id TEXT NOT NULL,
        subject TEXT NOT NULL,
        body TEXT NOT NULL,
        status TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL,
        closed_at TEXT,
        close_key TEXT,
        close_reason TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS slack_messages (
        message_id TEXT PRIMARY KEY,
        channel TEXT NOT NULL,
        text TEXT NOT NULL,
        key TEXT NOT NULL UNIQUE,
        posted_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS policies (
        policy_id TEXT PRIMARY KEY,
        title TEXT NOT NULL,
        body TEXT NOT NULL
    )""",
)

_SEED_ORDERS: tuple[tuple[str, str, str, float, str], ...] = (
    ("o-88", "Dana Whitfield", "dana@example.com", 249.00, "refund_requested"),
    ("o-91", "Sam Okafor", "sam@example.com", 42.50, "delivered"),
    ("o-93", "Priya Raman", "priya@example.com", 89.99, "shipped"),
    ("o-97", "Lee Moreau", "lee@example.com", 1200.00, "delivered"),
    ("o-102", "Ana Costa", "ana@example.com", 15.00, "processing"),
)

_SEED_POLICIES: tuple[tuple[str, str, str], ...] = (
    (
        "refunds",
        "Refund policy",
        "Orders can be refunded up to the order total within 30 days of delivery. "
        "Refunds over 100 USD need a human approval before they are issued. "
        "A refund cannot be recalled once issued; a mistaken refund is corrected "
        "by a new charge, which is a separate transaction.",
    ),
    (
        "damaged",
        "Damaged or missing items",
        "If an item arrives damaged, refund the item price and open a ticket for the "
        "warehouse team. Ask the customer for a photo only when the amount is over 100 USD.",
    ),
    (
        "notifications",
        "Customer notifications",
        "Send the customer an email when a refund is issued and when the order status "
        "changes. Notification emails are pre-approved templates.",
    ),
    (
        "shipping",
        "Late shipping",
        "Orders shipped more than 10 days late qualify for a shipping refund of up to 15 USD.",
    ),
)

_COUNTER_STARTS: Mapping[str, int] = {
    "refund": 4471,
    "email": 1001,
    "update": 501,
    "restore": 301,
    "ticket": 7001,
    "message": 9001,
}
_ID_PREFIX: Mapping[str, str] = {
    "refund": "r",
    "email": "e",
    "update": "u",
    "restore": "rs",
    "ticket": "t",
    "message": "m",
}


class ProviderError(Exception):
    """A provider refused a request (a known outcome: nothing was applied)."""


class OrderNotFound(ProviderError, LookupError):
    """No order with that id."""


class TicketNotFound(ProviderError, LookupError):
    """No ticket with that id."""


class RefundRejected(ProviderError, ValueError):
    """The payments provider refused the refund (amount invalid or over the total)."""


class RestoreConflict(ProviderError):
    """The order changed since the update being undone; restoring would clobber it."""


class IdempotencyKeyReused(ProviderError, ValueError):
    """The key was already used for a different request."""


@dataclass(frozen=True, slots=True)
class Fault:
    """An armed fault: what happens to the next requests of one operation.

    Attributes:
        operation: The operation it applies to.
        mode: ``fail_before``, ``fail_after`` or ``hang:SECONDS``.
        remaining: How many more requests it fires for; ``None`` means until cleared.
    """

    operation: str
    mode: str
    remaining: int | None

    @property
    def hang_seconds(self) -> float:
        """Seconds a ``hang:`` fault keeps the request in flight (0 for other modes)."""
        if self.mode.startswith("hang:"):
            return float(self.mode.split(":", 1)[1])
        return 0.0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _canonical(request: Mapping[str, Any]) -> str:
    return json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)


def _parse_mode(mode: str) -> str:
    if mode in ("none", "fail_before", "fail_after"):
        return mode
    if mode.startswith("hang:"):
        try:
            seconds = float(mode.split(":", 1)[1])
        except ValueError:
            seconds = -1.0
        if seconds >= 0 and math.isfinite(seconds):
            return f"hang:{seconds:g}"
    raise ValueError(
        f"unknown fault mode {mode!r}; expected none, fail_before, fail_after or hang:SECONDS"
    )


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key.strip():
        raise ValueError("an idempotency key must be a non-empty string")


def _row(row: sqlite3.Row | None, json_columns: Sequence[str] = ()) -> dict[str, Any] | None:
    if row is None:
        return None
    data = {name: row[name] for name in row.keys()}  # noqa: SIM118 - sqlite3.Row
    for column in json_columns:
        if data.get(column) is not None:
            data[column] = json.loads(data[column])
    return data


def _require(row: dict[str, Any] | None) -> dict[str, Any]:
    if row is None:  # pragma: no cover - rows just written
        raise RuntimeError("row vanished inside its own transaction")
    return row


class Providers:
    """The fake external systems, backed by one SQLite file.

    Every method opens the file, does its work in one transaction and closes
    it, so instances are cheap, hold no state but the path, and any number of
    processes may use the same file.

    Args:
        path: The SQLite file holding the providers' truth (created and seeded
            with a few orders and policies on first open).
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
        return f"Providers({str(self.path)!r})"

    # ------------------------------------------------------------ connections

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        return conn

    @contextmanager
    def _tx(self, mode: str = "IMMEDIATE") -> Iterator[sqlite3.Connection]:
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
        if found is not None and found["v"] == _SCHEMA_VERSION:
            return
        with self._tx() as conn:
            for statement in _SCHEMA:
                conn.execute(statement)
            if conn.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone() is not None:
                return  # another process seeded it meanwhile
            now = _now()
            conn.executemany(
                "INSERT INTO orders (order_id, customer, email, total, currency, status, note,"
                " updated_at) VALUES (?, ?, ?, ?, 'USD', ?, '', ?)",
                [
                    (oid, name, mail, total, status, now)
                    for oid, name, mail, total, status in _SEED_ORDERS
                ],
            )
            conn.executemany(
                "INSERT INTO policies (policy_id, title, body) VALUES (?, ?, ?)", _SEED_POLICIES
            )
            conn.executemany(
                "INSERT INTO counters (name, next) VALUES (?, ?)", list(_COUNTER_STARTS.items())
            )
            conn.execute("INSERT INTO meta (k, v) VALUES ('schema', ?)", (_SCHEMA_VERSION,))

    @staticmethod
    def _next_id(conn: sqlite3.Connection, counter: str) -> str:
        row = conn.execute("SELECT next FROM counters WHERE name = ?", (counter,)).fetchone()
        number = int(row["next"])
        conn.execute("UPDATE counters SET next = ? WHERE name = ?", (number + 1, counter))
        return f"{_ID_PREFIX[counter]}-{number}"

    # ------------------------------------------------------------------ faults

    def set_fault(self, operation: str, mode: str, *, times: int | None = None) -> None:
        """Arm (or clear, with ``mode="none"``) a fault for one operation.

        The fault is stored in the file, so it fires in whichever process makes
        the next request.

        Args:
            operation: One of :data:`OPERATIONS`, e.g. ``"refund"`` or ``"find_refund"``.
            mode: ``none``, ``fail_before``, ``fail_after`` or ``hang:SECONDS``.
            times: Fire for this many requests, then clear; ``None``: until cleared.

        Raises:
            ValueError: For an unknown operation or mode, or ``times < 1``.
        """
        if operation not in OPERATIONS:
            raise ValueError(
                f"unknown operation {operation!r}; expected one of {', '.join(sorted(OPERATIONS))}"
            )
        parsed = _parse_mode(mode)
        if times is not None and times < 1:
            raise ValueError("times must be at least 1")
        with self._tx() as conn:
            if parsed == "none":
                conn.execute("DELETE FROM faults WHERE operation = ?", (operation,))
            else:
                conn.execute(
                    "INSERT INTO faults (operation, mode, remaining) VALUES (?, ?, ?) "
                    "ON CONFLICT(operation) DO UPDATE SET mode = excluded.mode, "
                    "remaining = excluded.remaining",
                    (operation, parsed, times),
                )

    def clear_faults(self) -> None:
        """Disarm every fault."""
        with self._tx() as conn:
            conn.execute("DELETE FROM faults")

    def faults(self) -> dict[str, Fault]:
        """The armed faults, by operation."""
        with self._tx("DEFERRED") as conn:
            rows = conn.execute("SELECT operation, mode, remaining FROM faults").fetchall()
        return {r["operation"]: Fault(r["operation"], r["mode"], r["remaining"]) for r in rows}

    @staticmethod
    def _take_fault(conn: sqlite3.Connection, operation: str) -> Fault | None:
        row = conn.execute(
            "SELECT mode, remaining FROM faults WHERE operation = ?", (operation,)
        ).fetchone()
        if row is None:
            return None
        remaining = row["remaining"]
        if remaining is not None:
            if remaining <= 1:
                conn.execute("DELETE FROM faults WHERE operation = ?", (operation,))
            else:
                conn.execute(
                    "UPDATE faults SET remaining = ? WHERE operation = ?",
                    (remaining - 1, operation),
                )
        return Fault(operation, str(row["mode"]), remaining)

    # ------------------------------------------------------------- machinery

    def _read(self, operation: str, query: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run a read under the operation's fault, if one is armed."""
        with self._tx() as conn:
            fault = self._take_fault(conn, operation)
        if fault is not None and fault.mode == "fail_before":
            raise ConnectionError(f"injected fault: {operation} failed before reaching the server")
        if fault is not None and fault.hang_seconds:
            time.sleep(fault.hang_seconds)
        with self._tx("DEFERRED") as conn:
            result = query(conn)
        if fault is not None and fault.mode == "fail_after":
            raise TimeoutError(f"injected fault: {operation} response lost")
        return result

    def _mutate(
        self,
        operation: str,
        key: str,
        request: Mapping[str, Any],
        apply: Callable[[sqlite3.Connection], dict[str, Any]],
    ) -> dict[str, Any]:
        """Apply ``apply`` at most once per key; replay the stored response on repeats."""
        _check_key(key)
        request_json = _canonical(request)
        me = uuid.uuid4().hex
        # Phase 1: the request arrives. Count it, consult the fault, dedupe.
        with self._tx() as conn:
            fault = self._take_fault(conn, operation)
            row = conn.execute("SELECT * FROM idempotency WHERE key = ?", (key,)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO idempotency (key, operation, request, attempts, first_seen_at) "
                    "VALUES (?, ?, ?, 1, ?)",
                    (key, operation, request_json, _now()),
                )
            else:
                conn.execute("UPDATE idempotency SET attempts = attempts + 1 WHERE key = ?", (key,))
            if fault is not None and fault.mode == "fail_before":
                pass  # the request never reached the server: apply nothing
            elif row is not None and row["state"] in ("applied", "in_flight"):
                # Replays and concurrent duplicates must be the same request.
                self._check_same_request(key, row, operation, request_json)
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
                        (me, time.time() + hang + self.in_flight_grace, key),
                    )
        if fault is not None and fault.mode == "fail_before":
            raise ConnectionError(
                f"injected fault: {operation} failed before reaching the server (key {key!r})"
            )
        if fault is not None and fault.hang_seconds:
            time.sleep(fault.hang_seconds)
        # Phase 2: the server processes it, unless someone else with the key is.
        while True:
            try:
                with self._tx() as conn:
                    row = conn.execute("SELECT * FROM idempotency WHERE key = ?", (key,)).fetchone()
                    if row["state"] == "applied":
                        response: dict[str, Any] = json.loads(row["response"])
                        break
                    busy = (
                        row["state"] == "in_flight"
                        and row["in_flight_owner"] != me
                        and (row["in_flight_until"] or 0) > time.time()
                    )
                    if not busy:
                        response = apply(conn)
                        conn.execute(
                            "UPDATE idempotency SET state = 'applied', executions = executions"
                            " + 1, response = ?, applied_at = ?, in_flight_owner = NULL,"
                            " in_flight_until = NULL WHERE key = ?",
                            (json.dumps(response, sort_keys=True), _now(), key),
                        )
                        break
            except Exception:
                with self._tx() as conn:
                    conn.execute(
                        "UPDATE idempotency SET state = 'new', in_flight_owner = NULL, "
                        "in_flight_until = NULL WHERE key = ? AND state = 'in_flight' "
                        "AND in_flight_owner = ?",
                        (key, me),
                    )
                raise
            time.sleep(0.02)
        if fault is not None and fault.mode == "fail_after":
            raise TimeoutError(
                f"injected fault: {operation} was applied but the response was lost (key {key!r})"
            )
        return response

    @staticmethod
    def _check_same_request(key: str, row: sqlite3.Row, operation: str, request_json: str) -> None:
        if row["operation"] != operation or row["request"] != request_json:
            raise IdempotencyKeyReused(
                f"idempotency key {key!r} was already used for {row['operation']} "
                f"{row['request']}; refusing {operation} {request_json}"
            )

    def _find(
        self, operation: str, table: str, key: str, json_columns: Sequence[str] = ()
    ) -> dict[str, Any] | None:
        def query(conn: sqlite3.Connection) -> dict[str, Any] | None:
            row = conn.execute(f"SELECT * FROM {table} WHERE key = ?", (key,)).fetchone()
            return _row(row, json_columns)

        result: dict[str, Any] | None = self._read(operation, query)
        return result

    # ---------------------------------------------------------------- ledger

    def executions(self, key: str) -> int:
        """How many times a request with ``key`` was applied (0 or 1 when keys are honoured)."""
        return self._key_counter(key, "executions")

    def attempts(self, key: str) -> int:
        """How many requests with ``key`` arrived, applied or not (replays included)."""
        return self._key_counter(key, "attempts")

    def pending(self, key: str) -> bool:
        """True while a request with ``key`` is being processed (in flight, not yet applied)."""
        with self._tx("DEFERRED") as conn:
            row = conn.execute(
                "SELECT state, in_flight_until FROM idempotency WHERE key = ?", (key,)
            ).fetchone()
        return (
            row is not None
            and row["state"] == "in_flight"
            and (row["in_flight_until"] or 0) > time.time()
        )

    def _key_counter(self, key: str, column: str) -> int:
        with self._tx("DEFERRED") as conn:
            row = conn.execute(
                f"SELECT {column} AS n FROM idempotency WHERE key = ?", (key,)
            ).fetchone()
        return 0 if row is None else int(row["n"])

    # -------------------------------------------------------------- payments

    def refund(self, order_id: str, amount: float, key: str) -> dict[str, Any]:
        """Refund ``amount`` of an order (irreversible), at most once per key.

        Args:
            order_id: The order to refund.
            amount: Amount in the order's currency; positive, and the order's
                refunds may not exceed its total.
            key: The idempotency key; a repeat returns the original refund.

        Returns:
            The refund: ``refund_id`` (``r-NNNN``), ``order_id``, ``amount``,
            ``currency``, ``status``, ``key``, ``created_at``.

        Raises:
            OrderNotFound: No such order.
            RefundRejected: Amount not positive or over what is left to refund.
            ConnectionError, TimeoutError: Injected faults.
        """
        value = round(float(amount), 2)

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            order = self._order_row(conn, order_id)
            if not value > 0:
                raise RefundRejected(f"refund amount must be positive, got {value}")
            refunded = conn.execute(
                "SELECT COALESCE(SUM(amount), 0) AS s FROM refunds WHERE order_id = ?",
                (order_id,),
            ).fetchone()["s"]
            if round(refunded + value, 2) > order["total"]:
                raise RefundRejected(
                    f"refund of {value} exceeds what is left on {order_id}: "
                    f"total {order['total']}, already refunded {refunded}"
                )
            refund_id = self._next_id(conn, "refund")
            conn.execute(
                "INSERT INTO refunds (refund_id, order_id, amount, currency, status, key,"
                " created_at) VALUES (?, ?, ?, ?, 'succeeded', ?, ?)",
                (refund_id, order_id, value, order["currency"], key, _now()),
            )
            return _require(
                _row(
                    conn.execute(
                        "SELECT * FROM refunds WHERE refund_id = ?", (refund_id,)
                    ).fetchone()
                )
            )

        return self._mutate("refund", key, {"order_id": order_id, "amount": value}, apply)

    def find_refund(self, key: str) -> dict[str, Any] | None:
        """The refund made with ``key``, or ``None`` if there is none (yet)."""
        return self._find("find_refund", "refunds", key)

    # ----------------------------------------------------------------- outbox

    def send_email(self, to: str, subject: str, body: str, key: str) -> dict[str, Any]:
        """Send an email (irreversible), at most once per key.

        Args:
            to: Recipient address.
            subject: Subject line.
            body: Plain-text body.
            key: The idempotency key; a repeat returns the original email.

        Returns:
            The sent email: ``email_id``, ``to_addr``, ``subject``, ``body``, ``key``, ``sent_at``.
        """
        if "@" not in to:
            raise ValueError(f"not an email address: {to!r}")

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            email_id = self._next_id(conn, "email")
            conn.execute(
                "INSERT INTO emails (email_id, to_addr, subject, body, key, sent_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (email_id, to, subject, body, key, _now()),
            )
            row = conn.execute("SELECT * FROM emails WHERE email_id = ?", (email_id,)).fetchone()
            return _require(_row(row))

        request = {"to": to, "subject": subject, "body": body}
        return self._mutate("send_email", key, request, apply)

    def find_email(self, key: str) -> dict[str, Any] | None:
        """The email sent with ``key``, or ``None``."""
        return self._find("find_email", "emails", key)

    # ----------------------------------------------------------------- orders

    @staticmethod
    def _order_row(conn: sqlite3.Connection, order_id: str) -> dict[str, Any]:
        row = _row(conn.execute("SELECT * FROM orders WHERE order_id = ?", (order_id,)).fetchone())
        if row is None:
            raise OrderNotFound(f"no order {order_id!r}")
        return row

    def get_order(self, order_id: str) -> dict[str, Any]:
        """The order's current record.

        Raises:
            OrderNotFound: No such order.
        """
        result: dict[str, Any] = self._read(
            "get_order", lambda conn: self._order_row(conn, order_id)
        )
        return result

    def update_order(self, order_id: str, fields: Mapping[str, Any], key: str) -> dict[str, Any]:
        """Change an order's fields (reversible), at most once per key.

        Args:
            order_id: The order.
            fields: New values; keys among :data:`UPDATABLE_ORDER_FIELDS`.
            key: The idempotency key.

        Returns:
            ``update_id``, ``order_id``, ``key``, ``fields`` (as applied),
            ``previous`` (the values before, for :meth:`restore_order`),
            ``applied_at`` and ``order`` (the record after the update).

        Raises:
            OrderNotFound: No such order.
            ValueError: Unknown or empty fields.
        """
        changes = {str(k): v for k, v in fields.items()}
        unknown = set(changes) - UPDATABLE_ORDER_FIELDS
        if not changes or unknown:
            raise ValueError(
                f"update_order needs fields among {sorted(UPDATABLE_ORDER_FIELDS)}, got {changes}"
            )

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            before = self._order_row(conn, order_id)
            previous = {name: before[name] for name in sorted(changes)}
            self._set_order_fields(conn, order_id, changes)
            update_id = self._next_id(conn, "update")
            applied_at = _now()
            conn.execute(
                "INSERT INTO order_updates (update_id, order_id, fields, previous, key,"
                " applied_at) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    update_id,
                    order_id,
                    json.dumps(changes, sort_keys=True),
                    json.dumps(previous, sort_keys=True),
                    key,
                    applied_at,
                ),
            )
            return {
                "update_id": update_id,
                "order_id": order_id,
                "key": key,
                "fields": changes,
                "previous": previous,
                "applied_at": applied_at,
                "order": self._order_row(conn, order_id),
            }

        return self._mutate("update_order", key, {"order_id": order_id, "fields": changes}, apply)

    @staticmethod
    def _set_order_fields(
        conn: sqlite3.Connection, order_id: str, values: Mapping[str, Any]
    ) -> None:
        for name in sorted(values):
            if name not in UPDATABLE_ORDER_FIELDS:
                raise ValueError(f"order field {name!r} cannot be changed")
            conn.execute(
                f"UPDATE orders SET {name} = ?, updated_at = ? WHERE order_id = ?",
                (values[name], _now(), order_id),
            )

    def restore_order(
        self,
        order_id: str,
        previous: Mapping[str, Any],
        key: str,
        *,
        expected: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Put an order's fields back (the compensation of :meth:`update_order`).

        Idempotent by its own key: restoring twice with the same key restores once.

        Args:
            order_id: The order.
            previous: The values to put back (``update_order``'s ``previous``).
            key: The compensation's idempotency key (not the update's).
            expected: Optional current values (``update_order``'s ``fields``); if
                the order no longer has them someone changed it since, and the
                restore is refused rather than clobbering that change.

        Returns:
            ``restore_id``, ``order_id``, ``key``, ``restored``, ``applied_at``, ``order``.

        Raises:
            OrderNotFound: No such order.
            RestoreConflict: ``expected`` does not match the order.
        """
        values = {str(k): v for k, v in previous.items()}
        request: dict[str, Any] = {"order_id": order_id, "previous": values}
        if expected is not None:
            request["expected"] = dict(expected)

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            current = self._order_row(conn, order_id)
            if expected is not None:
                changed = {
                    name: current.get(name)
                    for name, value in expected.items()
                    if current.get(name) != value
                }
                if changed:
                    raise RestoreConflict(
                        f"order {order_id} changed since the update being undone: now {changed}, "
                        f"expected {dict(expected)}"
                    )
            self._set_order_fields(conn, order_id, values)
            restore_id = self._next_id(conn, "restore")
            applied_at = _now()
            conn.execute(
                "INSERT INTO order_restores (restore_id, order_id, restored, key, applied_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (restore_id, order_id, json.dumps(values, sort_keys=True), key, applied_at),
            )
            return {
                "restore_id": restore_id,
                "order_id": order_id,
                "key": key,
                "restored": values,
                "applied_at": applied_at,
                "order": self._order_row(conn, order_id),
            }

        return self._mutate("restore_order", key, request, apply)

    def find_update(self, key: str) -> dict[str, Any] | None:
        """The order update made with ``key`` (with ``fields`` and ``previous``), or ``None``."""
        return self._find("find_update", "order_updates", key, ("fields", "previous"))

    def find_restore(self, key: str) -> dict[str, Any] | None:
        """The restore made with ``key``, or ``None``."""
        return self._find("find_restore", "order_restores", key, ("restored",))

    # ---------------------------------------------------------------- tickets

    def create_ticket(self, order_id: str, subject: str, body: str, key: str) -> dict[str, Any]:
        """Open a support ticket (reversible: :meth:`close_ticket`), at most once per key.

        Returns:
            The ticket: ``ticket_id`` (``t-NNNN``), ``order_id``, ``subject``,
            ``body``, ``status`` (``open``), ``key``, ``created_at``.
        """

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            self._order_row(conn, order_id)
            ticket_id = self._next_id(conn, "ticket")
            conn.execute(
                "INSERT INTO tickets (ticket_id, order_id, subject, body, status, key,"
                " created_at) VALUES (?, ?, ?, ?, 'open', ?, ?)",
                (ticket_id, order_id, subject, body, key, _now()),
            )
            return self._ticket_row(conn, ticket_id)

        request = {"order_id": order_id, "subject": subject, "body": body}
        return self._mutate("create_ticket", key, request, apply)

    @staticmethod
    def _ticket_row(conn: sqlite3.Connection, ticket_id: str) -> dict[str, Any]:
        row = _row(
            conn.execute("SELECT * FROM tickets WHERE ticket_id = ?", (ticket_id,)).fetchone()
        )
        if row is None:
            raise TicketNotFound(f"no ticket {ticket_id!r}")
        return row

    def close_ticket(self, ticket_id: str, key: str, reason: str = "") -> dict[str, Any]:
        """Close a ticket (the compensation of :meth:`create_ticket`); idempotent by key.

        Closing an already closed ticket changes nothing and returns it.

        Returns:
            The ticket after closing.

        Raises:
            TicketNotFound: No such ticket.
        """

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            ticket = self._ticket_row(conn, ticket_id)
            if ticket["status"] != "closed":
                conn.execute(
                    "UPDATE tickets SET status = 'closed', closed_at = ?, close_key = ?,"
                    " close_reason = ? WHERE ticket_id = ?",
                    (_now(), key, reason, ticket_id),
                )
            return self._ticket_row(conn, ticket_id)

        return self._mutate("close_ticket", key, {"ticket_id": ticket_id, "reason": reason}, apply)

    def find_ticket(self, key: str) -> dict[str, Any] | None:
        """The ticket created with ``key``, or ``None``."""
        return self._find("find_ticket", "tickets", key)

    # ------------------------------------------------------------------ slack

    def post_message(self, channel: str, text: str, key: str) -> dict[str, Any]:
        """Post a chat message (irreversible), at most once per key.

        Returns:
            ``message_id``, ``channel``, ``text``, ``key``, ``posted_at``.
        """

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            message_id = self._next_id(conn, "message")
            conn.execute(
                "INSERT INTO slack_messages (message_id, channel, text, key, posted_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (message_id, channel, text, key, _now()),
            )
            row = conn.execute(
                "SELECT * FROM slack_messages WHERE message_id = ?", (message_id,)
            ).fetchone()
            return _require(_row(row))

        return self._mutate("post_message", key, {"channel": channel, "text": text}, apply)

    def find_message(self, key: str) -> dict[str, Any] | None:
        """The chat message posted with ``key``, or ``None``."""
        return self._find("find_message", "slack_messages", key)

    # --------------------------------------------------------------- policies

    def search_policy(self, query: str, limit: int = 3) -> list[dict[str, Any]]:
        """Policies matching the query's words, best match first.

        Args:
            query: Free text; policies are ranked by how many of its words they contain.
            limit: At most this many results.

        Returns:
            ``policy_id``, ``title``, ``body`` and ``score`` for each match.
        """
        words = {w.strip(".,;:!?\"'()").lower() for w in query.split()}
        words = {w for w in words if len(w) > 2}

        def search(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            hits: list[dict[str, Any]] = []
            for row in conn.execute("SELECT policy_id, title, body FROM policies"):
                text = f"{row['title']} {row['body']}".lower()
                score = sum(1 for word in words if word in text)
                if score:
                    hits.append({**_require(_row(row)), "score": score})
            hits.sort(key=lambda hit: (-hit["score"], hit["policy_id"]))
            return hits[:limit]

        result: list[dict[str, Any]] = self._read("search_policy", search)
        return result

    # ------------------------------------------------------------------ truth

    def truth(self) -> dict[str, Any]:
        """Everything the external systems hold, as a JSON-able dict (one snapshot).

        Returns:
            ``orders`` (by id), ``refunds``, ``emails``, ``updates``, ``restores``,
            ``tickets``, ``messages``, ``keys`` (per key: operation, attempts,
            executions, state) and ``faults``.
        """
        with self._tx("DEFERRED") as conn:

            def rows(sql: str, json_columns: Sequence[str] = ()) -> list[dict[str, Any]]:
                return [_require(_row(r, json_columns)) for r in conn.execute(sql)]

            orders = {o["order_id"]: o for o in rows("SELECT * FROM orders ORDER BY order_id")}
            keys = {
                k["key"]: {
                    "operation": k["operation"],
                    "attempts": k["attempts"],
                    "executions": k["executions"],
                    "state": k["state"],
                }
                for k in rows("SELECT * FROM idempotency ORDER BY first_seen_at, key")
            }
            return {
                "orders": orders,
                "refunds": rows("SELECT * FROM refunds ORDER BY created_at, refund_id"),
                "emails": rows("SELECT * FROM emails ORDER BY sent_at, email_id"),
                "updates": rows(
                    "SELECT * FROM order_updates ORDER BY applied_at, update_id",
                    ("fields", "previous"),
                ),
                "restores": rows(
                    "SELECT * FROM order_restores ORDER BY applied_at, restore_id", ("restored",)
                ),
                "tickets": rows("SELECT * FROM tickets ORDER BY created_at, ticket_id"),
                "messages": rows("SELECT * FROM slack_messages ORDER BY posted_at, message_id"),
                "keys": keys,
                "faults": {
                    f["operation"]: {"mode": f["mode"], "remaining": f["remaining"]}
                    for f in rows("SELECT * FROM faults ORDER BY operation")
                },
            }


def default_path() -> str:
    """The providers' file: ``$REFUND_AGENT_PROVIDERS_DB`` or ``./refund-providers.db``."""
    return os.environ.get(ENV_PROVIDERS_DB) or DEFAULT_PROVIDERS_DB


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: inspect the providers' truth and arm faults.

    Args:
        argv: Arguments (default ``sys.argv[1:]``).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(
        prog="python -m langgraph_cancel.demo.services",
        description="The refund agent's fake external systems.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=default_path(), help="providers' SQLite file")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("truth", parents=[common], help="print everything as JSON")
    fault = commands.add_parser("set-fault", parents=[common], help="arm or clear a fault")
    fault.add_argument("operation", choices=sorted(OPERATIONS))
    fault.add_argument("mode", help="none | fail_before | fail_after | hang:SECONDS")
    fault.add_argument("--times", type=int, default=None)
    commands.add_parser("clear-faults", parents=[common], help="disarm every fault")
    for name in ("executions", "attempts"):
        counter = commands.add_parser(name, parents=[common], help=f"print {name} of a key")
        counter.add_argument("key")
    args = parser.parse_args(argv)

    providers = Providers(args.db)
    if args.command == "truth":
        json.dump(providers.truth(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif args.command == "set-fault":
        try:
            providers.set_fault(args.operation, args.mode, times=args.times)
        except ValueError as exc:
            parser.error(str(exc))
    elif args.command == "clear-faults":
        providers.clear_faults()
    elif args.command == "executions":
        print(providers.executions(args.key))
    elif args.command == "attempts":
        print(providers.attempts(args.key))
    return 0


__all__ = [
    "DEFAULT_PROVIDERS_DB",
    "ENV_PROVIDERS_DB",
    "MUTATING_OPERATIONS",
    "OPERATIONS",
    "READ_OPERATIONS",
    "UPDATABLE_ORDER_FIELDS",
    "Fault",
    "IdempotencyKeyReused",
    "OrderNotFound",
    "ProviderError",
    "Providers",
    "RefundRejected",
    "RestoreConflict",
    "TicketNotFound",
    "default_path",
    "main",
]


if __name__ == "__main__":
    raise SystemExit(main())

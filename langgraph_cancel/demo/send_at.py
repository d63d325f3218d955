"""A send-at email provider: it holds each email until its delivery time, then sends it.

The other side of a provider-held delay window (``effect(..., delay=, revoke=)``):
``schedule`` accepts an email with a delivery time and answers with a handle;
``revoke`` withdraws it while it is still held, and refuses once it is delivered.
Delivery happens when the time comes: every call (and ``truth``) first delivers
what is due, so the provider's answer never depends on who looked last.

Its truth lives in the providers' SQLite file (tables of its own, beside
:class:`~langgraph_cancel.demo.services.Providers`'), opened per call in WAL mode
with ``BEGIN IMMEDIATE``, so several processes see one world. Each email is kept
at most once per idempotency key; ``attempts(key)`` counts requests.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

ScheduledEmailStatus = Literal["scheduled", "revoked", "delivered"]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS send_at_emails (
        email_id INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL UNIQUE,
        to_addr TEXT NOT NULL,
        subject TEXT NOT NULL,
        body TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('scheduled', 'revoked', 'delivered')),
        scheduled_at REAL NOT NULL,
        deliver_at REAL NOT NULL,
        settled_at REAL,
        attempts INTEGER NOT NULL DEFAULT 1
    )""",
)


class ScheduledEmailNotFound(LookupError):
    """No email was ever scheduled under this key."""


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat()


class SendAtMail:
    """The send-at email provider, kept in the SQLite file at ``path``.

    Args:
        path: The providers' file (shared with ``Providers``; its own tables).
        clock: Seconds since the epoch (a test may move time on).
    """

    def __init__(self, path: str | os.PathLike[str], *, clock: Any = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._tx() as conn:
            for statement in _SCHEMA:
                conn.execute(statement)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    def _deliver_due(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "UPDATE send_at_emails SET status = 'delivered', settled_at = deliver_at "
            "WHERE status = 'scheduled' AND deliver_at <= ?",
            (self._clock(),),
        )

    @staticmethod
    def _record(row: sqlite3.Row) -> dict[str, Any]:
        return {
            "email_id": f"se-{row['email_id']}",
            "key": row["key"],
            "to_addr": row["to_addr"],
            "subject": row["subject"],
            "body": row["body"],
            "status": row["status"],
            "scheduled_at": _iso(row["scheduled_at"]),
            "deliver_at": _iso(row["deliver_at"]),
            "settled_at": _iso(row["settled_at"]),
            "attempts": row["attempts"],
        }

    def schedule(
        self, to: str, subject: str, body: str, deliver_in: float, key: str
    ) -> dict[str, Any]:
        """Accept an email for delivery ``deliver_in`` seconds from now, at most once per key.

        Returns:
            The handle: ``email_id``, ``key``, ``status`` (``scheduled``), ``deliver_at``, ...

        Raises:
            ValueError: A malformed address or a negative delay.
        """
        if "@" not in to:
            raise ValueError(f"not an email address: {to!r}")
        if deliver_in < 0:
            raise ValueError("deliver_in must not be negative")
        with self._tx() as conn:
            self._deliver_due(conn)
            now = self._clock()
            conn.execute(
                "INSERT INTO send_at_emails (key, to_addr, subject, body, status, scheduled_at,"
                " deliver_at) VALUES (?, ?, ?, ?, 'scheduled', ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET attempts = attempts + 1",
                (key, to, subject, body, now, now + deliver_in),
            )
            row = conn.execute("SELECT * FROM send_at_emails WHERE key = ?", (key,)).fetchone()
            return self._record(row)

    def revoke(self, key: str) -> bool:
        """Withdraw the email scheduled under ``key``.

        Returns:
            True when it is withdrawn (now or before), False when it was already delivered.

        Raises:
            ScheduledEmailNotFound: Nothing was ever scheduled under ``key``.
        """
        with self._tx() as conn:
            self._deliver_due(conn)
            row = conn.execute("SELECT status FROM send_at_emails WHERE key = ?", (key,)).fetchone()
            if row is None:
                raise ScheduledEmailNotFound(f"no email scheduled under key {key!r}")
            if row["status"] == "delivered":
                return False
            conn.execute(
                "UPDATE send_at_emails SET status = 'revoked', settled_at = COALESCE(settled_at, ?)"
                " WHERE key = ?",
                (self._clock(), key),
            )
            return True

    def find(self, key: str) -> dict[str, Any] | None:
        """The email scheduled under ``key`` as the provider now knows it, or ``None``."""
        with self._tx() as conn:
            self._deliver_due(conn)
            row = conn.execute("SELECT * FROM send_at_emails WHERE key = ?", (key,)).fetchone()
            return None if row is None else self._record(row)

    def status(self, key: str) -> ScheduledEmailStatus | None:
        """``scheduled``, ``revoked``, ``delivered``, or ``None`` for a key never seen."""
        found = self.find(key)
        return None if found is None else found["status"]

    def truth(self) -> dict[str, list[dict[str, Any]]]:
        """Every email the provider holds, by status (due ones delivered first)."""
        with self._tx() as conn:
            self._deliver_due(conn)
            rows = conn.execute("SELECT * FROM send_at_emails ORDER BY email_id").fetchall()
        out: dict[str, list[dict[str, Any]]] = {"scheduled": [], "revoked": [], "delivered": []}
        for row in rows:
            out[row["status"]].append(self._record(row))
        return out


__all__ = ["ScheduledEmailNotFound", "ScheduledEmailStatus", "SendAtMail"]

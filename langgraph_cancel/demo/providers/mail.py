"""The email provider: messages sent, irreversible, at most one per idempotency key."""

from __future__ import annotations

import sqlite3
from typing import Any

from langgraph_cancel.demo.providers.store import ProviderStore, now_iso, require_row, row_dict


class Mailer:
    """The email provider.

    Args:
        store: The providers' file.
    """

    def __init__(self, store: ProviderStore) -> None:
        self.store = store

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
            email_id = self.store.next_id(conn, "email")
            conn.execute(
                "INSERT INTO emails (email_id, to_addr, subject, body, key, sent_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (email_id, to, subject, body, key, now_iso()),
            )
            row = conn.execute("SELECT * FROM emails WHERE email_id = ?", (email_id,)).fetchone()
            return require_row(row_dict(row))

        request = {"to": to, "subject": subject, "body": body}
        return self.store.mutate("send_email", key, request, apply)

    def find_email(self, key: str) -> dict[str, Any] | None:
        """The email sent with ``key``, or ``None``."""
        return self.store.find("find_email", "emails", key)


__all__ = ["Mailer"]

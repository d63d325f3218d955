"""The chat channel: messages posted, irreversible, at most one per idempotency key."""

from __future__ import annotations

import sqlite3
from typing import Any

from langgraph_cancel.demo.providers.store import ProviderStore, now_iso, require_row, row_dict


class Chat:
    """The chat channel.

    Args:
        store: The providers' file.
    """

    def __init__(self, store: ProviderStore) -> None:
        self.store = store

    def post_message(self, channel: str, text: str, key: str) -> dict[str, Any]:
        """Post a chat message (irreversible), at most once per key.

        Returns:
            ``message_id``, ``channel``, ``text``, ``key``, ``posted_at``.
        """

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            message_id = self.store.next_id(conn, "message")
            conn.execute(
                "INSERT INTO slack_messages (message_id, channel, text, key, posted_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (message_id, channel, text, key, now_iso()),
            )
            row = conn.execute(
                "SELECT * FROM slack_messages WHERE message_id = ?", (message_id,)
            ).fetchone()
            return require_row(row_dict(row))

        return self.store.mutate("post_message", key, {"channel": channel, "text": text}, apply)

    def find_message(self, key: str) -> dict[str, Any] | None:
        """The chat message posted with ``key``, or ``None``."""
        return self.store.find("find_message", "slack_messages", key)


__all__ = ["Chat"]

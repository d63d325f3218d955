"""The support desk: tickets opened (reversible) and closed (the undo)."""

from __future__ import annotations

import sqlite3
from typing import Any

from langgraph_cancel.demo.providers.errors import TicketNotFound
from langgraph_cancel.demo.providers.orders import order_row
from langgraph_cancel.demo.providers.store import ProviderStore, now_iso, row_dict


def _ticket_row(conn: sqlite3.Connection, ticket_id: str) -> dict[str, Any]:
    row = row_dict(
        conn.execute("SELECT * FROM tickets WHERE ticket_id = ?", (ticket_id,)).fetchone()
    )
    if row is None:
        raise TicketNotFound(f"no ticket {ticket_id!r}")
    return row


class Tickets:
    """The support desk.

    Args:
        store: The providers' file.
    """

    def __init__(self, store: ProviderStore) -> None:
        self.store = store

    def create_ticket(self, order_id: str, subject: str, body: str, key: str) -> dict[str, Any]:
        """Open a support ticket (reversible: :meth:`close_ticket`), at most once per key.

        Returns:
            The ticket: ``ticket_id`` (``t-NNNN``), ``order_id``, ``subject``,
            ``body``, ``status`` (``open``), ``key``, ``created_at``.
        """

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            order_row(conn, order_id)
            ticket_id = self.store.next_id(conn, "ticket")
            conn.execute(
                "INSERT INTO tickets (ticket_id, order_id, subject, body, status, key,"
                " created_at) VALUES (?, ?, ?, ?, 'open', ?, ?)",
                (ticket_id, order_id, subject, body, key, now_iso()),
            )
            return _ticket_row(conn, ticket_id)

        request = {"order_id": order_id, "subject": subject, "body": body}
        return self.store.mutate("create_ticket", key, request, apply)

    def close_ticket(self, ticket_id: str, key: str, reason: str = "") -> dict[str, Any]:
        """Close a ticket (the compensation of :meth:`create_ticket`); idempotent by key.

        Closing an already closed ticket changes nothing and returns it.

        Returns:
            The ticket after closing.

        Raises:
            TicketNotFound: No such ticket.
        """

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            ticket = _ticket_row(conn, ticket_id)
            if ticket["status"] != "closed":
                conn.execute(
                    "UPDATE tickets SET status = 'closed', closed_at = ?, close_key = ?,"
                    " close_reason = ? WHERE ticket_id = ?",
                    (now_iso(), key, reason, ticket_id),
                )
            return _ticket_row(conn, ticket_id)

        request = {"ticket_id": ticket_id, "reason": reason}
        return self.store.mutate("close_ticket", key, request, apply)

    def find_ticket(self, key: str) -> dict[str, Any] | None:
        """The ticket created with ``key``, or ``None``."""
        return self.store.find("find_ticket", "tickets", key)


__all__ = ["Tickets"]

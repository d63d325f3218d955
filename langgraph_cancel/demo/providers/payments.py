"""The payments provider: refunds, irreversible, at most one per idempotency key."""

from __future__ import annotations

import sqlite3
from typing import Any

from langgraph_cancel.demo.providers.errors import RefundRejected
from langgraph_cancel.demo.providers.orders import order_row
from langgraph_cancel.demo.providers.store import ProviderStore, now_iso, require_row, row_dict


class Payments:
    """The payments provider.

    Args:
        store: The providers' file.
    """

    def __init__(self, store: ProviderStore) -> None:
        self.store = store

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
            order = order_row(conn, order_id)
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
            refund_id = self.store.next_id(conn, "refund")
            conn.execute(
                "INSERT INTO refunds (refund_id, order_id, amount, currency, status, key,"
                " created_at) VALUES (?, ?, ?, ?, 'succeeded', ?, ?)",
                (refund_id, order_id, value, order["currency"], key, now_iso()),
            )
            row = conn.execute("SELECT * FROM refunds WHERE refund_id = ?", (refund_id,))
            return require_row(row_dict(row.fetchone()))

        return self.store.mutate("refund", key, {"order_id": order_id, "amount": value}, apply)

    def find_refund(self, key: str) -> dict[str, Any] | None:
        """The refund made with ``key``, or ``None`` if there is none (yet)."""
        return self.store.find("find_refund", "refunds", key)


__all__ = ["Payments"]

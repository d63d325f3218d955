"""The order database: orders read, updated (reversible) and restored (the undo).

``update_order`` records the values it replaced, so ``restore_order`` can put them
back; a restore given the values the update wrote refuses to clobber a later change.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

from langgraph_cancel.demo.providers.errors import OrderNotFound, RestoreConflict
from langgraph_cancel.demo.providers.store import ProviderStore, now_iso, row_dict

#: Order fields ``update_order`` may change (and ``restore_order`` may restore).
UPDATABLE_ORDER_FIELDS: frozenset[str] = frozenset({"status", "note"})


def order_row(conn: sqlite3.Connection, order_id: str) -> dict[str, Any]:
    """The order's record, read inside ``conn``'s transaction.

    Raises:
        OrderNotFound: No such order.
    """
    row = row_dict(conn.execute("SELECT * FROM orders WHERE order_id = ?", (order_id,)).fetchone())
    if row is None:
        raise OrderNotFound(f"no order {order_id!r}")
    return row


def _set_order_fields(conn: sqlite3.Connection, order_id: str, values: Mapping[str, Any]) -> None:
    for name in sorted(values):
        if name not in UPDATABLE_ORDER_FIELDS:
            raise ValueError(f"order field {name!r} cannot be changed")
        conn.execute(
            f"UPDATE orders SET {name} = ?, updated_at = ? WHERE order_id = ?",
            (values[name], now_iso(), order_id),
        )


def _changed_since(current: Mapping[str, Any], expected: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``current`` that no longer hold the ``expected`` values."""
    return {
        name: current.get(name) for name, value in expected.items() if current.get(name) != value
    }


class Orders:
    """The order database.

    Args:
        store: The providers' file.
    """

    def __init__(self, store: ProviderStore) -> None:
        self.store = store

    def get_order(self, order_id: str) -> dict[str, Any]:
        """The order's current record.

        Raises:
            OrderNotFound: No such order.
        """
        result: dict[str, Any] = self.store.read(
            "get_order", lambda conn: order_row(conn, order_id)
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
        changes = {str(name): value for name, value in fields.items()}
        unknown = set(changes) - UPDATABLE_ORDER_FIELDS
        if not changes or unknown:
            raise ValueError(
                f"update_order needs fields among {sorted(UPDATABLE_ORDER_FIELDS)}, got {changes}"
            )

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            before = order_row(conn, order_id)
            previous = {name: before[name] for name in sorted(changes)}
            _set_order_fields(conn, order_id, changes)
            update_id = self.store.next_id(conn, "update")
            applied_at = now_iso()
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
                "order": order_row(conn, order_id),
            }

        request = {"order_id": order_id, "fields": changes}
        return self.store.mutate("update_order", key, request, apply)

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
        values = {str(name): value for name, value in previous.items()}
        request: dict[str, Any] = {"order_id": order_id, "previous": values}
        if expected is not None:
            request["expected"] = dict(expected)

        def apply(conn: sqlite3.Connection) -> dict[str, Any]:
            current = order_row(conn, order_id)
            changed = {} if expected is None else _changed_since(current, expected)
            if changed:
                raise RestoreConflict(
                    f"order {order_id} changed since the update being undone: now {changed}, "
                    f"expected {dict(expected or {})}"
                )
            _set_order_fields(conn, order_id, values)
            restore_id = self.store.next_id(conn, "restore")
            applied_at = now_iso()
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
                "order": order_row(conn, order_id),
            }

        return self.store.mutate("restore_order", key, request, apply)

    def find_update(self, key: str) -> dict[str, Any] | None:
        """The order update made with ``key`` (with ``fields`` and ``previous``), or ``None``."""
        return self.store.find("find_update", "order_updates", key, ("fields", "previous"))

    def find_restore(self, key: str) -> dict[str, Any] | None:
        """The restore made with ``key``, or ``None``."""
        return self.store.find("find_restore", "order_restores", key, ("restored",))


__all__ = ["UPDATABLE_ORDER_FIELDS", "Orders", "order_row"]

"""The external systems the refund agent touches, faked with their own SQLite file.

:class:`Providers` is the facade over them: one object per provider (payments,
email, the order database, the ticket desk, the chat channel, the policy search;
each in its module of :mod:`langgraph_cancel.demo.providers`) over one
:class:`~langgraph_cancel.demo.providers.store.ProviderStore`.

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
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from langgraph_cancel.demo.providers.chat import Chat
from langgraph_cancel.demo.providers.errors import (
    IdempotencyKeyReused,
    OrderNotFound,
    ProviderError,
    RefundRejected,
    RestoreConflict,
    TicketNotFound,
)
from langgraph_cancel.demo.providers.faults import (
    MUTATING_OPERATIONS,
    OPERATIONS,
    READ_OPERATIONS,
    Fault,
)
from langgraph_cancel.demo.providers.mail import Mailer
from langgraph_cancel.demo.providers.orders import UPDATABLE_ORDER_FIELDS, Orders
from langgraph_cancel.demo.providers.payments import Payments
from langgraph_cancel.demo.providers.policies import Policies
from langgraph_cancel.demo.providers.store import ProviderStore, require_row, row_dict
from langgraph_cancel.demo.providers.tickets import Tickets

ENV_PROVIDERS_DB = "REFUND_AGENT_PROVIDERS_DB"
DEFAULT_PROVIDERS_DB = "./refund-providers.db"


class Providers:
    """The fake external systems, backed by one SQLite file.

    Every method opens the file, does its work in one transaction and closes
    it, so instances are cheap, hold no state but the path, and any number of
    processes may use the same file. Each provider is also reachable on its own
    (``providers.payments``, ``.mail``, ``.orders``, ``.tickets``, ``.chat``,
    ``.policies``); the methods here are theirs.

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
        self.store = ProviderStore(path, busy_timeout=busy_timeout, in_flight_grace=in_flight_grace)
        self.path = self.store.path
        self.payments = Payments(self.store)
        self.mail = Mailer(self.store)
        self.orders = Orders(self.store)
        self.tickets = Tickets(self.store)
        self.chat = Chat(self.store)
        self.policies = Policies(self.store)

    def __repr__(self) -> str:
        return f"Providers({str(self.path)!r})"

    # ------------------------------------------------------ faults and keys

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
        self.store.set_fault(operation, mode, times=times)

    def clear_faults(self) -> None:
        """Disarm every fault."""
        self.store.clear_faults()

    def faults(self) -> dict[str, Fault]:
        """The armed faults, by operation."""
        return self.store.faults()

    def executions(self, key: str) -> int:
        """How many times a request with ``key`` was applied (0 or 1 when keys are honoured)."""
        return self.store.executions(key)

    def attempts(self, key: str) -> int:
        """How many requests with ``key`` arrived, applied or not (replays included)."""
        return self.store.attempts(key)

    def pending(self, key: str) -> bool:
        """True while a request with ``key`` is being processed (in flight, not yet applied)."""
        return self.store.pending(key)

    # ------------------------------------------------------------ providers

    def refund(self, order_id: str, amount: float, key: str) -> dict[str, Any]:
        """Refund ``amount`` of an order, at most once per key (:meth:`Payments.refund`)."""
        return self.payments.refund(order_id, amount, key)

    def find_refund(self, key: str) -> dict[str, Any] | None:
        """The refund made with ``key``, or ``None`` if there is none (yet)."""
        return self.payments.find_refund(key)

    def send_email(self, to: str, subject: str, body: str, key: str) -> dict[str, Any]:
        """Send an email, at most once per key (:meth:`Mailer.send_email`)."""
        return self.mail.send_email(to, subject, body, key)

    def find_email(self, key: str) -> dict[str, Any] | None:
        """The email sent with ``key``, or ``None``."""
        return self.mail.find_email(key)

    def get_order(self, order_id: str) -> dict[str, Any]:
        """The order's current record (:meth:`Orders.get_order`)."""
        return self.orders.get_order(order_id)

    def update_order(self, order_id: str, fields: Mapping[str, Any], key: str) -> dict[str, Any]:
        """Change an order's fields, at most once per key (:meth:`Orders.update_order`)."""
        return self.orders.update_order(order_id, fields, key)

    def restore_order(
        self,
        order_id: str,
        previous: Mapping[str, Any],
        key: str,
        *,
        expected: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Put an order's fields back (:meth:`Orders.restore_order`)."""
        return self.orders.restore_order(order_id, previous, key, expected=expected)

    def find_update(self, key: str) -> dict[str, Any] | None:
        """The order update made with ``key`` (with ``fields`` and ``previous``), or ``None``."""
        return self.orders.find_update(key)

    def find_restore(self, key: str) -> dict[str, Any] | None:
        """The restore made with ``key``, or ``None``."""
        return self.orders.find_restore(key)

    def create_ticket(self, order_id: str, subject: str, body: str, key: str) -> dict[str, Any]:
        """Open a support ticket, at most once per key (:meth:`Tickets.create_ticket`)."""
        return self.tickets.create_ticket(order_id, subject, body, key)

    def close_ticket(self, ticket_id: str, key: str, reason: str = "") -> dict[str, Any]:
        """Close a ticket; idempotent by key (:meth:`Tickets.close_ticket`)."""
        return self.tickets.close_ticket(ticket_id, key, reason)

    def find_ticket(self, key: str) -> dict[str, Any] | None:
        """The ticket created with ``key``, or ``None``."""
        return self.tickets.find_ticket(key)

    def post_message(self, channel: str, text: str, key: str) -> dict[str, Any]:
        """Post a chat message, at most once per key (:meth:`Chat.post_message`)."""
        return self.chat.post_message(channel, text, key)

    def find_message(self, key: str) -> dict[str, Any] | None:
        """The chat message posted with ``key``, or ``None``."""
        return self.chat.find_message(key)

    def search_policy(self, query: str, limit: int = 3) -> list[dict[str, Any]]:
        """Policies matching the query's words, best first (:meth:`Policies.search_policy`)."""
        return self.policies.search_policy(query, limit)

    # ------------------------------------------------------------------ truth

    def truth(self) -> dict[str, Any]:
        """Everything the external systems hold, as a JSON-able dict (one snapshot).

        Returns:
            ``orders`` (by id), ``refunds``, ``emails``, ``updates``, ``restores``,
            ``tickets``, ``messages``, ``keys`` (per key: operation, attempts,
            executions, state) and ``faults``.
        """
        with self.store.transaction("DEFERRED") as conn:

            def rows(sql: str, json_columns: Sequence[str] = ()) -> list[dict[str, Any]]:
                return [require_row(row_dict(row, json_columns)) for row in conn.execute(sql)]

            orders = {
                order["order_id"]: order for order in rows("SELECT * FROM orders ORDER BY order_id")
            }
            keys = {
                record["key"]: {
                    "operation": record["operation"],
                    "attempts": record["attempts"],
                    "executions": record["executions"],
                    "state": record["state"],
                }
                for record in rows("SELECT * FROM idempotency ORDER BY first_seen_at, key")
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
                    fault["operation"]: {"mode": fault["mode"], "remaining": fault["remaining"]}
                    for fault in rows("SELECT * FROM faults ORDER BY operation")
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

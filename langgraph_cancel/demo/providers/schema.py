"""The providers' tables and the world they start with.

Each provider keeps its rows in its own tables of the one SQLite file; ``idempotency``
and ``faults`` are the machinery every provider shares (see
:mod:`~langgraph_cancel.demo.providers.store`). A fresh file is seeded with a few
orders, the shop's policies and the counters that number new records.
"""

from __future__ import annotations

from collections.abc import Mapping

#: The version a set-up file records in its ``meta`` table.
SCHEMA_VERSION = "1"

#: The tables, created if missing.
SCHEMA: tuple[str, ...] = (
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

#: The orders of a fresh file: id, customer, email, total (USD), status.
SEED_ORDERS: tuple[tuple[str, str, str, float, str], ...] = (
    ("o-88", "Dana Whitfield", "dana@example.com", 249.00, "refund_requested"),
    ("o-91", "Sam Okafor", "sam@example.com", 42.50, "delivered"),
    ("o-93", "Priya Raman", "priya@example.com", 89.99, "shipped"),
    ("o-97", "Lee Moreau", "lee@example.com", 1200.00, "delivered"),
    ("o-102", "Ana Costa", "ana@example.com", 15.00, "processing"),
)

#: The policies of a fresh file: id, title, body.
SEED_POLICIES: tuple[tuple[str, str, str], ...] = (
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

#: The first number of each kind of record.
COUNTER_STARTS: Mapping[str, int] = {
    "refund": 4471,
    "email": 1001,
    "update": 501,
    "restore": 301,
    "ticket": 7001,
    "message": 9001,
}
#: The prefix of each kind of record's id (``r-4471``).
ID_PREFIX: Mapping[str, str] = {
    "refund": "r",
    "email": "e",
    "update": "u",
    "restore": "rs",
    "ticket": "t",
    "message": "m",
}

__all__ = [
    "COUNTER_STARTS",
    "ID_PREFIX",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SEED_ORDERS",
    "SEED_POLICIES",
]

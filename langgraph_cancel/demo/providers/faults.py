"""Faults armed in the providers' file, so a test can make another process's call fail.

A fault applies to one operation (:data:`OPERATIONS`) and fires for its next requests:
``fail_before`` (the request never reaches the server: ``ConnectionError``, nothing
applied), ``fail_after`` (applied, then ``TimeoutError`` as if the response was lost)
or ``hang:SECONDS`` (the request is in flight for that long, then applied).
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

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


def parse_mode(mode: str) -> str:
    """A fault mode in its stored spelling (``hang:5.0`` is ``hang:5``).

    Raises:
        ValueError: Not ``none``, ``fail_before``, ``fail_after`` or ``hang:SECONDS``
            with a finite number of seconds, zero or more.
    """
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


def check_operation(operation: str) -> None:
    """Refuse a name that is not one of :data:`OPERATIONS`.

    Raises:
        ValueError: An unknown operation.
    """
    if operation not in OPERATIONS:
        raise ValueError(
            f"unknown operation {operation!r}; expected one of {', '.join(sorted(OPERATIONS))}"
        )


def store_fault(conn: sqlite3.Connection, operation: str, mode: str, times: int | None) -> None:
    """Arm (or, with mode ``none``, clear) one operation's fault inside a transaction."""
    if mode == "none":
        conn.execute("DELETE FROM faults WHERE operation = ?", (operation,))
        return
    conn.execute(
        "INSERT INTO faults (operation, mode, remaining) VALUES (?, ?, ?) "
        "ON CONFLICT(operation) DO UPDATE SET mode = excluded.mode, "
        "remaining = excluded.remaining",
        (operation, mode, times),
    )


def take_fault(conn: sqlite3.Connection, operation: str) -> Fault | None:
    """The operation's armed fault, counted as fired once (cleared after its last time)."""
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


__all__ = [
    "MUTATING_OPERATIONS",
    "OPERATIONS",
    "READ_OPERATIONS",
    "Fault",
    "check_operation",
    "parse_mode",
    "store_fault",
    "take_fault",
]

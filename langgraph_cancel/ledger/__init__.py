"""The effect ledger: what every tool call of every run did, durably."""

from langgraph_cancel.ledger.aio import AsyncLedger
from langgraph_cancel.ledger.backends import Backend, SqliteBackend
from langgraph_cancel.ledger.core import (
    Ledger,
    backend_from_url,
    default_owner,
    derive_effect_id,
    derive_idempotency_key,
)
from langgraph_cancel.ledger.postgres import PostgresBackend

__all__ = [
    "AsyncLedger",
    "Backend",
    "Ledger",
    "PostgresBackend",
    "SqliteBackend",
    "backend_from_url",
    "default_owner",
    "derive_effect_id",
    "derive_idempotency_key",
]

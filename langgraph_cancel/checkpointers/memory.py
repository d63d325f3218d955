"""``MemoryCancelSaver``: LangGraph's in-memory saver plus an in-memory ledger."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

from langgraph_cancel.checkpointers.base import LedgerOwner
from langgraph_cancel.ledger import Ledger


class MemoryCancelSaver(InMemorySaver, LedgerOwner):
    """In-memory checkpointer and ledger, for tests and notebooks.

    Nothing survives the process; use ``SqliteCancelSaver`` for that.

    Args:
        ledger: Share an existing ledger instead of a fresh in-memory one.
        **kwargs: Passed to ``InMemorySaver``.
    """

    def __init__(self, *, ledger: Ledger | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ledger = ledger if ledger is not None else Ledger.from_url("memory://")

    def setup(self) -> None:
        """Nothing to create for checkpoints; migrates the ledger (idempotent)."""
        self.setup_ledger()

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and its ledger rows."""
        super().delete_thread(thread_id)
        self.ledger.delete_thread(thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async ``delete_thread``."""
        self.delete_thread(thread_id)

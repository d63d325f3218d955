"""LangGraph checkpointers that also own the effect ledger, one database each.

Import the one you need from its module (``memory``, ``sqlite``, ``postgres``)
so that the PostgreSQL driver is only needed when PostgreSQL is used.
"""

from langgraph_cancel.checkpointers.base import LedgerOwner

__all__ = ["LedgerOwner"]

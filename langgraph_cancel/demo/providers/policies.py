"""The shop's policies, searched by the words of a question (read only)."""

from __future__ import annotations

import sqlite3
from typing import Any

from langgraph_cancel.demo.providers.store import ProviderStore, require_row, row_dict


class Policies:
    """The policy search.

    Args:
        store: The providers' file.
    """

    def __init__(self, store: ProviderStore) -> None:
        self.store = store

    def search_policy(self, query: str, limit: int = 3) -> list[dict[str, Any]]:
        """Policies matching the query's words, best match first.

        Args:
            query: Free text; policies are ranked by how many of its words they contain.
            limit: At most this many results.

        Returns:
            ``policy_id``, ``title``, ``body`` and ``score`` for each match.
        """
        words = {word.strip(".,;:!?\"'()").lower() for word in query.split()}
        words = {word for word in words if len(word) > 2}

        def search(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            hits: list[dict[str, Any]] = []
            for row in conn.execute("SELECT policy_id, title, body FROM policies"):
                text = f"{row['title']} {row['body']}".lower()
                score = sum(1 for word in words if word in text)
                if score:
                    hits.append({**require_row(row_dict(row)), "score": score})
            hits.sort(key=lambda hit: (-hit["score"], hit["policy_id"]))
            return hits[:limit]

        result: list[dict[str, Any]] = self.store.read("search_policy", search)
        return result


__all__ = ["Policies"]

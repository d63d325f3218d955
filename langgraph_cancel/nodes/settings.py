"""How ``add_cancellation`` was configured, as every node it adds reads it.

The settings live below the graph layer so that the cancel protocol, the
reconciliation and the entry subgraph read one record without importing the
builder that makes it (the sweeper and the middleware make their own).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.tools import BaseTool

from langgraph_cancel.effects import CLASSIFIED_TOOLS, EffectSpec, spec_of
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.limits import Limits

#: The state key the cancellation report is written to, unless configured otherwise.
REPORT_KEY = "cancellation_report"


@dataclass
class CancellationSettings:
    """How ``add_cancellation`` was configured."""

    ledger: Ledger | str | None = None
    compensate_on_cancel: bool = False
    cancel_timeout: float = 30.0
    messages_key: str = "messages"
    report_key: str = REPORT_KEY
    reconcile_interactive: bool = True
    tools: dict[str, BaseTool] = field(default_factory=dict)
    limits: Limits | None = None
    #: The messages channel merges with ``add_messages``, so answers given after new
    #: input can be put before it, right after their calls (else they are appended).
    places_answers: bool = False

    def tool(self, name: str) -> BaseTool | None:
        """A tool by name: from this graph's tool nodes, else from any in the process."""
        return self.tools.get(name) or CLASSIFIED_TOOLS.get(name)

    def spec(self, name: str) -> EffectSpec | None:
        """The effect declaration of a tool, if the tool is known."""
        found = self.tool(name)
        return None if found is None else spec_of(found)

    def all_tools(self) -> Mapping[str, BaseTool]:
        """Every tool this graph knows by name."""
        return {**CLASSIFIED_TOOLS, **self.tools}

    def messages(self, state: Any) -> list[Any]:
        """The messages of a graph state (a dict, a list, or an object with the key)."""
        if isinstance(state, dict):
            return list(state.get(self.messages_key) or [])
        if isinstance(state, list):
            return state
        return list(getattr(state, self.messages_key, None) or [])


__all__ = ["REPORT_KEY", "CancellationSettings"]

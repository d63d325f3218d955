"""The refund agent again, built by LangChain's ``create_agent`` with ``EffectMiddleware``.

The same model, tools and system prompt as :mod:`langgraph_cancel.demo.graph`, in the
graph ``create_agent`` makes (``model`` and ``tools`` nodes, nothing added): the
middleware classifies and records each call, asks a reviewer before a refund over 100
(in LangChain's per-call approval shape), and carries the run's start, stop and end
on the model calls. ``create_agent`` sends a turn's calls at once, so a stop pressed
during a turn's slow call does not drop the calls beside it; it ends the agent at its
next model call.

To serve it to ``langgraph dev`` and Studio, add it to ``langgraph.json``::

    "graphs": {"refund_agent_middleware": "langgraph_cancel.demo.agent:agent"}

Its ledger is ``$LANGGRAPH_CANCEL_DB``, else ``.langgraph-cancel.db``, as the other
served graph's (``served_ledger_url``).
"""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel

from langgraph_cancel.demo.graph import SYSTEM_PROMPT, default_model, served_ledger_url
from langgraph_cancel.demo.tools import TOOLS
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.middleware import EffectMiddleware

#: The name the served agent carries (and ``langgraph.json`` may serve it under).
AGENT_NAME = "refund_agent_middleware"


def build_agent(
    model: BaseChatModel | None = None,
    *,
    ledger: Ledger | str | None = None,
    checkpointer: Any = None,
    compensate_on_cancel: bool = False,
    cancel_timeout: float = 30.0,
) -> Any:
    """The refund agent made by ``create_agent``, guarded by ``EffectMiddleware``.

    Args:
        model: The chat model (default: ``default_model()``, the scripted seed model
            without ``OPENAI_API_KEY``).
        ledger: Where effects live when the agent runs without one of our savers (a
            ``Ledger`` or a URL); default: the checkpointer's ledger.
        checkpointer: The saver to compile with (none: the server brings its own).
        compensate_on_cancel: Undo committed reversible effects on cancel.
        cancel_timeout: Seconds a stop waits for the calls in flight.

    Returns:
        The compiled agent.
    """
    middleware = EffectMiddleware(
        ledger=ledger, compensate_on_cancel=compensate_on_cancel, cancel_timeout=cancel_timeout
    )
    return create_agent(
        model if model is not None else default_model(),
        list(TOOLS),
        system_prompt=SYSTEM_PROMPT,
        middleware=[middleware],
        checkpointer=checkpointer,
        name=AGENT_NAME,
    )


#: The agent ``langgraph dev`` serves: no checkpointer of its own (the server brings
#: one), its ledger named by ``served_ledger_url``.
agent = build_agent(ledger=served_ledger_url())

__all__ = ["AGENT_NAME", "agent", "build_agent"]

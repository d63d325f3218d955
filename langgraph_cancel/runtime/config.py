"""What a run's config says: its thread and its durability; the command line's database.

LangGraph hands every node the run's config. A run needs a thread (nothing is
durable without one) and a checkpoint after each tool batch (``durability="exit"``
would lose every batch of a crashed run); both are checked here, with a clear
typed error when they are missing.
"""

from __future__ import annotations

import os

from langchain_core.runnables import RunnableConfig

from langgraph_cancel.errors import ConfigurationError, DurabilityError
from langgraph_cancel.ledgers import ENV_DB
from langgraph_cancel.urls import DEFAULT_DB_URL

#: Where LangGraph puts a run's durability in a node's config.
CONFIG_KEY_DURABILITY = "__pregel_durability"
#: The configurable key naming the worker an invocation acts as (its lease owner).
CONFIG_KEY_WORKER = "langgraph_cancel_worker"


def default_db_url() -> str:
    """The command line's default database: ``$LANGGRAPH_CANCEL_DB`` or a file here."""
    return os.environ.get(ENV_DB) or DEFAULT_DB_URL


def thread_id_of(config: RunnableConfig | None) -> str:
    """The thread id of a run.

    Raises:
        ConfigurationError: When the config has none (nothing durable without it).
    """
    conf = (config or {}).get("configurable", {})
    thread_id = conf.get("thread_id")
    if not thread_id:
        raise ConfigurationError(
            "langgraph-cancel needs a thread: invoke with "
            'config={"configurable": {"thread_id": ...}}'
        )
    return str(thread_id)


def check_durability(config: RunnableConfig | None, durability: str | None = None) -> None:
    """Refuse ``durability="exit"``: a crash would lose every tool batch of the run.

    Args:
        config: A node's config (LangGraph puts the run's durability in it).
        durability: The ``durability=`` an invocation was given, checked at its start.

    Raises:
        DurabilityError: Under ``durability="exit"``.
    """
    conf = (config or {}).get("configurable", {})
    if (durability or conf.get(CONFIG_KEY_DURABILITY)) == "exit":
        raise DurabilityError(
            'durability="exit" writes one checkpoint at the end of the run, so a crash '
            "loses every tool batch; langgraph-cancel needs a checkpoint after each batch: "
            'use durability="sync" or "async" (the default)'
        )


__all__ = [
    "CONFIG_KEY_DURABILITY",
    "CONFIG_KEY_WORKER",
    "check_durability",
    "default_db_url",
    "thread_id_of",
]

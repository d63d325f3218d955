"""The task tree: sub-agents on their own threads, cancelled with their parent.

A node that starts a sub-agent registers it first::

    child_cfg = child_config(config, f"{thread}-research")
    result = research_agent.invoke(inputs, child_cfg)

The child's run is recorded with the parent's run as its parent, so a cancel
of the parent cascades to the child (recursively), the parent's cancel waits
(bounded) for its children to stop, and the report counts as ``orphans`` the
children that never observed the signal.
"""

from __future__ import annotations

from langchain_core.runnables import RunnableConfig

from langgraph_cancel.ledger import Ledger
from langgraph_cancel.runtime import CONFIG_KEY_LEDGER, scope_for
from langgraph_cancel.types import RunStatus


def child_config(
    config: RunnableConfig,
    child_thread_id: str,
    *,
    ledger: Ledger | str | None = None,
) -> RunnableConfig:
    """Register a sub-agent run under the current run; the config to invoke it with.

    Args:
        config: The parent node's config.
        child_thread_id: The sub-agent's own thread.
        ledger: The ledger, when not found through ``config``.

    Returns:
        A config naming the child thread and the same ledger. If the parent is
        already cancel-requested, the child run starts cancel-requested too, so
        it starts no work.
    """
    parent = scope_for(config, ledger=ledger, new_run=False)
    child = parent.ledger.start_run(child_thread_id, parent_run_id=parent.run_id)
    if parent.cancel_called() and child.status is RunStatus.RUNNING:
        parent.ledger.request_cancel(
            child_thread_id,
            reason=f"parent run {parent.run_id} cancelled",
            requested_by=parent.run.requested_by or "parent",
        )
    return {"configurable": {"thread_id": child_thread_id, CONFIG_KEY_LEDGER: parent.ledger}}


__all__ = ["child_config"]

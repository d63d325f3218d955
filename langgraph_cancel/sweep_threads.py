"""The sweeper's side of a thread's graph: its last checkpoint read, and the thread of
a finished stop closed as ``resume`` would close it (``langgraph_cancel.sweeper``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import Enum
from typing import Any, Literal

from langgraph.graph.message import add_messages

from langgraph_cancel.agents import guarded_agent
from langgraph_cancel.errors import ConfigurationError
from langgraph_cancel.execution.identity import dangling_tool_calls
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.lifecycle import CONFIG_KEY_WORKER
from langgraph_cancel.nodes.cancel import answers_from_ledger
from langgraph_cancel.nodes.names import CANCEL_NODE
from langgraph_cancel.nodes.settings import CancellationSettings
from langgraph_cancel.types import RunRecord

logger = logging.getLogger("langgraph_cancel.sweeper")


class CloseOutcome(str, Enum):
    """What ``SweptThreads.close`` did with a stopped thread."""

    CLOSED = "closed"
    #: No graph given, the graph had ended (with its report, or with no cancel node to
    #: write it as), or its pending nodes are another agent's.
    NOT_CLOSED = "not_closed"
    #: Running the graph on failed (logged): the database went away, say.
    FAILED = "failed"


CloseOutcomeLiteral = Literal["closed", "not_closed", "failed"]


def compile_on(graph: Any, saver: Any) -> tuple[Any, CancellationSettings]:
    """The agent ``graph`` names compiled on the sweeper's saver, and its settings.

    Raises:
        ConfigurationError: ``graph`` is neither prepared with ``add_cancellation``
            nor a ``create_agent`` agent with ``EffectMiddleware``, or there is no
            saver to compile it on.
    """
    agent = guarded_agent(graph)
    if agent is None:
        raise ConfigurationError(
            "graph= must be prepared with add_cancellation(builder), or be a "
            "create_agent agent with EffectMiddleware"
        )
    if saver is None:
        raise ConfigurationError(
            "graph= needs a checkpoint saver as the sweeper's target, to read and close its threads"
        )
    return agent.compile_on(saver), agent.settings


class SweptThreads:
    """What a sweeper reads of its threads' checkpoints, and how it closes a thread.

    Args:
        saver: The checkpoint saver, if the sweeper was given one.
        graph: The agent compiled on ``saver`` (``compile_on``), if given.
        owner: The worker identity the sweeper acts as.
        settings: The graph's cancellation settings (its messages and report keys).
        ledger: The ledger the threads' effects are recorded in (the answers to calls
            left unanswered are read from it).
    """

    def __init__(
        self,
        saver: Any,
        graph: Any,
        owner: str,
        settings: CancellationSettings,
        ledger: Ledger,
    ) -> None:
        self.saver = saver
        self.graph = graph
        self.owner = owner
        self.settings = settings
        self.ledger = ledger

    def close(self, thread_id: str, report: Mapping[str, Any] | None = None) -> CloseOutcome:
        """Run a finished stop's thread on to its end, as ``resume`` would.

        Its run is over, so every node its checkpoint has pending diverts to the
        cancel node, which finds the stored report, answers each call left
        unanswered and ends the graph; nothing is dispatched. The caller holds the
        thread's lease; the graph is invoked as its owner.

        A step whose tasks all finished, their writes saved, but whose own checkpoint
        was not (the worker died, or its database went away, in between) shows
        nothing next in LangGraph's state, with those writes in its values: a
        model's tool calls, say. It is closed too: resuming applies the writes and
        runs on.

        A graph that had run to its end, every call answered, when its stop was
        finished (the stop arrived after the graph's last check), and whose state the
        run's end could not then write, lacks only the run's report: given
        ``report``, it is written into the state as the cancel node leaves it, as the
        run's end would have. So is a graph whose run's end wrote half of that: it
        cleared the paused step's tasks, and its write of the answers and the report
        was lost; each call left unanswered is answered from the ledger, as the
        cancel node answers it.

        Args:
            thread_id: The thread.
            report: The stopped run's stored report (``RunRecord.report``).

        Returns:
            ``CLOSED``; ``NOT_CLOSED`` when there was nothing to close (no graph
            given, the graph had ended with its report, or without one and no cancel
            node to write it as) or the thread is another agent's on the same
            database (its checkpoint holds channels the given graph has not);
            ``FAILED`` when closing failed (logged).
        """
        if self.graph is None:
            return CloseOutcome.NOT_CLOSED
        config: Any = {"configurable": {"thread_id": thread_id, CONFIG_KEY_WORKER: self.owner}}
        try:
            if self._foreign(config):
                return CloseOutcome.NOT_CLOSED
            snapshot = self.graph.get_state(config)
            if not snapshot.tasks:
                return self._settle_ended(thread_id, config, snapshot.values, report)
            self.graph.invoke(None, config)
        except Exception:
            # The stop itself is finished; the caller keeps the thread for a later pass.
            logger.warning("could not close thread %s after its stop", thread_id, exc_info=True)
            return CloseOutcome.FAILED
        return CloseOutcome.CLOSED

    def _foreign(self, config: Any) -> bool:
        """Whether the thread's last checkpoint is another agent's on the same database:
        it holds channels the graph has not (each node's ``branch:to:`` channel among
        them). Node names alone may be shared (``tools``, say); run on such a thread,
        the graph would write its own channels into the other agent's checkpoint."""
        saved = self.saver.get_tuple(config)
        if saved is None:
            return False
        return not set(saved.checkpoint.get("channel_versions", {})) <= set(self.graph.channels)

    def _settle_ended(
        self,
        thread_id: str,
        config: Any,
        values: Mapping[str, Any],
        report: Mapping[str, Any] | None,
    ) -> CloseOutcome:
        """Write what the cancel node leaves into an ended graph's state that lacks it:
        ``report``, and an answer to each call left unanswered."""
        if report is None or CANCEL_NODE not in self.graph.nodes:
            return CloseOutcome.NOT_CLOSED
        messages_key, report_key = self.settings.messages_key, self.settings.report_key
        update: dict[str, Any] = {}
        dangling = dangling_tool_calls(values.get(messages_key) or [])
        if dangling:
            update[messages_key] = answers_from_ledger(self.ledger, thread_id, dangling)
        if dangling or self._reported_run(values) != report.get("run_id"):
            update[report_key] = dict(report)
        if not update:
            return CloseOutcome.NOT_CLOSED
        self.graph.update_state(config, update, as_node=CANCEL_NODE)
        return CloseOutcome.CLOSED

    def last_values(self, thread_id: str) -> Mapping[str, Any] | None:
        """The thread's last saved state (None without a saver): its checkpoint's
        channel values, with the messages and the report its step's finished tasks
        wrote (saved beside the checkpoint, as LangGraph's state shows them, when the
        step's own checkpoint was not saved)."""
        saved = self._saved_values(thread_id)
        return None if saved is None else saved[1]

    def _saved_values(self, thread_id: str) -> tuple[Mapping[str, Any], dict[str, Any]] | None:
        """The thread's last checkpoint's own channel values, and the same with the
        messages and the report its pending writes carry (None without a saver or a
        checkpoint)."""
        if self.saver is None:
            return None
        saved = self.saver.get_tuple({"configurable": {"thread_id": thread_id}})
        if saved is None:
            return None
        own: Mapping[str, Any] = saved.checkpoint.get("channel_values") or {}
        values: dict[str, Any] = dict(own)
        messages_key, report_key = self.settings.messages_key, self.settings.report_key
        for _task_id, channel, value in saved.pending_writes or []:
            if channel == messages_key:
                values[messages_key] = add_messages(values.get(messages_key) or [], value)
            elif channel == report_key:
                values[report_key] = value
        return own, values

    def dangling(self, thread_id: str) -> list[Any]:
        """The tool calls the thread's last checkpoint left unanswered (needs a saver)."""
        values = self.last_values(thread_id)
        if values is None:
            return []
        return dangling_tool_calls(values.get(self.settings.messages_key) or [])

    def left_open(self, thread_id: str, run: RunRecord) -> bool:
        """Whether the thread's last checkpoint lacks what the cancel node of ``run``
        leaves in it: every call answered and the run's report (needs a saver).

        Open when the checkpoint's own values lack it, even if the writes saved beside
        it supply it: LangGraph applies only the writes of the tasks it prepares from
        the checkpoint, and an update of the state whose checkpoint was not saved
        (the run's end writing the answers, say) leaves writes it never applies.
        """
        saved = self._saved_values(thread_id)
        return saved is not None and any(self._lacks_close(values, run) for values in saved)

    def _lacks_close(self, values: Mapping[str, Any], run: RunRecord) -> bool:
        unanswered = dangling_tool_calls(values.get(self.settings.messages_key) or [])
        return bool(unanswered) or self._reported_run(values) != run.run_id

    def _reported_run(self, values: Mapping[str, Any]) -> Any:
        """The run whose report the state holds, if any."""
        report = values.get(self.settings.report_key)
        return report.get("run_id") if isinstance(report, Mapping) else None


__all__ = ["CloseOutcome", "CloseOutcomeLiteral", "SweptThreads", "compile_on"]

"""The thread's saved state as a stopped run leaves it.

A run that stops between the cancel node's steps (a task cancel, a stop seen
after the last check, a drain) leaves LangGraph's saved state to be put right
from outside the graph: nothing queued that will not run, every tool call
answered, the report stored where the cancel node would have stored it, and,
while a stop waits for calls in flight, a ``cancelling`` report naming them.
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_core.messages import ToolCall
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END
from langgraph.graph.state import CompiledStateGraph

from langgraph_cancel.execution.identity import dangling_tool_calls
from langgraph_cancel.nodes.cancel import answer_dangling
from langgraph_cancel.nodes.names import CANCEL_NODE
from langgraph_cancel.nodes.settings import CancellationSettings
from langgraph_cancel.report import CancellationReport, build_report
from langgraph_cancel.runtime import RunScope
from langgraph_cancel.types import EffectStatus, RunStatus

logger = logging.getLogger("langgraph_cancel.graph")


class ThreadState:
    """One invocation's view of its thread's saved state (through the compiled graph).

    Args:
        graph: The compiled graph the run is an invocation of.
        config: The invocation's merged config.
        settings: How ``add_cancellation`` was configured.
        scope: The run's scope.
    """

    def __init__(
        self,
        graph: CompiledStateGraph,  # type: ignore[type-arg]
        config: RunnableConfig,
        settings: CancellationSettings,
        scope: RunScope,
    ) -> None:
        self.graph = graph
        self.settings = settings
        self.scope = scope
        self.invocation_config = config
        conf = {
            key: value
            for key, value in config.get("configurable", {}).items()
            if not key.startswith("__")
        }
        conf.pop("checkpoint_id", None)
        #: The thread's latest state, without the invocation's internals.
        self.config: RunnableConfig = {"configurable": conf}

    @property
    def saved(self) -> bool:
        """Whether the graph saves its state (it has a checkpointer)."""
        return self.graph.checkpointer is not None

    def has_values(self) -> bool:
        """Whether the thread has a saved state with anything in it."""
        return self.saved and bool(self.graph.get_state(self.config).values)

    def show_cancelling(self) -> None:
        """Put a ``cancelling`` report, naming the calls in flight the stop waits for, in
        the thread state before waiting for them.

        A server's ``runs.cancel(wait=True)`` returns once the run is marked
        interrupted, which does not wait for the cancelled task to finish: whoever
        looks at the thread then sees that the stop is under way and what it waits
        for, and the final report replaces this one when the calls have settled.
        """
        if not self.saved:
            return
        ledger = self.scope.ledger
        try:
            run = ledger.get_run(self.scope.run_id)
            if run.terminal:
                return
            in_flight = [
                rec.effect_id
                for rec in ledger.run_effects(run.run_id)
                if rec.status is EffectStatus.DISPATCHED
            ]
            if not in_flight:
                return  # nothing to wait for: the final report follows at once
            if run.status is RunStatus.CANCEL_REQUESTED:
                run = self.scope.signal.observe() or ledger.mark_observed(run.run_id)
            report = build_report(ledger, run, status=RunStatus.CANCELLING.value)
            report = report.model_copy(update={"awaiting": in_flight})
            self.keep_finished_writes()
            self.graph.update_state(
                self.config,
                {self.settings.report_key: report.model_dump(mode="json")},
                as_node=CANCEL_NODE,
            )
        except Exception:
            logger.warning("could not show the stop under way in the thread state", exc_info=True)

    def clear_queue(self) -> bool:
        """Drop the tasks a drained run still had queued; False if that failed (logged)."""
        checkpointer = self.invocation_config.get("configurable", {}).get("__pregel_checkpointer")
        if not self.saved and not checkpointer:
            return True
        try:
            self.graph.update_state(self.config, None, as_node=END)
        except Exception:
            logger.warning("could not clear queued tasks of a cancelled run", exc_info=True)
            return False
        return True

    def settle(self, report: CancellationReport | None, dangling: list[ToolCall]) -> bool:
        """Leave a cancelled run's state as the cancel node does: nothing queued, and,
        when the cancel was finished here, every call answered and the report stored.

        A diverted node's edges still fire, so a run can stop at an interrupt (e.g.
        ``interrupt_before``) after its cancel node ran; a cancel finished after the
        last check never reached the cancel node at all.

        Returns:
            False when the state could not be written (logged): the thread is left
            open, for the sweeper to close.
        """
        if not self.saved:
            return True
        try:
            if report is None:
                if self.graph.get_state(self.config).next:
                    self.graph.update_state(self.config, None, as_node=END)
                return True
            update: dict[str, Any] = {self.settings.report_key: report.model_dump(mode="json")}
            if dangling:
                update[self.settings.messages_key] = answer_dangling(self.scope, dangling)
            self.keep_finished_writes()
            self.graph.update_state(self.config, update, as_node=CANCEL_NODE)
        except Exception:
            logger.warning("could not settle the state of a cancelled run", exc_info=True)
            return False
        return True

    def keep_finished_writes(self) -> None:
        """Fold the writes of the saved step's finished tasks into the state.

        The run stopped inside a step (Ctrl-C, a server's ``runs.cancel``, a sibling
        that failed): a task that finished, a tool node with its answers, left its
        writes pending on the step's checkpoint. The live snapshot ``dangling``
        reads shows them (and no longer lists the task as next), so their calls are
        not answered again; an update of the state as another node (the cancel's)
        starts from the saved step and would drop them. Updating as ``END`` first
        keeps them and clears the tasks that will not run. Done once the cancel is
        finished, or when a stopped task shows its stop under way: until then the
        saved step names what to resume.
        """
        if self.graph.get_state(self.config).tasks:
            self.graph.update_state(self.config, None, as_node=END)

    def dangling(self) -> list[ToolCall]:
        """Tool calls the saved state leaves unanswered (none known without a checkpointer)."""
        if not self.saved:
            return []
        try:
            snapshot = self.graph.get_state(self.config)
        except Exception:
            logger.debug("no state to inspect", exc_info=True)
            return []
        return dangling_tool_calls(self.settings.messages(snapshot.values))


__all__ = ["ThreadState"]

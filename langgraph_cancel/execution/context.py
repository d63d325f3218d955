"""What every step of one call's protocol acts with: the run, the batch, the call's config.

A ``CallContext`` is made once per call by the interceptor (``interceptor.py``)
and handed to each step of the protocol (``protocol.py`` and the modules it
routes to); it holds no state of its own that changes while the call runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_cancel.execution.steps import Protocol, ledger_call
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.runtime import RunScope
from langgraph_cancel.types import EffectRecord

if TYPE_CHECKING:
    from langgraph_cancel.execution.batch import Batch
    from langgraph_cancel.execution.plan import CallPlan

#: Who reviews a call that needs approval: ask here, or trust a decision made elsewhere.
ReviewMode = Literal["ask", "trust"]


@dataclass(frozen=True, slots=True)
class CallContext:
    """What the protocol needs to act for one call.

    Attributes:
        scope: The run (ledger, thread, owner, cancel signal).
        batch: The tool node execution the call belongs to.
        config: The call's config (its step's checkpoint, the reviewer's identity).
        runtime: The call's ``ToolRuntime`` (or ``None`` outside a graph).
        cancel_timeout: Seconds a cancelled run still waits for a call in flight.
        checkpoint_timeout: Seconds a side effect waits for its step's checkpoint.
        review: ``"ask"`` interrupts for a call needing approval and having none;
            ``"trust"`` lets it go (someone else reviewed it, or nobody is to).
        capture: Whether ``ToolNode`` may turn a tool's exception into a message
            (``handle_tool_errors`` handles tool errors): then the exception is
            caught on its way, so a transient fault is still told from a failure.
    """

    scope: RunScope
    batch: Batch
    config: RunnableConfig
    runtime: Any
    cancel_timeout: float
    checkpoint_timeout: float
    review: Callable[[ToolCallRequest], ReviewMode]
    capture: bool = False

    @property
    def ledger(self) -> Ledger:
        """The run's ledger."""
        return self.scope.ledger

    @property
    def owner(self) -> str:
        """The worker acting for the run."""
        return self.scope.owner

    def record(self, plan: CallPlan, **fields: Any) -> Protocol[tuple[EffectRecord, bool]]:
        """Record ``plan``'s call in this run (``Ledger.plan``): ``(record, created)``.

        Args:
            plan: The call.
            **fields: What the record starts with besides the call itself (``status``,
                ``error``, ``detail``), or in its place (``idempotency_key``).
        """
        row: dict[str, Any] = {
            "tool_call_id": plan.ledger_id,
            "tool": plan.tool.name,
            "kind": plan.spec.kind,
            "args": plan.args,
            "idempotency_key": plan.key,
            "seq": plan.index,
            **fields,
        }
        recorded: tuple[EffectRecord, bool] = yield from ledger_call(
            Ledger.plan,
            thread_id=self.scope.thread_id,
            run_id=self.scope.run_id,
            owner=self.owner,
            actor=self.owner,
            **row,
        )
        return recorded


__all__ = ["CallContext", "ReviewMode"]

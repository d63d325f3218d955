"""langgraph-cancel: LangGraph agents that are safe to stop and safe to resume.

After cancellation no new side effect is initiated, every initiated effect
reaches a known state, and the user is told which effects are permanent.
After a crash, resuming a thread never repeats an effect that already
happened and never loses track of one that might have.
"""

from langgraph_cancel.api import (
    acompensate,
    aget_report,
    arequest_cancel,
    compensate,
    get_report,
    request_cancel,
)
from langgraph_cancel.effects import EffectSpec, Outcome, effect, idempotency_key
from langgraph_cancel.errors import (
    CheckpointNotSavedError,
    DurabilityError,
    IllegalTransitionError,
    InvalidDecisionError,
    LangGraphCancelError,
    ThreadBusy,
    ThreadBusyError,
    UnknownThreadError,
)
from langgraph_cancel.graph import CancellableGraph, add_cancellation
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.nodes import ApprovalGate, EffectToolNode
from langgraph_cancel.report import CancellationReport
from langgraph_cancel.runtime import is_cancelled
from langgraph_cancel.types import CancelPolicy, EffectKind, EffectStatus, RunStatus

__version__ = "0.1.0"

__all__ = [
    "ApprovalGate",
    "CancelPolicy",
    "CancellableGraph",
    "CancellationReport",
    "CheckpointNotSavedError",
    "DurabilityError",
    "EffectKind",
    "EffectSpec",
    "EffectStatus",
    "EffectToolNode",
    "IllegalTransitionError",
    "InvalidDecisionError",
    "LangGraphCancelError",
    "Ledger",
    "Outcome",
    "RunStatus",
    "ThreadBusy",
    "ThreadBusyError",
    "UnknownThreadError",
    "__version__",
    "acompensate",
    "add_cancellation",
    "aget_report",
    "arequest_cancel",
    "compensate",
    "effect",
    "get_report",
    "idempotency_key",
    "is_cancelled",
    "request_cancel",
]

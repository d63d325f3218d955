"""langgraph-cancel: LangGraph agents that are safe to stop and safe to resume.

After cancellation no new side effect is initiated, every initiated effect
reaches a known state, and the user is told which effects are permanent.
After a crash, resuming a thread never repeats an effect that already
happened and never loses track of one that might have.

The public names below are imported on first use (PEP 562), so that
``import langgraph_cancel.errors`` or the command line's ``--help`` does not
pay for importing LangGraph and LangChain.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from langgraph_cancel.ledger import AsyncLedger, Ledger
    from langgraph_cancel.limits import LimitName, Limits, Prices
    from langgraph_cancel.nodes import ApprovalGate, EffectToolNode
    from langgraph_cancel.outbox import Outbox, drain_outbox
    from langgraph_cancel.report import CancellationReport
    from langgraph_cancel.runtime import is_cancelled
    from langgraph_cancel.sweeper import Sweeper, SweepSummary, sweep
    from langgraph_cancel.types import CancelPolicy, EffectKind, EffectStatus, RunStatus

__version__ = "0.1.0"

#: Where each public name lives.
_EXPORTS: dict[str, str] = {
    "acompensate": "langgraph_cancel.api",
    "aget_report": "langgraph_cancel.api",
    "arequest_cancel": "langgraph_cancel.api",
    "compensate": "langgraph_cancel.api",
    "get_report": "langgraph_cancel.api",
    "request_cancel": "langgraph_cancel.api",
    "EffectSpec": "langgraph_cancel.effects",
    "Outcome": "langgraph_cancel.effects",
    "effect": "langgraph_cancel.effects",
    "idempotency_key": "langgraph_cancel.effects",
    "CheckpointNotSavedError": "langgraph_cancel.errors",
    "DurabilityError": "langgraph_cancel.errors",
    "IllegalTransitionError": "langgraph_cancel.errors",
    "InvalidDecisionError": "langgraph_cancel.errors",
    "LangGraphCancelError": "langgraph_cancel.errors",
    "ThreadBusy": "langgraph_cancel.errors",
    "ThreadBusyError": "langgraph_cancel.errors",
    "UnknownThreadError": "langgraph_cancel.errors",
    "CancellableGraph": "langgraph_cancel.graph",
    "add_cancellation": "langgraph_cancel.graph",
    "AsyncLedger": "langgraph_cancel.ledger",
    "Ledger": "langgraph_cancel.ledger",
    "LimitName": "langgraph_cancel.limits",
    "Limits": "langgraph_cancel.limits",
    "Prices": "langgraph_cancel.limits",
    "ApprovalGate": "langgraph_cancel.nodes",
    "EffectToolNode": "langgraph_cancel.nodes",
    "Outbox": "langgraph_cancel.outbox",
    "drain_outbox": "langgraph_cancel.outbox",
    "CancellationReport": "langgraph_cancel.report",
    "is_cancelled": "langgraph_cancel.runtime",
    "Sweeper": "langgraph_cancel.sweeper",
    "SweepSummary": "langgraph_cancel.sweeper",
    "sweep": "langgraph_cancel.sweeper",
    "CancelPolicy": "langgraph_cancel.types",
    "EffectKind": "langgraph_cancel.types",
    "EffectStatus": "langgraph_cancel.types",
    "RunStatus": "langgraph_cancel.types",
}


def __getattr__(name: str) -> Any:
    """Import a public name from its module the first time it is asked for."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'langgraph_cancel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "ApprovalGate",
    "AsyncLedger",
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
    "LimitName",
    "Limits",
    "Outbox",
    "Outcome",
    "Prices",
    "RunStatus",
    "SweepSummary",
    "Sweeper",
    "ThreadBusy",
    "ThreadBusyError",
    "UnknownThreadError",
    "__version__",
    "acompensate",
    "add_cancellation",
    "aget_report",
    "arequest_cancel",
    "compensate",
    "drain_outbox",
    "effect",
    "get_report",
    "idempotency_key",
    "is_cancelled",
    "request_cancel",
    "sweep",
]

"""``ApprovalGate``: a human decides before any call that needs approval is dispatched.

Place it between the model and ``EffectToolNode``::

    builder.add_node("approval", ApprovalGate(tools))
    builder.add_node("tools", EffectToolNode(tools))
    builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
    builder.add_edge("approval", "tools")

For the unanswered tool calls of the last ``AIMessage`` that need approval
(``EffectSpec.needs_approval``: by default every irreversible call), the gate
records each in the ledger as ``pending_approval`` and raises one
``interrupt()`` whose value has the shape of LangChain's
``HumanInTheLoopMiddleware`` request (``HITLRequest``: ``action_requests`` and
``review_configs``), with a few extra fields per action (effect kind, why it is
permanent, idempotency key, tool-call id), so an interface that renders HITL
interrupts renders this one.

The resume value is ``HITLResponse``-shaped (``{"decisions": [...]}``, or a bare
list), one decision per action request, in order:

- ``{"type": "approve"}``: the record becomes ``approved``; the tool node dispatches it.
- ``{"type": "edit", "edited_action": {"name": ..., "args": {...}}}``: the new
  arguments are validated against the tool's schema. Invalid: the whole batch is
  asked again (a new interrupt whose action carries ``error``); nothing is
  approved. Valid: the record becomes ``approved`` with the edited arguments,
  and the ``AIMessage`` in state is rewritten (same id) to show them. An edit
  that changes the call's idempotency key (another order, say) is a new effect
  under the new key; the original is recorded rejected, replaced by it.
- ``{"type": "reject", "message": "..."}``: the record becomes ``rejected``;
  the tool node answers the call with ``Rejected by reviewer: <message>``,
  marked as LangChain's HITL marks the answers it gives.
- ``{"type": "respond", "message": "..."}``: the tool does not run; the text is
  its answer (recorded ``rejected``, with the text).

A malformed resume value (wrong count, unknown type, an edit naming another
tool or with non-object args) is asked about again too: the new interrupt's
``error`` says what was wrong, and nothing is decided meanwhile.

A top-level ``"reviewer"`` names who decided; otherwise the authenticated user
a LangGraph server passes, otherwise ``"human"``.

The gate never calls a tool and writes no ``ToolMessage``: LangGraph re-runs the
whole node on resume, and everything the gate does before ``interrupt()`` is
idempotent (``Ledger.plan`` returns the existing row for the same tool call).

The gate node itself is in ``gate``, the interrupt value and the resume value's
shape in ``payload``, the reading of an answer in ``decisions``.
"""

from __future__ import annotations

from langgraph_cancel.nodes.approval.gate import APPROVAL_SOURCE, ApprovalGate
from langgraph_cancel.nodes.approval.payload import (
    ALLOWED_DECISIONS,
    DEFAULT_DESCRIPTION_PREFIX,
    ApprovalActionRequest,
    ApprovalError,
    ApprovalRequest,
    ApprovalResponse,
    ApprovalReviewConfig,
    ApproveDecision,
    EditDecision,
    EditedAction,
    RejectDecision,
    RespondDecision,
)

__all__ = [
    "ALLOWED_DECISIONS",
    "APPROVAL_SOURCE",
    "DEFAULT_DESCRIPTION_PREFIX",
    "ApprovalActionRequest",
    "ApprovalError",
    "ApprovalGate",
    "ApprovalRequest",
    "ApprovalResponse",
    "ApprovalReviewConfig",
    "ApproveDecision",
    "EditDecision",
    "EditedAction",
    "RejectDecision",
    "RespondDecision",
]

"""Graph nodes: effect-classified tool execution, approval, cancel and reconciliation."""

from langgraph_cancel.nodes.approval import ApprovalGate
from langgraph_cancel.nodes.tool_node import EffectToolNode

__all__ = ["ApprovalGate", "EffectToolNode"]

"""Graph nodes: effect-classified tool execution, approval, cancel and reconciliation."""

from langgraph_cancel.nodes.tool_node import EffectToolNode

__all__ = ["EffectToolNode"]

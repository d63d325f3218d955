"""The agent the server section serves with ``langgraph dev``: plain ``ToolNode`` and ours.

Loaded by the server from its file path, so it imports nothing from ``benchmarks``.
The model reads how many calls to make, and how long each takes, from the user's
message (``"calls=10 ms=5"``): one AI message with that many ``work`` calls, then
a final answer. ``work`` is side-effecting (irreversible, no approval) in our graph.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langgraph_cancel import EffectKind, EffectToolNode, add_cancellation, effect
from langgraph_cancel.testing import ScriptedChatModel, tool_call

_ASK = re.compile(r"calls=(\d+)(?:\s+ms=(\d+(?:\.\d+)?))?")


def _work() -> Any:
    @tool
    def work(i: int, ms: float) -> str:
        """Do one unit of work taking ``ms`` milliseconds."""
        time.sleep(ms / 1000.0)
        return f"ok {i}"

    return work


def _turn(messages: list[BaseMessage]) -> AIMessage:
    if messages and isinstance(messages[-1], ToolMessage):
        return AIMessage("done")
    found = _ASK.search(str(messages[-1].content)) if messages else None
    calls = int(found.group(1)) if found else 1
    ms = float(found.group(2)) if found and found.group(2) else 5.0
    tag = uuid.uuid4().hex[:10]
    return AIMessage(
        "",
        tool_calls=[tool_call("work", {"i": i, "ms": ms}, id=f"c{tag}_{i}") for i in range(calls)],
    )


def _builder(node: Any) -> Any:
    model = ScriptedChatModel([_turn], on_exhausted="repeat_last")

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder: Any = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder


plain_graph = _builder(ToolNode([_work()])).compile()
effect_graph = add_cancellation(
    _builder(EffectToolNode([effect(EffectKind.IRREVERSIBLE, requires_approval=False)(_work())]))
).compile()

"""The seed scenario with a sub-agent: the parent hands the refund to a refunds agent.

A support agent (the parent) delegates the refund of o-88 to a refunds agent
running on a thread of its own (``<thread>-refunds``), registered under the
parent's run with :func:`~langgraph_cancel.subagents.child_config`; when the
sub-agent is done, the parent writes its wrap-up::

    parent:  START -> delegate_refund -> wrap_up -> END
    child:   the refund agent of :mod:`langgraph_cancel.demo.graph`, playing
             :func:`child_script` (look up o-88, refund 40.00, email Dana)

Stop is pressed on the **parent's** thread while the child's refund is in
flight. The stop cascades to the child: it waits for the refund (it left the
process: its outcome is awaited), drops the email queued behind it and stops;
the parent then stops before its wrap-up. The parent's report lists the
child's refund as permanent, marked with the child's run and thread.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph

from langgraph_cancel.demo.graph import CUSTOMER_EMAIL
from langgraph_cancel.graph import add_cancellation
from langgraph_cancel.subagents import child_config
from langgraph_cancel.testing import tool_call, tool_calls_turn

#: The sub-agent's thread is the parent's with this suffix.
CHILD_SUFFIX = "-refunds"

#: What the parent asks the refunds agent.
CHILD_REQUEST = "Refund the damaged item of order o-88 (40 USD) and tell Dana."


def child_thread(thread_id: str) -> str:
    """The refunds agent's thread for a parent thread."""
    return f"{thread_id}{CHILD_SUFFIX}"


def child_script(refund_amount: float = 40.0) -> list[AIMessage]:
    """The refunds agent's two turns: look up, refund, email Dana; then its answer."""
    amount = f"{refund_amount:.2f}"
    return [
        tool_calls_turn(
            tool_call("lookup_order", {"order_id": "o-88"}),
            tool_call("issue_refund", {"order_id": "o-88", "amount": refund_amount}),
            tool_call(
                "send_email",
                {
                    "to": CUSTOMER_EMAIL,
                    "subject": "Your refund for order o-88",
                    "body": f"Hi Dana, we refunded {amount} USD for the damaged item in o-88.",
                },
            ),
            content="Checking o-88, then the refund and a note to Dana.",
        ),
        AIMessage(content=f"Refunded {amount} USD on o-88 and emailed Dana."),
    ]


def build_parent_builder(child: Any) -> StateGraph[Any, Any, Any, Any]:
    """The support agent that delegates the refund, wrapped by ``add_cancellation``.

    Args:
        child: The refunds agent, compiled with the same checkpointer (its ledger
            is the parent's).

    Returns:
        The builder; ``compile(checkpointer=...)`` it.
    """

    def delegate_refund(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        thread_id = config["configurable"]["thread_id"]
        config_of_child = child_config(config, child_thread(thread_id))
        out = child.invoke({"messages": [HumanMessage(CHILD_REQUEST)]}, config_of_child)
        return {"messages": [AIMessage(f"Refunds agent: {out['messages'][-1].text}")]}

    def wrap_up(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("Done: the refunds agent handled o-88.")]}

    builder = StateGraph(MessagesState)
    builder.add_node("delegate_refund", delegate_refund)
    builder.add_node("wrap_up", wrap_up)
    builder.add_edge(START, "delegate_refund")
    builder.add_edge("delegate_refund", "wrap_up")
    builder.add_edge("wrap_up", END)
    return add_cancellation(builder)


__all__ = [
    "CHILD_REQUEST",
    "CHILD_SUFFIX",
    "build_parent_builder",
    "child_script",
    "child_thread",
]

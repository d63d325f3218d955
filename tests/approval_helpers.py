"""Helpers shared by the ApprovalGate tests (``test_approval_*.py``).

Every test builds a real compiled graph, as a user would:

    START -> reconcile -> agent (ScriptedChatModel) -> tools_condition -> approval
          -> tools (EffectToolNode) -> agent ...

wrapped by ``add_cancellation`` and compiled with the cancel-aware saver of the
backend under test (``db_url``: memory, SQLite, PostgreSQL). The tools append
every execution to a list, so the tests can prove that nothing is dispatched
before a decision, and nothing twice across interrupts and resumes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from langgraph_cancel import (
    ApprovalGate,
    EffectKind,
    EffectToolNode,
    add_cancellation,
    effect,
    idempotency_key,
)
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.testing import tool_call

REFUND_PERMANENCE = "Money leaves the shop's account; a refund cannot be recalled."


# ------------------------------------------------------------------ fixtures
@contextmanager
def open_saver(db_url: str) -> Iterator[Any]:
    """The cancel-aware saver for a backend URL, set up."""
    if db_url == "memory://":
        saver = MemoryCancelSaver()
        saver.setup()
        yield saver
    elif db_url.startswith("sqlite:///"):
        with SqliteCancelSaver.from_conn_string(db_url[len("sqlite:///") :]) as sqlite_saver:
            sqlite_saver.setup()
            yield sqlite_saver
    else:
        with PostgresCancelSaver.from_conn_string(db_url) as pg_saver:
            pg_saver.setup()
            yield pg_saver


@dataclass
class World:
    """The external systems: every tool execution lands here."""

    executions: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    gate_passes: int = 0

    def count(self, tool_name: str | None = None) -> int:
        return sum(1 for name, _, _ in self.executions if tool_name in (None, name))

    def tools(self) -> list[BaseTool]:
        world = self

        @effect(
            EffectKind.IRREVERSIBLE,
            idempotency_key=lambda a: f"refund:{a['order_id']}",
            requires_approval=lambda a: float(a["amount"]) > 100,
            permanence=REFUND_PERMANENCE,
        )
        @tool
        def issue_refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            world.executions.append(
                ("issue_refund", {"order_id": order_id, "amount": amount}, idempotency_key())
            )
            return f"refunded {amount:.2f} on {order_id}"

        @effect(EffectKind.IRREVERSIBLE)
        @tool
        def send_email(to: str, body: str) -> str:
            """Send an email."""
            world.executions.append(("send_email", {"to": to, "body": body}, idempotency_key()))
            return f"sent to {to}"

        @effect(EffectKind.READ_ONLY)
        @tool
        def lookup_order(order_id: str) -> str:
            """Look an order up."""
            world.executions.append(("lookup_order", {"order_id": order_id}, "-"))
            return f"order {order_id}: 2 items"

        @effect(EffectKind.READ_ONLY, requires_approval=True)
        @tool
        def read_card(order_id: str) -> str:
            """Read the card an order was paid with (a reviewer must allow it)."""
            world.executions.append(("read_card", {"order_id": order_id}, "-"))
            return f"order {order_id}: card ending 4242"

        return [issue_refund, send_email, lookup_order, read_card]


def build_graph(
    world: World, model: Runnable[Any, BaseMessage], saver: Any, *, with_gate: bool = True
) -> Any:
    """agent -> tools_condition -> approval -> tools -> agent, with add_cancellation."""
    tools = world.tools()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectToolNode(tools))
    builder.add_edge(START, "agent")
    if with_gate:
        gate = ApprovalGate(tools)
        prepare = gate._prepare

        def counting_prepare(*args: Any) -> Any:
            world.gate_passes += 1
            return prepare(*args)

        setattr(gate, "_prepare", counting_prepare)  # noqa: B010 - count the passes
        builder.add_node("approval", gate)
        builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
        builder.add_edge("approval", "tools")
    else:
        builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return add_cancellation(builder).compile(checkpointer=saver)


def cfg(thread_id: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, **extra}}


def interrupt_value(out: dict[str, Any]) -> dict[str, Any]:
    interrupts: tuple[Any, ...] | list[Any] = out.get("__interrupt__") or ()
    assert len(interrupts) == 1, f"expected one interrupt, got {interrupts!r}"
    value: dict[str, Any] = interrupts[0].value
    return value


def statuses(ledger: Ledger, thread_id: str) -> dict[str, str]:
    return {e.tool_call_id: e.status.value for e in ledger.effects(thread_id)}


def tool_messages(messages: list[BaseMessage]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


def assert_every_call_answered_once(messages: list[BaseMessage]) -> None:
    calls = [str(c["id"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    answers = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    assert sorted(calls) == sorted(answers), (calls, answers)


BIG_REFUND = tool_call("issue_refund", {"order_id": "o-1", "amount": 150.0}, id="c-refund")
EMAIL = tool_call("send_email", {"to": "dana@example.com", "body": "refunded"}, id="c-email")
SMALL_REFUND = tool_call("issue_refund", {"order_id": "o-2", "amount": 20.0}, id="c-small")
LOOKUP = tool_call("lookup_order", {"order_id": "o-1"}, id="c-lookup")
CARD = tool_call("read_card", {"order_id": "o-1"}, id="c-card")

"""The seed scenario as a real LangGraph agent: a refund agent that is safe to stop.

The graph is an ordinary tool-calling agent built from the package's public
names::

    START -> reconcile -> agent -> (tools_condition) -> approval -> tools -> agent ...
                                \\-> END

* ``agent``: the model. By default a :class:`ScriptedChatModel` that plays the
  seed's script (no API key needed); a real ``ChatOpenAI`` when
  ``OPENAI_API_KEY`` is set (model from ``OPENAI_MODEL``, default ``gpt-4o-mini``).
* ``approval``: :class:`~langgraph_cancel.ApprovalGate`, which interrupts before
  calls that need a human (refunds over 100, chat posts).
* ``tools``: :class:`~langgraph_cancel.EffectToolNode` over the classified tools
  of :mod:`langgraph_cancel.demo.tools`.
* ``add_cancellation(builder, ledger=...)`` adds the step-boundary checks, the
  ``reconcile`` entry node and the ``cancel`` node.

The seed script (:func:`seed_script`) is three model turns:

1. look up order o-88, refund 40.00 (under the approval threshold), email the
   customer, email finance;
2. mark o-88 ``refunded`` (the demo makes this request hang, so it is in flight
   when stop is pressed), then four more calls the cancel must drop:
   open a warehouse ticket, email the customer again, put o-91 on hold and
   refund o-91's shipping;
3. a final answer.

Two ways to use it:

* library / CLI: ``build_builder().compile(checkpointer=SqliteCancelSaver(...))``
  (``langgraph-cancel demo`` does exactly that);
* ``langgraph dev`` / Studio: the module-level :data:`graph`, compiled without a
  checkpointer (the server supplies its own and refuses graphs that bring
  one). Its ledger is ``$LANGGRAPH_CANCEL_DB``, else the command line's
  default file ``.langgraph-cancel.db`` (:func:`served_ledger_url`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from langgraph_cancel import ApprovalGate, EffectToolNode, Ledger, add_cancellation
from langgraph_cancel.demo.tools import TOOLS
from langgraph_cancel.limits import Limits
from langgraph_cancel.nodes.model import CancellableModelNode
from langgraph_cancel.testing import ScriptedChatModel, tool_call, tool_calls_turn

#: What the customer asked for: the first message of a seed run.
SEED_REQUEST = (
    "Order o-88 (Dana Whitfield) arrived with a damaged item worth 40 USD. Refund the "
    "item, let Dana and finance know, mark the order refunded and tidy up the follow-ups."
)

SYSTEM_PROMPT = (
    "You are a customer-support agent for an online shop. Use the tools to look up "
    "orders, issue refunds, update orders, open tickets and send emails. Refunds and "
    "emails are permanent; refunds over 100 USD need a human's approval. Do the reads "
    "first, then the reversible changes, and the irreversible actions last. Finish "
    "with a short summary of what you did."
)

FINANCE_EMAIL = "finance@example.com"
CUSTOMER_EMAIL = "dana@example.com"

#: The four calls of turn 2 that a stop pressed during ``update_order(o-88)`` drops.
QUEUED_CALLS: tuple[str, ...] = ("create_ticket", "send_email", "update_order", "issue_refund")


def _first_turn(refund_amount: float, amount: str, *, follow_up: bool) -> AIMessage:
    """Turn 1: look the order up, refund it, email Dana and finance (and schedule a
    follow-up email to Dana when asked)."""
    follow_up_call = tool_call(
        "schedule_email",
        {
            "to": CUSTOMER_EMAIL,
            "subject": "How did we do with order o-88?",
            "body": "Hi Dana, could you rate the help you got with o-88?",
        },
    )
    return tool_calls_turn(
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
        tool_call(
            "send_email",
            {
                "to": FINANCE_EMAIL,
                "subject": f"Refund issued: o-88, {amount} USD",
                "body": f"Partial refund of {amount} USD on o-88 (damaged item).",
            },
        ),
        *([follow_up_call] if follow_up else []),
        content="I'll check the order, refund the damaged item and notify Dana and finance.",
    )


def _second_turn(amount: str) -> AIMessage:
    """Turn 2: mark o-88 refunded, then the four follow-ups a stop during it drops."""
    return tool_calls_turn(
        tool_call("update_order", {"order_id": "o-88", "status": "refunded"}),
        tool_call(
            "create_ticket",
            {
                "order_id": "o-88",
                "subject": "Damaged item in o-88",
                "body": f"Customer reported a damaged item; refunded {amount} USD. "
                "Please check the packaging of this batch.",
            },
        ),
        tool_call(
            "send_email",
            {
                "to": CUSTOMER_EMAIL,
                "subject": "Order o-88 updated",
                "body": "Your order o-88 is now marked refunded.",
            },
        ),
        tool_call(
            "update_order",
            {"order_id": "o-91", "status": "on_hold", "note": "check for the same batch"},
        ),
        tool_call("issue_refund", {"order_id": "o-91", "amount": 15.0}),
        content="Refund done. Now I'll update the order records and file the follow-ups.",
    )


def seed_script(refund_amount: float = 40.0, *, follow_up: bool = False) -> list[AIMessage]:
    """The model's three turns in the seed scenario.

    Args:
        refund_amount: The refund of turn 1. The seed's 40.00 is under the
            approval threshold (100); more makes the ``ApprovalGate`` stop the
            turn for a human decision.
        follow_up: Turn 1 also schedules a follow-up email to Dana
            (``schedule_email``: delivered five minutes later, revocable until then).

    Returns:
        Turn 1: ``lookup_order(o-88)``, ``issue_refund(o-88, 40.0)``, two
        ``send_email`` (customer, finance). Turn 2: ``update_order(o-88,
        status="refunded")`` then ``create_ticket``, ``send_email``,
        ``update_order(o-91)`` and ``issue_refund(o-91, 15.0)``. Turn 3: the
        final answer.
    """
    amount = f"{refund_amount:.2f}"
    return [
        _first_turn(refund_amount, amount, follow_up=follow_up),
        _second_turn(amount),
        AIMessage(
            content=f"Done: refunded {amount} USD on o-88, emailed Dana and finance, marked "
            "o-88 refunded, opened a warehouse ticket, put o-91 on hold and refunded its "
            "shipping."
        ),
    ]


def ordered_script(refund_amount: float = 120.0) -> list[AIMessage]:
    """The seed request planned irreversible-last: reads, drafts and holds, then the gate.

    Turn 1 does everything a stop may leave behind: it reads the order and the
    policy, puts o-88 on hold and drafts the warehouse ticket (both reversible:
    the cancel closes the ticket and restores the order). Turn 2 asks for the
    permanent calls only: the refund (over 100: the ``ApprovalGate`` stops the
    turn for a human) and the two emails. A stop at any moment before the
    approval leaves nothing permanent.
    """
    amount = f"{refund_amount:.2f}"
    return [
        tool_calls_turn(
            tool_call("lookup_order", {"order_id": "o-88"}),
            tool_call("search_policy", {"query": "damaged item refund"}),
            tool_call(
                "update_order",
                {"order_id": "o-88", "status": "on_hold", "note": "refund pending approval"},
            ),
            tool_call(
                "create_ticket",
                {
                    "order_id": "o-88",
                    "subject": "Damaged item in o-88",
                    "body": "Customer reported a damaged item; refund pending approval.",
                },
            ),
            content="First the reads and the drafts; the permanent steps come last.",
        ),
        tool_calls_turn(
            tool_call("issue_refund", {"order_id": "o-88", "amount": refund_amount}),
            tool_call(
                "send_email",
                {
                    "to": CUSTOMER_EMAIL,
                    "subject": "Your refund for order o-88",
                    "body": f"Hi Dana, we refunded {amount} USD for the damaged item in o-88.",
                },
            ),
            tool_call(
                "send_email",
                {
                    "to": FINANCE_EMAIL,
                    "subject": f"Refund issued: o-88, {amount} USD",
                    "body": f"Refund of {amount} USD on o-88 (damaged item).",
                },
            ),
            content="Everything is prepared; now the refund and the emails.",
        ),
        AIMessage(content=f"Done: refunded {amount} USD on o-88 and emailed Dana and finance."),
    ]


_AMOUNT = re.compile(r"(?:\$\s*(\d+(?:\.\d+)?))|(?:(\d+(?:\.\d+)?)\s*(?:USD|usd|dollars))")


def requested_amount(text: str, default: float = 40.0) -> float:
    """The refund amount a request names ("120 USD", "$120"), else ``default``."""
    found = _AMOUNT.search(text)
    if found is None:
        return default
    return float(found.group(1) or found.group(2))


def _turn_for(script: Sequence[AIMessage] | None) -> Any:
    """A stateless turn: the reply is chosen by the conversation, not by call count.

    The k-th model call since the last human message gets ``script[k]`` (the
    last entry once the script is used up). So the same model instance serves
    any number of threads, and a resumed thread (another process, after a
    crash) gets the turn it is at, not turn 1 again. Without a fixed script the
    seed script is played with the refund amount the human asked for (so in
    Studio "refund 120 USD" meets the approval gate).
    """

    def turn(messages: list[BaseMessage]) -> AIMessage:
        replies = 0
        request = ""
        for message in messages:
            if isinstance(message, HumanMessage):
                replies = 0
                request = message.text
            elif isinstance(message, AIMessage):
                replies += 1
        turns = script if script is not None else seed_script(requested_amount(request))
        return turns[min(replies, len(turns) - 1)]

    return turn


def scripted_model(
    script: Sequence[AIMessage] | None = None, *, delay_per_token: float = 0.0
) -> ScriptedChatModel:
    """The no-key model: plays ``script`` (default: the seed script) by conversation turn."""
    return ScriptedChatModel(
        [_turn_for(list(script) if script is not None else None)],
        on_exhausted="repeat_last",
        delay_per_token=delay_per_token,
    )


def default_model() -> BaseChatModel:
    """``ChatOpenAI`` when ``OPENAI_API_KEY`` is set, else the scripted seed model."""
    if os.environ.get("OPENAI_API_KEY"):
        from langchain_openai import ChatOpenAI

        settings: dict[str, Any] = {"model": os.environ.get("OPENAI_MODEL", "gpt-4o-mini")}
        return ChatOpenAI(**settings, temperature=0)
    return scripted_model()


def build_builder(
    model: BaseChatModel | None = None,
    *,
    ledger: Ledger | str | None = None,
    compensate_on_cancel: bool = False,
    cancel_timeout: float = 30.0,
    limits: Limits | None = None,
) -> StateGraph[Any, Any, Any, Any]:
    """The refund agent's graph builder, already wrapped by ``add_cancellation``.

    Args:
        model: The chat model (default :func:`default_model`).
        ledger: Where effects live when the graph is compiled without one of
            our savers (a ``Ledger`` or a URL); default: the checkpointer's
            ledger, else ``$LANGGRAPH_CANCEL_DB``, else ``.langgraph-cancel.db``.
        compensate_on_cancel: Undo committed reversible effects on cancel.
        cancel_timeout: Seconds the cancel node waits for in-flight calls.
        limits: The run's budget and deadline, if any.

    Returns:
        The builder; ``compile(checkpointer=...)`` it.
    """
    chat = model if model is not None else default_model()
    builder = StateGraph(MessagesState)
    builder.add_node("agent", CancellableModelNode(chat, tools=TOOLS, system_prompt=SYSTEM_PROMPT))
    builder.add_node("tools", EffectToolNode(TOOLS, handle_tool_errors=True))
    builder.add_node("approval", ApprovalGate(TOOLS))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
    builder.add_edge("approval", "tools")
    builder.add_edge("tools", "agent")
    return add_cancellation(
        builder,
        ledger=ledger,
        compensate_on_cancel=compensate_on_cancel,
        cancel_timeout=cancel_timeout,
        limits=limits,
    )


def seed_input() -> dict[str, Any]:
    """The input that starts a seed run: the customer's request."""
    return {"messages": [HumanMessage(SEED_REQUEST)]}


def served_ledger_url() -> str:
    """The served graph's ledger: ``$LANGGRAPH_CANCEL_DB``, else the command line's default.

    The command line's default file (``.langgraph-cancel.db`` in the server's
    working directory) is where ``langgraph-cancel status`` looks without ``--db``.
    """
    from langgraph_cancel.urls import DEFAULT_DB_URL, ENV_DB

    return os.environ.get(ENV_DB, "").strip() or DEFAULT_DB_URL


#: The graph ``langgraph dev`` serves (see ``langgraph.json``): no checkpointer of
#: its own (the server brings one), its ledger named by :func:`served_ledger_url`.
graph = build_builder(ledger=served_ledger_url()).compile(name="refund_agent")

__all__ = [
    "QUEUED_CALLS",
    "SEED_REQUEST",
    "SYSTEM_PROMPT",
    "build_builder",
    "default_model",
    "graph",
    "ordered_script",
    "requested_amount",
    "scripted_model",
    "seed_input",
    "seed_script",
    "served_ledger_url",
]

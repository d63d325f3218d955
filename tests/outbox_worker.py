"""The processes of the outbox's kill -9 tests: a graph that holds an email, and its tools.

``python tests/outbox_worker.py graph DB_URL THREAD MARKER`` runs an agent whose first
turn calls ``send_later`` (held for ``$LGC_TEST_HOLD_SECONDS``, the providers' file in
``$REFUND_AGENT_PROVIDERS_DB``); its second turn calls ``block``, which writes MARKER
(the held call's intent is on disk by then) and waits to be killed.

The outbox worker is the real command line, given ``TOOLS`` of this file:
``langgraph-cancel outbox --watch --graph tests/outbox_worker.py:TOOLS``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from langgraph_cancel import EffectKind, EffectToolNode, add_cancellation, effect, idempotency_key
from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.testing import tool_call

HOLD = timedelta(seconds=float(os.environ.get("LGC_TEST_HOLD_SECONDS", "1")))


@effect(EffectKind.IRREVERSIBLE, delay=HOLD, retry_safe=True, requires_approval=False)
@tool
def send_later(to: str, subject: str) -> str:
    """Email ``to`` once the delay window has passed (the outbox sends it)."""
    providers = Providers(os.environ["REFUND_AGENT_PROVIDERS_DB"])
    return json.dumps(providers.send_email(to, subject, "body", idempotency_key()))


@effect(EffectKind.READ_ONLY)
@tool
def block(marker: str) -> str:
    """Write ``marker`` and wait to be killed."""
    Path(marker).write_text("held")
    while True:
        time.sleep(1)


#: The tools the outbox worker needs.
TOOLS = [send_later, block]


def run_graph(db_url: str, thread_id: str, marker: str) -> None:
    """Run the agent until ``block`` waits to be killed."""
    turns = [
        AIMessage(
            "", tool_calls=[tool_call("send_later", {"to": "a@x.io", "subject": "s"}, id="c1")]
        ),
        AIMessage("", tool_calls=[tool_call("block", {"marker": marker}, id="c2")]),
    ]

    def agent(state: MessagesState) -> dict[str, list[AIMessage]]:
        replies = sum(isinstance(m, AIMessage) for m in state["messages"])
        return {"messages": [turns[min(replies, len(turns) - 1)]]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectToolNode(TOOLS))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    saver_type = PostgresCancelSaver if db_url.startswith("postgres") else SqliteCancelSaver
    with saver_type.from_conn_string(db_url) as saver:
        saver.setup()
        graph = add_cancellation(builder).compile(checkpointer=saver)
        graph.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": thread_id}})


if __name__ == "__main__":
    if sys.argv[1] != "graph":
        raise SystemExit(f"unknown job {sys.argv[1]!r}")
    run_graph(sys.argv[2], sys.argv[3], sys.argv[4])

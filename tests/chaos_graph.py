"""Chaos graph: the compiled graph a plan runs on, and the saver under it.

A scripted model plays the plan's turns (and refuses a history with unanswered
tool calls); :func:`build_graph` wires agent -> approval -> tools -> agent with
``ApprovalGate`` and ``EffectToolNode`` and makes it cancellable
(``add_cancellation``); :func:`open_saver` opens the cancel-aware saver of a
backend (memory, SQLite, PostgreSQL on one connection or on a pool) on a fresh
database, and :func:`db_url_of` names the database another process would open.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from chaos_plans import CANCEL_TIMEOUT, call_args
from chaos_world import World
from langgraph_cancel import ApprovalGate, EffectToolNode, add_cancellation
from langgraph_cancel.testing import ScriptedChatModel, tool_call


def dangling_calls(messages: list[BaseMessage]) -> list[str]:
    """Ids of tool calls that no ToolMessage answers."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    return [
        call_id
        for m in messages
        if isinstance(m, AIMessage)
        for call_id in (c.get("id") for c in m.tool_calls)
        if call_id and call_id not in answered
    ]


def scripted_model(world: World) -> ScriptedChatModel:
    """Turn ``k`` of the current plan when the history holds ``turn_base + k`` AI
    messages; refuses dangling calls (I5)."""

    def pick(messages: list[BaseMessage]) -> AIMessage:
        missing = dangling_calls(messages)
        if missing:
            raise ValueError(f"I5: the model was sent unanswered tool calls {missing}")
        turns = world.plan.numbered(world.call_base)
        turn = sum(isinstance(m, AIMessage) for m in messages) - world.turn_base
        world.turn_event(turn)
        if turn < len(turns):
            return AIMessage(
                "",
                tool_calls=[
                    tool_call(spec.tool, call_args(spec, n), id=f"c{n}") for n, spec in turns[turn]
                ],
            )
        return AIMessage("done")

    return ScriptedChatModel(
        [pick], on_exhausted="repeat_last", report_usage=world.plan.report_usage
    )


def build_graph(world: World, model: ScriptedChatModel, saver: Any) -> Any:
    """agent -> approval -> tools -> agent, made cancellable, on ``saver``."""
    plan = world.plan
    tools = world.tools()
    node = EffectToolNode(
        tools,
        effect_concurrency=plan.effect_concurrency,
        cancel_timeout=CANCEL_TIMEOUT,
        # Provider faults reach the model as error messages, and the run goes on.
        handle_tool_errors=True,
    )
    builder = StateGraph(MessagesState)
    if plan.use_async:

        async def agent_async(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        builder.add_node("agent", agent_async)
    else:

        def agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [model.invoke(state["messages"])]}

        builder.add_node("agent", agent)
    builder.add_node("approval", ApprovalGate(node))
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
    builder.add_edge("approval", "tools")
    builder.add_edge("tools", "agent")
    return add_cancellation(
        builder,
        compensate_on_cancel=plan.compensate_on_cancel,
        cancel_timeout=CANCEL_TIMEOUT,
        reconcile_interactive=plan.reconcile_interactive,
        limits=plan.limits,
    ).compile(checkpointer=saver)


@contextmanager
def open_saver(backend: str, root: Path, pg_url: str | None = None) -> Iterator[Any]:
    """The cancel-aware saver of a backend (a fresh database), set up."""
    if backend == "memory":
        from langgraph_cancel.checkpointers.memory import MemoryCancelSaver

        saver: Any = MemoryCancelSaver()
        saver.setup()
        yield saver
    elif backend == "sqlite":
        from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver

        with SqliteCancelSaver.from_conn_string(str(root / "ledger.db")) as sqlite_saver:
            sqlite_saver.setup()
            yield sqlite_saver
    elif backend == "postgres":
        from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

        assert pg_url is not None
        with PostgresCancelSaver.from_conn_string(pg_url) as pg_saver:
            pg_saver.setup()
            yield pg_saver
    elif backend == "postgres-pool":
        # Checkpoints and ledger on one pool that checks each connection before
        # handing it out, so a restarted server is reconnected to transparently.
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

        assert pg_url is not None
        with ConnectionPool(
            pg_url,
            min_size=1,
            max_size=6,
            kwargs={"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0},
            check=ConnectionPool.check_connection,
            name="chaos-pool",
        ) as pool:
            pool_saver = PostgresCancelSaver(pool)
            pool_saver.setup()
            yield pool_saver
    else:  # pragma: no cover
        raise ValueError(backend)


def db_url_of(backend: str, root: Path, pg_url: str | None = None) -> str | None:
    """The URL another process would open (None for memory)."""
    if backend == "sqlite":
        return "sqlite:///" + str((root / "ledger.db").resolve())
    if backend.startswith("postgres"):
        return pg_url
    return None

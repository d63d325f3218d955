"""The agent graph measured everywhere: a scripted model emitting one AIMessage with N
tool calls, then a final answer; plain ``ToolNode`` or ``EffectToolNode`` (with
``add_cancellation``) on the matching saver."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from benchmarks.common import Settings, fresh_pg_db, is_postgres
from langgraph_cancel import EffectKind, EffectToolNode, add_cancellation, effect
from langgraph_cancel.testing import ScriptedChatModel, tool_call

READ_ONLY = "read_only"
SIDE_EFFECT = "side_effecting"


def make_tool(kind: str, sleep_ms: float) -> BaseTool:
    """The ``work`` tool: sleeps ``sleep_ms`` (time.sleep) and answers; classified by ``kind``."""
    delay = sleep_ms / 1000.0

    @tool
    def work(i: int) -> str:
        """Do one unit of work."""
        if delay:
            time.sleep(delay)
        return f"ok {i}"

    if kind == READ_ONLY:
        return effect(EffectKind.READ_ONLY)(work)
    # Irreversible without an approval step: the most expensive path a call can take
    # without a human in the loop (intent row written before dispatch, outcome after).
    return effect(EffectKind.IRREVERSIBLE, requires_approval=False)(work)


def scripted_model(n_calls: int) -> ScriptedChatModel:
    """One AIMessage with ``n_calls`` tool calls, then a final answer, for every thread."""

    def turn(messages: list[BaseMessage]) -> AIMessage:
        if messages and isinstance(messages[-1], ToolMessage):
            return AIMessage("done")
        tag = uuid.uuid4().hex[:10]
        return AIMessage(
            "", tool_calls=[tool_call("work", {"i": i}, id=f"c{tag}_{i}") for i in range(n_calls)]
        )

    return ScriptedChatModel([turn], on_exhausted="repeat_last")


def build_graph(
    tools: list[BaseTool],
    model: ScriptedChatModel,
    checkpointer: Any,
    *,
    effectful: bool,
    effect_concurrency: int = 1,
    cancellation: bool = True,
    wrap_tool_call: Any = None,
) -> Any:
    """agent -> (tools -> agent)* ; ``effectful`` swaps in EffectToolNode + add_cancellation;
    ``wrap_tool_call`` goes to a plain ``ToolNode``."""

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder: Any = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    node = (
        EffectToolNode(tools, effect_concurrency=effect_concurrency)
        if effectful
        else ToolNode(tools, wrap_tool_call=wrap_tool_call)
    )
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    if effectful and cancellation:
        builder = add_cancellation(builder)
    return builder.compile(checkpointer=checkpointer)


def run_once(graph: Any, expect_messages: int | None = None) -> tuple[float, float]:
    """Invoke on a fresh thread; (wall seconds, process CPU seconds, all threads)."""
    cfg = {"configurable": {"thread_id": uuid.uuid4().hex}}
    c0 = time.process_time()
    t0 = time.perf_counter()
    out = graph.invoke({"messages": [HumanMessage("go")]}, cfg)
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    _check_messages(out, expect_messages)
    return dt, cpu


async def arun_once(graph: Any, expect_messages: int | None = None) -> tuple[float, float]:
    """``run_once`` through ``ainvoke``, as a LangGraph server runs graphs."""
    cfg = {"configurable": {"thread_id": uuid.uuid4().hex}}
    c0 = time.process_time()
    t0 = time.perf_counter()
    out = await graph.ainvoke({"messages": [HumanMessage("go")]}, cfg)
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    _check_messages(out, expect_messages)
    return dt, cpu


def _check_messages(out: dict[str, Any], expect: int | None) -> None:
    """A run that produced another number of messages measured something else."""
    if expect is not None and len(out["messages"]) != expect:
        raise RuntimeError(f"graph produced {len(out['messages'])} messages, expected {expect}")


@contextlib.asynccontextmanager
async def async_savers(backend: str, settings: Settings) -> AsyncIterator[tuple[Any, Any]]:
    """``savers`` for ``ainvoke``: LangGraph's async savers where the sync ones have none."""
    if backend == "memory":
        with savers(backend, settings) as pair:
            yield pair
    elif backend == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        from langgraph_cancel.checkpointers.sqlite import AsyncSqliteCancelSaver

        directory = tempfile.mkdtemp(prefix="overhead-async-", dir=settings.workdir)
        async with (
            AsyncSqliteSaver.from_conn_string(os.path.join(directory, "base.db")) as base,
            AsyncSqliteCancelSaver.from_conn_string(os.path.join(directory, "cancel.db")) as ours,
        ):
            await base.setup()
            await ours.setup()
            yield base, ours
    elif is_postgres(backend):
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        from langgraph_cancel.checkpointers.postgres import AsyncPostgresCancelSaver

        assert settings.pg_dsn
        sync_commit = backend == "postgres"
        with (
            fresh_pg_db(settings.pg_dsn, "abase", synchronous_commit=sync_commit) as u1,
            fresh_pg_db(settings.pg_dsn, "aours", synchronous_commit=sync_commit) as u2,
        ):
            async with (
                AsyncPostgresSaver.from_conn_string(u1) as base,
                AsyncPostgresCancelSaver.from_conn_string(u2) as ours,
            ):
                await base.setup()
                await ours.setup()
                yield base, ours
    else:  # pragma: no cover
        raise ValueError(backend)


@contextlib.contextmanager
def _sqlite_cancel_saver(directory: str) -> Iterator[Any]:
    """Our SQLite saver on ``<directory>/cancel.db``, set up, closed afterwards."""
    from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver

    conn = sqlite3.connect(os.path.join(directory, "cancel.db"), check_same_thread=False)
    ours = SqliteCancelSaver(conn)
    ours.setup()
    try:
        yield ours
    finally:
        ours.ledger.close()
        conn.close()


@contextlib.contextmanager
def savers(backend: str, settings: Settings) -> Iterator[tuple[Any, Any]]:
    """(plain LangGraph saver, our cancel-aware saver), each on its own fresh database."""
    if backend == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        from langgraph_cancel.checkpointers.memory import MemoryCancelSaver

        cancel_saver = MemoryCancelSaver()
        cancel_saver.setup()
        yield InMemorySaver(), cancel_saver
    elif backend == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        directory = tempfile.mkdtemp(prefix="overhead-", dir=settings.workdir)
        c1 = sqlite3.connect(os.path.join(directory, "base.db"), check_same_thread=False)
        base: Any = SqliteSaver(c1)
        base.setup()
        try:
            with _sqlite_cancel_saver(directory) as ours:
                yield base, ours
        finally:
            c1.close()
    elif is_postgres(backend):
        from langgraph.checkpoint.postgres import PostgresSaver

        from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

        assert settings.pg_dsn
        sync_commit = backend == "postgres"
        with (
            fresh_pg_db(settings.pg_dsn, "base", synchronous_commit=sync_commit) as u1,
            fresh_pg_db(settings.pg_dsn, "ours", synchronous_commit=sync_commit) as u2,
            PostgresSaver.from_conn_string(u1) as base,
            PostgresCancelSaver.from_conn_string(u2) as ours,
        ):
            base.setup()
            ours.setup()
            yield base, ours
    else:  # pragma: no cover
        raise ValueError(backend)

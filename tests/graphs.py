"""Shared builders for the graph-level tests: savers, agents, counting tools, workers.

Everything here is real: real compiled LangGraph graphs, real savers on real
databases, a real LangChain chat model (``ScriptedChatModel``) and tools whose
every execution is written to a SQLite file (the providers' truth), so a count
survives a ``kill -9`` of the process that ran the tool.

Pieces:

``open_saver(db_url)``
    The cancel-aware saver for ``memory://``, ``sqlite:///...`` or
    ``postgresql://...``, set up, closed on exit.
``backend_params()`` / ``module_database(request)``
    Module-scoped ``db_url`` fixtures: one database per backend per test module.
``ExecutionLog(path)`` / ``counting_tool(log, name, kind, ...)``
    The providers' truth and the tools that write it (``execution_log.py``,
    re-exported here).
``scripted(*turns)``
    A model that plays turn *n* when the history holds *n* AI messages, and,
    like a real provider, refuses a history with unanswered tool calls.
``agent_builder(model, tool_node)`` / ``send_agent_builder(model, tool_node)``
    model -> ``tools_condition`` -> tools -> model, or the same with one
    ``Send`` per tool call (``ToolCallWithContext`` payloads).
``python tests/graphs.py worker ...``
    A worker process for the kill -9 and cross-process cancel tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Send

from execution_log import ExecutionLog, counting_tool
from langgraph_cancel import EffectKind, EffectToolNode, add_cancellation
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.progress import EVENT_KEY, ProgressEvent
from langgraph_cancel.testing import ScriptedChatModel, tool_call

WORKER_ID_KEY = "langgraph_cancel_worker"
REPO = Path(__file__).resolve().parent.parent

__all__ = [
    "ExecutionLog",
    "agent_builder",
    "backend_params",
    "calls",
    "cancellable",
    "collect_custom",
    "config_for",
    "counting_tool",
    "dangling_calls",
    "kill_graph",
    "module_database",
    "new_thread",
    "open_saver",
    "progress_events",
    "scripted",
    "send_agent_builder",
    "slow_graph",
    "tool_call",
    "wait_until",
    "worker_command",
    "worker_env",
]


# ----------------------------------------------------------------------------- small things


def new_thread() -> str:
    """A thread id no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


def config_for(thread_id: str, *, worker: str | None = None) -> RunnableConfig:
    """The invocation config of a thread (optionally with a fixed worker identity)."""
    conf: dict[str, Any] = {"thread_id": thread_id}
    if worker is not None:
        conf[WORKER_ID_KEY] = worker
    return {"configurable": conf}


def wait_until(
    predicate: Callable[[], Any], *, timeout: float = 30.0, what: str = "condition"
) -> Any:
    """Poll ``predicate`` every 10 ms until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.01)


def dangling_calls(messages: Sequence[BaseMessage]) -> list[str]:
    """Ids of tool calls in ``messages`` that no ToolMessage answers."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    return [
        call_id
        for m in messages
        if isinstance(m, AIMessage)
        for call_id in (c.get("id") for c in m.tool_calls)
        if call_id and call_id not in answered
    ]


def answered_late(messages: Sequence[BaseMessage]) -> list[str]:
    """Ids of tool calls whose answer does not come right after them (chat APIs want
    an AI message's calls answered before any other message)."""
    late: list[str] = []
    waiting: list[str] = []
    for message in messages:
        if isinstance(message, ToolMessage):
            if message.tool_call_id in waiting:
                waiting.remove(message.tool_call_id)
            continue
        late.extend(waiting)
        waiting = [str(call.get("id")) for call in getattr(message, "tool_calls", None) or []]
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    return [call_id for call_id in late if call_id in answered]


# ----------------------------------------------------------------------------- savers


@contextmanager
def open_saver(db_url: str) -> Iterator[Any]:
    """The cancel-aware saver for a database URL, set up, closed on exit."""
    if db_url.startswith("memory://"):
        saver: Any = MemoryCancelSaver()
        saver.setup()
        yield saver
    elif db_url.startswith("sqlite:///"):
        with SqliteCancelSaver.from_conn_string(db_url) as saver:
            saver.setup()
            yield saver
    elif db_url.startswith(("postgresql://", "postgres://")):
        with PostgresCancelSaver.from_conn_string(db_url) as saver:
            saver.setup()
            yield saver
    else:  # pragma: no cover - conftest only hands out these three
        raise ValueError(f"unsupported test database URL {db_url!r}")


def backend_params(*, durable_only: bool = False) -> list[Any]:
    """``pytest.param`` per selected backend (``LGC_BACKENDS``), postgres marked."""
    import pytest

    from conftest import selected_backends

    return [
        pytest.param(b, id=b, marks=[pytest.mark.postgres] if b == "postgres" else [])
        for b in selected_backends()
        if not (durable_only and b == "memory")
    ]


@contextmanager
def module_database(request: Any) -> Iterator[str]:
    """A database for a whole test module (``request.param`` names the backend).

    Tests share it safely: each uses threads of its own (but keys from a tool's
    ``idempotency_key`` function are unique across the ledger: vary their
    arguments between tests). One PostgreSQL database
    per module instead of one per test keeps the files fast; it is dropped
    (``WITH (FORCE)``) at the end like ``pg_url``'s.
    """
    backend = request.param
    if backend == "memory":
        yield "memory://"
        return
    if backend == "sqlite":
        folder = request.getfixturevalue("tmp_path_factory").mktemp("db")
        yield "sqlite:///" + str((folder / "ledger.db").resolve())
        return
    from conftest import fresh_database

    with fresh_database(request.getfixturevalue("pg_dsn")) as url:
        yield url


# ----------------------------------------------------------------------------- the model


def scripted(*turns: AIMessage | str, strict: bool = True, **kwargs: Any) -> ScriptedChatModel:
    """A model that answers with ``turns[n]`` when the history holds ``n`` AI messages.

    Indexing by the history (not by call count) makes the script survive a
    crash: a fresh process resuming the thread picks up at the right turn.
    With ``strict`` (default) it refuses, like a real provider does, a
    history with a tool call no ToolMessage answers. Past the end it says "done".
    """

    def pick(messages: list[BaseMessage]) -> AIMessage | str:
        if strict:
            missing = dangling_calls(messages) or answered_late(messages)
            if missing:
                raise ValueError(
                    "An assistant message with 'tool_calls' must be followed by tool messages "
                    f"responding to each 'tool_call_id'; missing: {missing}"
                )
        turn = sum(isinstance(m, AIMessage) for m in messages)
        return turns[turn] if turn < len(turns) else AIMessage("done")

    return ScriptedChatModel([pick], on_exhausted="repeat_last", **kwargs)


def calls(*specs: tuple[str, str] | tuple[str, str, str] | dict[str, Any]) -> AIMessage:
    """An AI turn calling ``(tool, item[, id])`` each; dicts are used as raw tool calls."""
    out: list[Any] = []
    for spec in specs:
        if isinstance(spec, dict):
            out.append(spec)
            continue
        name, item, *rest = spec
        out.append(tool_call(name, {"item": item}, id=rest[0] if rest else None))
    return AIMessage("", tool_calls=out)


# ----------------------------------------------------------------------------- agents


def _model_node(model: Any, *, use_async: bool) -> Callable[..., Any]:
    if use_async:

        async def agent_async(state: MessagesState) -> dict[str, list[AnyMessage]]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        return agent_async

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    return agent


def agent_builder(
    model: Any, tool_node: Any, *, use_async: bool = False, **node_kwargs: Any
) -> StateGraph[Any, Any, Any, Any]:
    """The standard agent: model -> ``tools_condition`` -> tools -> model."""
    builder = StateGraph(MessagesState)
    builder.add_node("agent", _model_node(model, use_async=use_async))
    builder.add_node("tools", tool_node, **node_kwargs)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder


def send_route(state: MessagesState) -> Any:
    """One ``Send`` per tool call of the last AI message (``ToolCallWithContext`` payloads)."""
    last = state["messages"][-1]
    if not isinstance(last, AIMessage) or not last.tool_calls:
        return END
    return [
        Send("tools", {"__type": "tool_call_with_context", "tool_call": tc, "state": state})
        for tc in last.tool_calls
    ]


def send_agent_builder(
    model: Any,
    tool_node: Any,
    *,
    use_async: bool = False,
    agent: Callable[..., Any] | None = None,
) -> StateGraph[Any, Any, Any, Any]:
    """The agent with one ``Send`` task per tool call instead of one batch."""
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent or _model_node(model, use_async=use_async))
    builder.add_node("tools", tool_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", send_route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


def collect_custom(graph: Any, inp: Any, cfg: Any, *, use_async: bool) -> list[Any]:
    """Run to the end streaming ``custom`` events; return them."""
    if use_async:

        async def go() -> list[Any]:
            return [c async for c in graph.astream(inp, cfg, stream_mode="custom")]

        return asyncio.run(go())
    return list(graph.stream(inp, cfg, stream_mode="custom"))


def progress_events(events: list[Any]) -> list[ProgressEvent]:
    """The stop's progress events among streamed ``custom`` chunks, as a client reads them."""
    return [
        ProgressEvent.model_validate(e[EVENT_KEY])
        for e in events
        if isinstance(e, dict) and EVENT_KEY in e
    ]


def cancellable(builder: StateGraph[Any, Any, Any, Any], saver: Any, **kwargs: Any) -> Any:
    """``add_cancellation(builder, **kwargs).compile(checkpointer=saver)``."""
    return add_cancellation(builder, **kwargs).compile(checkpointer=saver)


# ----------------------------------------------------------------------------- worker graphs


def kill_graph(
    saver: Any, log: ExecutionLog, charge: str = "charge"
) -> tuple[Any, ScriptedChatModel]:
    """The kill -9 agent: one batch update_order -> ``charge`` -> send_email, then "done".

    ``update_order`` and ``send_email`` are the refund agent's real tools (the
    providers count their requests per key); ``charge`` is a counting tool the
    test holds at a gate while it kills the process (name it per run to hold
    two runs of one worker at different phases).
    """
    from langgraph_cancel.demo import tools as refund_tools

    charge_tool = counting_tool(log, charge, EffectKind.IRREVERSIBLE)
    model = scripted(
        AIMessage(
            "",
            tool_calls=[
                tool_call("update_order", {"order_id": "o-88", "status": "on_hold"}, id="k1"),
                tool_call(charge, {"item": "c-1"}, id="k2"),
                tool_call(
                    "send_email",
                    {"to": "dana@example.com", "subject": "On hold", "body": "Held."},
                    id="k3",
                ),
            ],
        ),
        "done",
    )
    node = EffectToolNode([refund_tools.update_order, charge_tool, refund_tools.send_email])
    return cancellable(agent_builder(model, node), saver), model


def slow_graph(saver: Any, log: ExecutionLog, _variant: str = "") -> tuple[Any, ScriptedChatModel]:
    """The cross-process cancel agent: ``slow`` (held at a gate) then three more writes."""
    tools = [
        counting_tool(log, "slow", EffectKind.REVERSIBLE),
        counting_tool(log, "w1", EffectKind.IRREVERSIBLE),
        counting_tool(log, "w2", EffectKind.IRREVERSIBLE),
        counting_tool(log, "w3", EffectKind.IRREVERSIBLE),
    ]
    model = scripted(
        calls(("slow", "s", "x0"), ("w1", "a", "x1"), ("w2", "b", "x2"), ("w3", "c", "x3")),
        "done",
    )
    return cancellable(agent_builder(model, EffectToolNode(tools)), saver), model


WORKER_GRAPHS = {"kill": kill_graph, "slow": slow_graph}


def worker_command(
    scenario: str, db_url: str, log_path: str, runs: Sequence[str], worker: str
) -> list[str]:
    """The argv of a worker process running ``scenario`` on threads at once.

    ``runs``: ``THREAD_ID`` or ``THREAD_ID:VARIANT`` each (the variant is passed
    to the scenario's graph builder, e.g. the name of the tool to hold).
    """
    argv = [sys.executable, str(Path(__file__).resolve()), "worker", "--scenario", scenario]
    argv += ["--db", db_url, "--log", log_path, "--worker", worker]
    for run in runs:
        argv += ["--run", run]
    return argv


def worker_env(providers_path: str) -> dict[str, str]:
    """The environment of a worker process (providers' file, import path)."""
    env = dict(os.environ)
    env["REFUND_AGENT_PROVIDERS_DB"] = providers_path
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _worker(args: argparse.Namespace) -> int:
    log = ExecutionLog(args.log)
    with open_saver(args.db) as saver:

        def one(run: str) -> None:
            thread_id, _, variant = run.partition(":")
            graph, _model = WORKER_GRAPHS[args.scenario](saver, log, variant)
            cfg = config_for(thread_id, worker=args.worker)
            graph.invoke({"messages": [HumanMessage("go")]}, cfg)
            record = saver.ledger.latest_run(thread_id)
            state = graph.get_state(cfg).values
            out = {
                "thread_id": thread_id,
                "status": record.status.value if record else None,
                "report": state.get("cancellation_report"),
                "dangling": dangling_calls(state["messages"]),
            }
            print(json.dumps(out), flush=True)

        threads = [threading.Thread(target=one, args=(run,)) for run in args.run]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    worker_parser = sub.add_parser(
        "worker", help="run a scenario's agent on a thread, print the outcome"
    )
    worker_parser.add_argument("--scenario", choices=sorted(WORKER_GRAPHS), required=True)
    worker_parser.add_argument("--db", required=True)
    worker_parser.add_argument("--log", required=True)
    worker_parser.add_argument("--run", action="append", required=True, help="THREAD_ID[:VARIANT]")
    worker_parser.add_argument("--worker", required=True)
    args = parser.parse_args(argv)
    return _worker(args)


if __name__ == "__main__":
    raise SystemExit(main())

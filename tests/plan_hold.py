"""A saver whose save of the model step's checkpoint is held (or fails) on cue, and the
graphs and runs the plan-durability tests hold with it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from langchain_core.messages import AnyMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graphs import ExecutionLog
from langgraph_cancel import (
    EffectStatus,
    EffectToolNode,
    add_cancellation,
)
from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.ledger import Ledger


class Hold:
    """Once armed, the next ``put`` (of a checkpoint ``only`` accepts, when given) waits
    for ``release``."""

    def __init__(self, *, fail: bool = False, only: Callable[[Any], bool] | None = None) -> None:
        self.armed = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()
        self.fail = fail  # the held save then fails (the database went away)
        # Which checkpoints may be held: an earlier step's save may still be under way
        # when the model arms the hold.
        self.only = only

    def before_put(self, checkpoint: Any = None) -> None:
        if self.only is not None and not self.only(checkpoint):
            return
        if self.armed.is_set() and not self.release.is_set():
            self.holding.set()
            self.release.wait(30)
            if self.fail:
                raise ConnectionError("server closed the connection unexpectedly")


def langgraph_saver_of(base: type[Any]) -> type[Any]:
    """The LangGraph saver under one of ours (ours note a save, or its failure, around
    LangGraph's ``put``: a fault injected below it is seen as the database's)."""
    return next(c for c in base.__mro__ if c.__module__.startswith("langgraph."))


def held(base: type[Any], hold: Hold) -> type[Any]:
    """``base`` whose LangGraph saver underneath holds (and maybe fails) the armed put."""
    langgraph_saver = langgraph_saver_of(base)

    class Below(langgraph_saver):  # type: ignore[misc, valid-type]
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            hold.before_put(checkpoint)
            return super().put(config, checkpoint, metadata, new_versions)

        async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            await asyncio.to_thread(hold.before_put, checkpoint)
            return await super().aput(config, checkpoint, metadata, new_versions)

    if base is langgraph_saver:
        return Below

    class Held(base, Below):  # type: ignore[misc]
        pass

    return Held


@contextmanager
def losing_saver(url: str, lost: Callable[[Any], bool]) -> Iterator[Any]:
    """A SQLite saver whose checkpoint saves fail while ``lost(saver)`` says the database
    is gone (the ledger's own connections, opened before, still reach it)."""

    class Below(langgraph_saver_of(SqliteCancelSaver)):  # type: ignore[misc]
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            if lost(self):
                raise ConnectionError("server closed the connection unexpectedly")
            return super().put(config, checkpoint, metadata, new_versions)

        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            if lost(self):
                raise ConnectionError("server closed the connection unexpectedly")
            super().put_writes(config, writes, task_id, task_path)

    class Losing(SqliteCancelSaver, Below):
        pass

    with Losing.from_conn_string(url) as saver:
        saver.setup()
        yield saver


@contextmanager
def held_saver(url: str, hold: Hold) -> Iterator[Any]:
    base = SqliteCancelSaver if url.startswith("sqlite") else PostgresCancelSaver
    with held(base, hold).from_conn_string(url) as saver:
        saver.setup()
        yield saver


def asks_for_calls(checkpoint: Any) -> bool:
    """Whether a checkpoint's last message is a model's with tool calls (its step asked
    for them)."""
    messages = checkpoint.get("channel_values", {}).get("messages") or []
    return bool(messages) and bool(getattr(messages[-1], "tool_calls", None))


def held_graph(saver: Any, hold: Hold, node: EffectToolNode, model: Any, *, use_async: bool) -> Any:
    """model -> tools -> model; the model arms the hold, so its step's save is held."""

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        out = model.invoke(state["messages"])
        hold.armed.set()
        return {"messages": [out]}

    async def aagent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return agent(state)

    builder = StateGraph(MessagesState)
    builder.add_node("agent", aagent if use_async else agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return add_cancellation(builder).compile(checkpointer=saver)


def held_agent(saver: Any, hold: Hold, model: Any, tools: list[Any], **options: Any) -> Any:
    """``create_agent`` with ``EffectMiddleware(**options)``; the model step arms the hold."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware

    from langgraph_cancel.middleware import EffectMiddleware

    class ArmAfterModel(AgentMiddleware[Any, Any, Any]):
        def after_model(self, state: Any, runtime: Any) -> None:
            hold.armed.set()

    return create_agent(
        model,
        tools,
        middleware=[
            cast(AgentMiddleware[Any, Any, Any], EffectMiddleware(approval=False, **options)),
            ArmAfterModel(),
        ],
        checkpointer=saver,
    )


def start_in_thread(
    graph: Any, thread: str, *, use_async: bool
) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    config = {"configurable": {"thread_id": thread}}
    inputs = {"messages": [HumanMessage("go")]}

    def run() -> None:
        try:
            if use_async:
                out.append(asyncio.run(graph.ainvoke(inputs, config)))
            else:
                out.append(graph.invoke(inputs, config))
        except BaseException as exc:  # handed to the test
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, out


def run_held(
    graph: Any,
    hold: Hold,
    thread: str,
    meanwhile: Callable[[], None],
    *,
    use_async: bool = False,
) -> Any:
    """Run ``graph``; once the model step's save is held, check ``meanwhile``, then let
    the save go and return the run's result."""
    worker, out = start_in_thread(graph, thread, use_async=use_async)
    try:
        assert hold.holding.wait(20), "the model step's checkpoint was never put"
        meanwhile()
    finally:
        hold.release.set()
        worker.join(30)
    assert out and not isinstance(out[0], BaseException), out
    return out[0]


def nothing_sent(log: ExecutionLog, tool: str) -> Callable[[], None]:
    def check() -> None:
        time.sleep(0.5)  # ample time for the tool node to start and plan
        assert log.attempts(tool) == 0

    return check


def statuses(ledger: Ledger, thread: str) -> dict[str, EffectStatus]:
    return {e.tool: e.status for e in ledger.effects(thread)}

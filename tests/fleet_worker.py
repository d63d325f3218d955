"""The processes of the fleet test: workers, a reviewer, a stopper and a sweeper.

Each process is forked from a fork server (``tests/test_fleet.py``) with this module
(and LangGraph) preloaded, and loops until the test writes its ``stop`` file:

- ``worker``: takes the threads in a random order and moves each one on: starts
  a thread of its own that has no checkpoint (each thread has one home worker: a
  customer asks once), continues any thread whose run is not over (a run another
  worker left when it was killed) or whose graph has a node pending (a stop closed
  in the ledger by a worker killed before its last checkpoint), leaves one waiting
  for a reviewer. A thread another worker holds is skipped (``ThreadBusyError``).
  An ``async`` worker does the same as a LangGraph server runs graphs: ``ainvoke`` on
  ``AsyncPostgresCancelSaver`` over an ``AsyncConnectionPool`` that checks its
  connections.
- ``reviewer``: answers each pending approval (``Command(resume=...)``).
- ``stopper``: asks some threads' runs to stop (``request_cancel``), each once.
- ``sweeper``: ``Sweeper`` passes, given the agent (it closes the threads of
  the stops it finishes), on the saver ``langgraph-cancel sweep`` opens (a pool that
  checks its connections, so that it outlives the server's restart).

Every thread refunds its own order (``o-fleet-N``, seeded by the test); a refund
over 100 needs a reviewer's approval. A process that loses its database (its
connections terminated, the server restarted) more than a few times in a row
exits, and the test starts it again, as a supervisor would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from langgraph_cancel import ApprovalGate, EffectToolNode, Ledger, add_cancellation
from langgraph_cancel.checkpointers.postgres import AsyncPostgresCancelSaver
from langgraph_cancel.cli.config import resolve_database
from langgraph_cancel.cli.database import open_saver as cli_open_saver
from langgraph_cancel.demo import tools as refund_tools
from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.sweeper import Sweeper
from langgraph_cancel.testing.fake_model import ScriptedChatModel, tool_call
from langgraph_cancel.urls import parse_database_url
from recovery_worker import FINAL_ANSWER, open_saver

#: Consecutive failed steps after which a process exits to be started again.
MAX_FAILURES = 3
APPROVE = {"decisions": [{"type": "approve"}], "reviewer": "fleet-reviewer"}


def order_of(thread_id: str) -> str:
    """The order a thread refunds."""
    return f"o-{thread_id}"


def amount_of(index: int) -> float:
    """Every other thread's refund needs approval (over 100)."""
    return 150.0 if index % 2 else 40.0


def request_of(thread_id: str, index: int) -> dict[str, Any]:
    """What the customer asks, as the first message's JSON."""
    return {"order": order_of(thread_id), "amount": amount_of(index)}


def script_for(order: str, amount: float) -> list[list[tuple[str, dict[str, Any]]]]:
    """The agent's plan for one order: mixed effect kinds, one batch per model turn."""
    return [
        [
            ("lookup_order", {"order_id": order}),
            ("update_order", {"order_id": order, "status": "refund_pending"}),
        ],
        [
            ("issue_refund", {"order_id": order, "amount": amount}),
            ("send_email", {"to": f"{order}@example.com", "subject": "Refund", "body": "Done."}),
        ],
        [("create_ticket", {"order_id": order, "subject": "Refunded", "body": "Check stock."})],
    ]


def fleet_turn(messages: list[BaseMessage]) -> AIMessage | str:
    """The next batch of the thread's plan, from its first message and its history."""
    first = next(m for m in messages if isinstance(m, HumanMessage))
    asked = json.loads(str(first.content))
    script = script_for(asked["order"], float(asked["amount"]))
    done = sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls)
    if done >= len(script):
        return FINAL_ANSWER
    return AIMessage(
        "",
        tool_calls=[
            tool_call(name, args, id=f"call-{done}-{i}-{name}")
            for i, (name, args) in enumerate(script[done])
        ],
    )


def build_builder() -> Any:
    """The refund agent: scripted model, approval gate, tools, ``add_cancellation``."""
    tools = list(refund_tools.TOOLS)

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        # A model per turn: a scripted model never hands out one tool-call id twice,
        # and one worker runs many threads whose plans share their ids.
        model = ScriptedChatModel([fleet_turn])
        return {"messages": [model.invoke(state["messages"])]}

    builder: Any = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("approval", ApprovalGate(tools))
    builder.add_node("tools", EffectToolNode(tools, handle_tool_errors=True))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
    builder.add_edge("approval", "tools")
    builder.add_edge("tools", "agent")
    add_cancellation(builder, reconcile_interactive=False, cancel_timeout=2.0)
    return builder


class Process:
    """One fleet process's loop: its role's step, until the test says stop."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.dir = Path(spec["workdir"])
        self.name = str(spec["name"])
        self.threads: list[str] = list(spec["threads"])
        #: Each thread's position among all the fleet's threads (its order and amount).
        self.index = {thread_id: i for i, thread_id in enumerate(spec.get("all_threads", []))}
        self.rng = random.Random(spec.get("seed"))
        self.log = (self.dir / f"{self.name}.log").open("a", buffering=1)

    def say(self, what: str) -> None:
        self.log.write(f"{time.monotonic():.3f} {os.getpid()} {what}\n")

    @property
    def stopping(self) -> bool:
        return (self.dir / "stop").exists()

    def loop(self, step: Callable[[], None], pause: float) -> None:
        failures = 0
        while not self.stopping:
            try:
                step()
                failures = 0
            except Exception:
                failures = self.failed(failures + 1)
            time.sleep(pause)

    async def aloop(self, step: Callable[[], Awaitable[None]], pause: float) -> None:
        """``loop`` for a step of an event loop's."""
        failures = 0
        while not self.stopping:
            try:
                await step()
                failures = 0
            except Exception:
                failures = self.failed(failures + 1)
            await asyncio.sleep(pause)

    def failed(self, failures: int) -> int:
        """Log the step's failure; exit, to be started again, after too many in a row."""
        self.say("step failed:\n" + traceback.format_exc())
        if failures >= MAX_FAILURES:
            self.say("exiting to be restarted")
            sys.exit(3)
        return failures


def config_of(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def next_input(proc: Process, thread_id: str, snapshot: Any, run: Any) -> tuple[bool, Any]:
    """Whether the worker moves the thread on, and with what input (None: continue)."""
    if snapshot.created_at is None:
        index = proc.index[thread_id]
        if index % proc.spec["workers"] != proc.spec["home"]:
            return False, None  # its home worker starts it (a customer asks once)
        proc.say(f"start {thread_id}")
        return True, {"messages": [HumanMessage(json.dumps(request_of(thread_id, index)))]}
    if snapshot.interrupts:
        return False, None  # the reviewer's
    if (run is not None and not run.terminal) or snapshot.next:
        status = "no run" if run is None else run.status.value
        proc.say(f"continue {thread_id} ({status}, next {list(snapshot.next)})")
        return True, None
    return False, None


def run_worker(proc: Process, graph: Any, ledger: Ledger) -> None:
    def step() -> None:
        threads = list(proc.threads)
        proc.rng.shuffle(threads)
        for thread_id in threads:
            if proc.stopping:
                return
            snapshot = graph.get_state(config_of(thread_id))
            moves, given = next_input(proc, thread_id, snapshot, ledger.latest_run(thread_id))
            try:
                if moves:
                    graph.invoke(given, config_of(thread_id))
            except ThreadBusyError:
                continue

    proc.loop(step, 0.05)


async def arun_worker(proc: Process) -> None:
    """An async worker: its graph on ``AsyncPostgresCancelSaver`` over a pool."""
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(
        proc.spec["db_url"],
        min_size=1,
        max_size=4,
        open=False,
        check=AsyncConnectionPool.check_connection,
        # After the server's restart the pool reconnects with a growing backoff:
        # wait for a connection at most this long, and let the loop's failures
        # restart the process (as its supervisor would) rather than stall for minutes.
        timeout=10.0,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    ) as pool:
        saver = AsyncPostgresCancelSaver(pool)
        await saver.setup()
        graph = build_builder().compile(checkpointer=saver)

        async def step() -> None:
            threads = list(proc.threads)
            proc.rng.shuffle(threads)
            for thread_id in threads:
                if proc.stopping:
                    return
                snapshot = await graph.aget_state(config_of(thread_id))
                run = await asyncio.to_thread(saver.ledger.latest_run, thread_id)
                moves, given = next_input(proc, thread_id, snapshot, run)
                try:
                    if moves:
                        await graph.ainvoke(given, config_of(thread_id))
                except ThreadBusyError:
                    continue

        try:
            await proc.aloop(step, 0.05)
        finally:
            await saver.aclose_ledger()


def run_reviewer(proc: Process, graph: Any) -> None:
    def step() -> None:
        for thread_id in proc.threads:
            conf: Any = {"configurable": {"thread_id": thread_id}}
            if proc.stopping:
                return
            if graph.get_state(conf).interrupts:
                try:
                    proc.say(f"approve {thread_id}")
                    graph.invoke(Command(resume=APPROVE), conf)
                except ThreadBusyError:
                    continue

    proc.loop(step, 0.2)


def run_stopper(proc: Process, ledger: Ledger) -> None:
    stops = set(proc.spec["stop_threads"])
    done = proc.dir / "stopped.json"

    def step() -> None:
        asked: set[str] = set(json.loads(done.read_text())) if done.exists() else set()
        for thread_id in sorted(stops - asked):
            if proc.rng.random() < 0.3 and ledger.latest_run(thread_id) is not None:
                result = ledger.request_cancel(
                    thread_id, reason="customer withdrew", requested_by="fleet-stopper"
                )
                proc.say(f"stop {thread_id}: {result.accepted}")
                asked.add(thread_id)
                done.write_text(json.dumps(sorted(asked)))

    proc.loop(step, 0.3)


def sweeper_saver(db_url: str) -> AbstractContextManager[Any]:
    """The saver ``langgraph-cancel sweep --db DB_URL`` opens."""
    return cli_open_saver(resolve_database(parse_database_url(db_url)))


def run_sweeper(proc: Process, saver: Any) -> None:
    sweeper = Sweeper(
        saver, graph=build_builder(), tools=refund_tools.TOOLS, cancel_grace=3.0, max_threads=50
    )
    passes = proc.dir / f"{proc.name}.passes.jsonl"

    def step() -> None:
        summary = sweeper.sweep_once()
        with passes.open("a") as out:
            out.write(json.dumps(summary.to_json(), default=str) + "\n")

    proc.loop(step, 0.5)


def main(spec: dict[str, Any]) -> None:
    """The body of one fleet process (forked by the test)."""
    refund_tools.set_providers_path(spec["providers"])
    proc = Process(spec)
    # The package's warnings (a state it could not settle, a hook that failed) go to
    # the process's log, beside its steps.
    handler = logging.StreamHandler(proc.log)
    handler.setFormatter(logging.Formatter(f"%(created).3f {os.getpid()} %(name)s: %(message)s"))
    logging.getLogger("langgraph_cancel").addHandler(handler)
    proc.say(f"up as {'async ' if spec.get('async') else ''}{spec['role']}")
    try:
        if spec.get("async"):
            asyncio.run(arun_worker(proc))
            proc.say("stopped")
            return
        role = spec["role"]
        # The sweeper opens its saver as ``langgraph-cancel sweep`` does; the others as
        # a worker that its supervisor starts again when its connection is gone.
        opened = sweeper_saver(spec["db_url"]) if role == "sweeper" else open_saver(spec["db_url"])
        with opened as saver:
            graph = build_builder().compile(checkpointer=saver)
            if role == "worker":
                run_worker(proc, graph, saver.ledger)
            elif role == "reviewer":
                run_reviewer(proc, graph)
            elif role == "stopper":
                run_stopper(proc, saver.ledger)
            else:
                run_sweeper(proc, saver)
    except Exception:
        proc.say("died:\n" + traceback.format_exc())
        sys.exit(3)
    proc.say("stopped")

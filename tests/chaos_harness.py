"""Chaos harness: random agent plans against the refund agent's fake providers.

A *plan* (:class:`Plan`) is a script for one thread: the model's turns (each a
batch of tool calls of mixed effect kinds), the tool node's concurrency, the
reviewer's answers to approval interrupts, provider faults, and the chaos to
inject: a cancel (before the start, at a model turn, while a tool call is in
flight, or while an approval is pending), a simulated crash inside a tool (an
exception no handler catches, like a process dying mid-call), or the
invocation's asyncio task being cancelled (what a LangGraph server does on
``runs.cancel``).

:class:`Runner` plays a plan on a real compiled graph (``add_cancellation``,
``ApprovalGate``, ``EffectToolNode``) on a memory, SQLite or PostgreSQL saver,
resumes it after every crash, answers every interrupt, then sends a new message
(the thread resumed after the stop) and finally checks the invariants I1-I8 of
``docs/design.md`` against the providers' own truth (a separate SQLite file that counts
every request and every application per idempotency key).

Also here: :func:`kill_worker`, the body of a real process that runs a plan
until a tool call reaches its kill point and blocks there to be SIGKILLed
(``tests/test_chaos_properties.py`` forks it from a fork server).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sqlite3
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from langgraph_cancel import (
    ApprovalGate,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    Ledger,
    Limits,
    Outcome,
    add_cancellation,
    effect,
    get_report,
    idempotency_key,
    request_cancel,
)
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.effects import spec_of
from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.testing import ScriptedChatModel, tool_call
from langgraph_cancel.types import (
    UNDISPATCHED_STATUSES,
    UNSETTLED_STATUSES,
    CancelRequestResult,
    EffectRecord,
    RunRecord,
    RunStatus,
)

#: Seconds the graph waits for an in-flight call once its run is cancelled.
CANCEL_TIMEOUT = 3.0
#: Upper bound of invocations per phase of a plan (interrupts and crashes included).
MAX_STEPS = 40

ORDERS = ("o-88", "o-91", "o-93", "o-97", "o-102")
IRREVERSIBLE_OPS = frozenset({"refund", "send_email", "post_message"})
REVERSIBLE_OPS = frozenset({"create_ticket"})
UNDO_PREFIX = "undo:"
#: How the ledger marks a key an effect gave to another (``#released-to:<effect id>``).
RELEASED = "#released-to:"

#: The chaos agent's tools: name -> (kind, approval rule in words).
TOOL_KINDS: dict[str, EffectKind] = {
    "cx_lookup": EffectKind.READ_ONLY,  # plain read
    "cx_check": EffectKind.READ_ONLY,  # a read that always needs approval
    "cx_ticket": EffectKind.REVERSIBLE,  # approval when priority > 5; undo: close the ticket
    "cx_email": EffectKind.IRREVERSIBLE,  # pre-approved; reconcile by key
    "cx_refund": EffectKind.IRREVERSIBLE,  # approval when amount > 100; key from args
    "cx_post": EffectKind.IRREVERSIBLE,  # always approval; no reconcile, not retry-safe
}
TOOL_NAMES: tuple[str, ...] = tuple(TOOL_KINDS)
#: The providers' operation behind each side-effecting tool.
TOOL_OPERATION = {
    "cx_ticket": "create_ticket",
    "cx_email": "send_email",
    "cx_refund": "refund",
    "cx_post": "post_message",
}


class Crash(BaseException):
    """A simulated process death inside a tool: nothing in the library may catch it."""


# ------------------------------------------------------------------------------ plans
@dataclass(frozen=True)
class CallSpec:
    """One tool call of a turn.

    ``variant``: 0 plain; 1 the approval-needing form (priority 9, amount 150);
    2 a call the provider refuses (unknown order, refund over the order total);
    3 (``cx_lookup`` only) the same arguments every time, as a looping model asks.
    ``ref``: a refund's reference (its declared idempotency key); default one of
    its own, ``r-c<n>``. A later message naming an earlier ref asks for the same
    refund again.
    """

    tool: str
    variant: int = 0
    ref: str | None = None


@dataclass(frozen=True)
class Inject:
    """One piece of chaos.

    ``what``: ``cancel`` (``request_cancel`` from another thread), ``crash``
    (:class:`Crash` raised in the tool) or ``kill_task`` (the invocation's
    asyncio task is cancelled). ``where``: ``start`` (before the first node),
    ``turn`` (while the model produces turn ``at``), ``tool`` (call ``c<at>``,
    ``phase`` ``before`` or ``after`` the provider request), ``approval``
    (approval interrupt number ``at``; ``phase`` ``answer`` resumes with the
    decisions, ``none`` resumes without) or ``hook`` (call number ``at`` of the
    ``phase`` hook: ``reconcile`` or ``compensate``; only crashes go there).
    """

    what: str
    where: str
    at: int = 0
    phase: str = "before"


@dataclass(frozen=True)
class Plan:
    """A script for one thread, and the chaos to throw at it."""

    turns: tuple[tuple[CallSpec, ...], ...]
    effect_concurrency: int = 1
    decisions: tuple[str, ...] = ()
    injections: tuple[Inject, ...] = ()
    faults: tuple[tuple[str, str], ...] = ()
    backend: str = "memory"
    use_async: bool = False
    compensate_on_cancel: bool = False
    reconcile_interactive: bool = True
    #: How many stop requests race each other at each cancel point (I4: one wins).
    racing_cancels: int = 1
    #: After a crash, two workers resume the thread at once (sync plans).
    racing_resumes: bool = False
    #: The run's budget and deadline (``add_cancellation(limits=...)``), if any.
    limits: Limits | None = None
    #: The model reports token usage (``usage_metadata``), for token budgets.
    report_usage: bool = False

    @property
    def n_calls(self) -> int:
        return sum(len(turn) for turn in self.turns)

    def numbered(self, base: int = 0) -> list[list[tuple[int, CallSpec]]]:
        """The turns with each call's global number ``n`` (its id is ``c<n>``), from ``base``."""
        out: list[list[tuple[int, CallSpec]]] = []
        call_number = base
        for turn in self.turns:
            row = []
            for spec in turn:
                row.append((call_number, spec))
                call_number += 1
            out.append(row)
        return out


def call_args(spec: CallSpec, call_number: int) -> dict[str, Any]:
    """The arguments the model gives call ``c<call_number>``; unique per call (``tag``)."""
    tag = f"c{call_number}"
    order = ORDERS[call_number % len(ORDERS)]
    if spec.tool == "cx_lookup":
        if spec.variant == 3:  # the same lookup every time (a looping model)
            return {"order_id": ORDERS[0], "tag": "again"}
        return {"order_id": "o-404" if spec.variant == 2 else order, "tag": tag}
    if spec.tool == "cx_check":
        return {"order_id": order, "tag": tag}
    if spec.tool == "cx_ticket":
        return {
            "order_id": "o-404" if spec.variant == 2 else order,
            "subject": f"ticket {tag}",
            "priority": 9 if spec.variant == 1 else 1,
            "tag": tag,
        }
    if spec.tool == "cx_email":
        return {"to": f"{tag}@example.com", "subject": f"mail {tag}", "tag": tag}
    if spec.tool == "cx_refund":
        amount = {0: 5.0, 1: 150.0, 2: 5000.0}[spec.variant]
        return {"order_id": "o-97", "amount": amount, "ref": spec.ref or f"r-{tag}", "tag": tag}
    if spec.tool == "cx_post":
        return {"channel": "#ops", "text": f"post {tag}", "tag": tag}
    raise ValueError(f"unknown chaos tool {spec.tool!r}")


def edited_args(name: str, args: dict[str, Any], *, valid: bool) -> dict[str, Any]:
    """A reviewer's edit of a call: a valid one, or one the gate must refuse."""
    new = dict(args)
    if name == "cx_refund":
        if valid:
            new["amount"] = float(args["amount"]) + 1.0
        else:
            new["amount"] = "a lot"
    elif name == "cx_ticket":
        if valid:
            new["subject"] = f"{args['subject']} (edited)"
        else:
            new["priority"] = "urgent"
    elif name == "cx_post":
        if valid:
            new["text"] = f"{args['text']} (edited)"
        else:
            new["text"] = 5
    elif name == "cx_check":
        if valid:
            new["order_id"] = "o-93"
        else:
            new["order_id"] = None
    elif valid:
        new["tag"] = f"{args.get('tag')}-edited"
    else:
        new["tag"] = ["not", "a", "string"]
    return new


# ------------------------------------------------------------------------------ the world
@dataclass
class World:
    """The external systems, the tools that reach them, and the chaos hooks."""

    root: Path
    plan: Plan
    thread_id: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:12]}")
    invocations: Counter[str] = field(default_factory=Counter)
    hook_calls: Counter[str] = field(default_factory=Counter)
    #: One clock for the harness's own ordering of events (``next()`` is atomic).
    seq: Iterator[int] = field(default_factory=itertools.count)
    #: (tick after a stop request of ours returned, run id): the request was committed.
    cancel_marks: list[tuple[int, str | None]] = field(default_factory=list)
    fired: set[Inject] = field(default_factory=set)
    cancels: list[CancelRequestResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    target: Any = None  # what request_cancel is given (a saver)
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Future[Any] | None = None
    kill_point: tuple[int, str] | None = None  # (call number, phase): block for SIGKILL
    kill_marker: Path | None = None
    #: Seconds each side-effecting call spends at the provider (slow tools).
    delay: float = 0.0
    #: Called at every chaos point: ("tool", n, "before"|"after") or ("turn", k, "").
    on_event: Callable[[str, int, str], None] | None = None
    #: Where the current plan starts on the thread (a thread may carry several plans,
    #: one per user message): its first call is ``c<call_base>``, its turn 0 the
    #: model's answer after ``turn_base`` earlier AI messages. Injections and faults
    #: count from there.
    call_base: int = 0
    turn_base: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.providers = Providers(self.root / "providers.db")

    # ---- chaos
    def _take(self, where: str, at: int, phase: str | None = None) -> list[Inject]:
        with self._lock:
            todo = [
                i
                for i in self.plan.injections
                if i.where == where
                and i.at == at
                and (phase is None or i.phase == phase)
                and i not in self.fired
            ]
            self.fired.update(todo)
        return todo

    def cancel_from_another_thread(self, why: str) -> None:
        """``request_cancel`` from other threads (``racing_cancels`` of them, released
        together, each with its own reason); wait until every one was recorded."""
        pressers = max(1, self.plan.racing_cancels)
        box: list[Any] = []
        barrier = threading.Barrier(pressers)

        def press(presser_index: int) -> None:
            reason = why if pressers == 1 else f"{why} (presser {presser_index})"
            try:
                barrier.wait(30)
                box.append(
                    request_cancel(self.target, self.thread_id, reason=reason, requested_by="chaos")
                )
            except BaseException as exc:  # handed back to the caller's thread
                box.append(exc)

        threads = [
            threading.Thread(target=press, args=(i,), name="chaos-cancel") for i in range(pressers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(box) == pressers, "request_cancel did not return within 30s"
        for answer in box:
            if isinstance(answer, BaseException):
                raise answer
        tick = next(self.seq)
        self.cancel_marks.extend((tick, a.run_id) for a in box if a.accepted)
        self.cancels.extend(box)
        self.notes.append(f"cancel requested ({pressers}x): {why}")

    def _fire(self, inj: Inject, where: str) -> None:
        if inj.what == "cancel":
            self.cancel_from_another_thread(f"chaos cancel {where}")
        elif inj.what == "crash":
            self.notes.append(f"crash {where}")
            raise Crash(f"simulated crash {where}")
        elif inj.what == "kill_task":
            assert self.loop is not None and self.task is not None, "kill_task needs async"
            self.notes.append(f"task killed {where}")
            self.loop.call_soon_threadsafe(self.task.cancel)
        else:  # pragma: no cover - strategies only make the three
            raise AssertionError(inj)

    def tool_event(self, tag: str, phase: str) -> None:
        call_number = int(tag[1:]) - self.call_base if tag[1:].isdigit() else -1
        if self.kill_point == (call_number, phase):
            assert self.kill_marker is not None
            self.kill_marker.write_text(f"{call_number}:{phase}")
            while True:  # the test SIGKILLs this process here
                time.sleep(1)
        if self.on_event is not None:
            self.on_event("tool", call_number, phase)
        for inj in self._take("tool", call_number, phase):
            self._fire(inj, f"at c{call_number} {phase} the provider request")

    def hook_event(self, hook: str) -> None:
        """A reconcile or compensate hook was called (crash injections may fire here)."""
        with self._lock:
            self.hook_calls[hook] += 1
            call_index = self.hook_calls[hook] - 1
        for inj in self._take("hook", call_index, hook):
            self._fire(inj, f"in {hook} hook call {call_index}")

    def turn_event(self, turn: int) -> None:
        if self.on_event is not None:
            self.on_event("turn", turn, "")
        for inj in self._take("turn", turn):
            self._fire(inj, f"while the model writes turn {turn}")

    def start_injections(self) -> list[Inject]:
        return self._take("start", 0)

    def approval_injections(self, index: int) -> list[Inject]:
        return self._take("approval", index)

    def applied_at(self) -> dict[str, datetime]:
        """When the providers applied each key (millisecond precision, truncated)."""
        conn = sqlite3.connect(self.providers.path, timeout=30)
        try:
            rows = conn.execute(
                "SELECT key, applied_at FROM idempotency WHERE applied_at IS NOT NULL"
            ).fetchall()
        finally:
            conn.close()
        return {key: datetime.fromisoformat(at) for key, at in rows}

    # ---- tools
    def _count(self, key: str) -> None:
        with self._lock:
            self.invocations[key] += 1

    def tools(self) -> list[BaseTool]:
        world = self
        systems = self.providers

        def reconciler(find: Callable[[str], Any]) -> Callable[[str, dict[str, Any]], Outcome]:
            def reconcile(key: str, args: dict[str, Any]) -> Outcome:
                world.hook_event("reconcile")
                found = find(key)
                if found is not None:
                    return Outcome.committed(json.dumps(found, sort_keys=True))
                if systems.pending(key):
                    return Outcome.unknown(f"the provider is still processing {key!r}")
                return Outcome.not_applied(f"the provider has no record of {key!r}")

            return reconcile

        def undo_ticket(key: str, args: dict[str, Any], result: Any) -> None:
            world.hook_event("compensate")
            ticket = systems.find_ticket(key)
            if ticket is None:
                raise RuntimeError(f"no ticket under {key!r}: nothing known to undo")
            systems.close_ticket(ticket["ticket_id"], UNDO_PREFIX + key, reason="run cancelled")

        def run(name: str, tag: str, call: Callable[[str], Any]) -> str:
            key = idempotency_key()
            world._count(key)
            world.tool_event(tag, "before")
            if world.delay and TOOL_KINDS.get(name) is not EffectKind.READ_ONLY:
                time.sleep(world.delay)
            out = call(key)
            world.tool_event(tag, "after")
            return json.dumps(out, sort_keys=True, default=str)

        @effect(EffectKind.READ_ONLY)
        @tool
        def cx_lookup(order_id: str, tag: str) -> str:
            """Look up an order."""
            return run("cx_lookup", tag, lambda _key: systems.get_order(order_id))

        @effect(EffectKind.READ_ONLY, requires_approval=True)
        @tool
        def cx_check(order_id: str, tag: str) -> str:
            """Look up an order's private details (a reviewer must allow it)."""
            return run("cx_check", tag, lambda _key: systems.get_order(order_id))

        @effect(
            EffectKind.REVERSIBLE,
            requires_approval=lambda a: int(a.get("priority", 1)) > 5,
            reconcile=reconciler(systems.find_ticket),
            compensate=undo_ticket,
            retry_safe=True,
            cancel_timeout=CANCEL_TIMEOUT,
        )
        @tool
        def cx_ticket(order_id: str, subject: str, tag: str, priority: int = 1) -> str:
            """Open a support ticket (closing it undoes it)."""
            return run(
                "cx_ticket", tag, lambda key: systems.create_ticket(order_id, subject, "chaos", key)
            )

        @effect(
            EffectKind.IRREVERSIBLE,
            requires_approval=False,
            reconcile=reconciler(systems.find_email),
            retry_safe=True,
            cancel_timeout=CANCEL_TIMEOUT,
        )
        @tool
        def cx_email(to: str, subject: str, tag: str) -> str:
            """Send an email (pre-approved)."""
            return run("cx_email", tag, lambda key: systems.send_email(to, subject, "chaos", key))

        @effect(
            EffectKind.IRREVERSIBLE,
            idempotency_key=lambda a: f"cx-refund:{world.thread_id}:{a['ref']}",
            requires_approval=lambda a: float(a["amount"]) > 100,
            reconcile=reconciler(systems.find_refund),
            retry_safe=True,
            cancel_timeout=CANCEL_TIMEOUT,
        )
        @tool
        def cx_refund(order_id: str, amount: float, ref: str, tag: str) -> str:
            """Refund an order (permanent)."""
            return run("cx_refund", tag, lambda key: systems.refund(order_id, amount, key))

        @effect(EffectKind.IRREVERSIBLE, cancel_timeout=CANCEL_TIMEOUT)
        @tool
        def cx_post(channel: str, text: str, tag: str) -> str:
            """Post to a chat channel (permanent; nobody can ask the channel afterwards)."""
            return run("cx_post", tag, lambda key: systems.post_message(channel, text, key))

        return [cx_lookup, cx_check, cx_ticket, cx_email, cx_refund, cx_post]


# ------------------------------------------------------------------------------ the graph
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


# ------------------------------------------------------------------------------ the runner
@dataclass
class Step:
    """What one invocation did."""

    interrupts: list[Any] = field(default_factory=list)
    cancelled_events: list[dict[str, Any]] = field(default_factory=list)
    crashed: str | None = None  # "crash" | "killed"


class Runner:
    """Plays a plan on a thread, resumes it after every crash, then checks I1-I8."""

    def __init__(
        self,
        plan: Plan,
        root: Path,
        saver: Any,
        *,
        url: str | None = None,
        thread_id: str | None = None,
        arm_faults: bool = True,
    ) -> None:
        self.plan = plan
        self.world = World(root, plan)
        if thread_id is not None:
            self.world.thread_id = thread_id
        self.world.target = saver
        self.saver = saver
        self.ledger: Ledger = saver.ledger
        self.url = url
        self.model = scripted_model(self.world)
        self.graph = build_graph(self.world, self.model, saver)
        self.cfg: dict[str, Any] = {"configurable": {"thread_id": self.world.thread_id}}
        # Every dispatch the ledger accepts, by the tick at which it was *attempted*: one
        # attempted after a stop request of ours had returned must have been refused (I1).
        # Timestamps cannot tell this (a request is stamped before it commits).
        self.dispatches: list[tuple[int, str]] = []
        transition = self.ledger.transition

        def logged_transition(effect_id: str, to: Any, *args: Any, **kwargs: Any) -> Any:
            tick = next(self.world.seq)
            rec = transition(effect_id, to, *args, **kwargs)
            if EffectStatus(to) is EffectStatus.DISPATCHED:
                self.dispatches.append((tick, effect_id))
            return rec

        transition_many = self.ledger.transition_many

        def logged_transition_many(requests: Any) -> Any:
            tick = next(self.world.seq)
            out = transition_many(requests)
            for req, rec in zip(requests, out, strict=True):
                if req.to is EffectStatus.DISPATCHED and isinstance(rec, EffectRecord):
                    self.dispatches.append((tick, req.effect_id))
            return out

        self.ledger.transition = logged_transition
        self.ledger.transition_many = logged_transition_many
        self.cancelled_events: list[dict[str, Any]] = []
        self.approvals = 0
        self.decision_index = 0
        self.i7_checks = 0
        self.i8_checks = 0
        self.final_statuses: set[str] = set()
        self.run_statuses: set[str] = set()
        if arm_faults:
            for operation, mode in plan.faults:
                self.world.providers.set_fault(operation, mode, times=1)

    @property
    def thread_id(self) -> str:
        return self.world.thread_id

    def begin(self, plan: Plan) -> None:
        """Take ``plan`` as the script of the thread's next user message.

        Its calls are numbered after every earlier plan's and its turns counted
        from the AI messages already in the history; its injections, reviewer
        answers and faults start afresh. The graph (concurrency, async, cancel
        options) stays the one this runner was built with.
        """
        world = self.world
        state = self.graph.get_state(self.cfg).values if self.saver is not None else {}
        world.call_base += self.plan.n_calls
        world.turn_base = sum(isinstance(m, AIMessage) for m in state.get("messages", []))
        world.plan = self.plan = plan
        world.fired = set()
        self.decision_index = 0
        self.approvals = 0
        for operation, mode in plan.faults:
            world.providers.set_fault(operation, mode, times=1)

    # ---- invoking
    def _consume(self, chunks: Any, step: Step) -> None:
        for mode, data in chunks:
            if mode == "updates" and isinstance(data, dict) and "__interrupt__" in data:
                step.interrupts.extend(data["__interrupt__"])
            elif mode == "custom" and isinstance(data, dict):
                event = data.get("langgraph_cancel")
                if isinstance(event, dict) and event.get("event") == "cancelled":
                    step.cancelled_events.append(event)

    def invoke(self, inp: Any, *, worker: str | None = None) -> Step:
        step = Step()
        modes = ["updates", "custom"]
        cfg = self.cfg
        if worker is not None:
            cfg = {"configurable": {**self.cfg["configurable"], "langgraph_cancel_worker": worker}}
        if not self.plan.use_async:
            try:
                self._consume(self.graph.stream(inp, cfg, stream_mode=modes), step)
            except Crash:
                step.crashed = "crash"
        else:

            async def consume() -> None:
                async for chunk in self.graph.astream(inp, cfg, stream_mode=modes):
                    self._consume([chunk], step)

            async def main() -> None:
                self.world.loop = asyncio.get_running_loop()
                task = asyncio.ensure_future(consume())
                self.world.task = task
                try:
                    await task
                except asyncio.CancelledError:
                    if not task.cancelled():
                        raise
                    step.crashed = "killed"
                except Crash:
                    step.crashed = "crash"
                finally:
                    self.world.task = None

            asyncio.run(main())
        self.cancelled_events.extend(step.cancelled_events)
        return step

    def racing_resumes(self) -> None:
        """Two workers resume the crashed thread at once: one gets it, the other is told
        the thread is busy (I2: not dispatched twice by two workers)."""
        outcomes: list[Any] = []
        barrier = threading.Barrier(2)

        def resume(worker: str) -> None:
            try:
                barrier.wait(30)
                outcomes.append(self.invoke(None, worker=worker))
            except ThreadBusyError as exc:
                outcomes.append(exc)
            except BaseException as exc:  # handed back to the caller's thread
                outcomes.append(exc)

        threads = [
            threading.Thread(target=resume, args=(f"chaos-worker-{w}",), name="chaos-resume")
            for w in "ab"
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(outcomes) == 2, "a racing resume did not return"
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, ThreadBusyError):
                raise outcome
        self.world.notes.append("racing resumes: " + ", ".join(type(o).__name__ for o in outcomes))

    def invoke_retrying_lease(self, inp: Any, timeout: float = 40.0) -> Step:
        """Invoke; while a killed worker's lease is live, wait for it to lapse."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.invoke(inp)
            except ThreadBusyError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    # ---- answering
    def _next_decision(self) -> str:
        decisions = self.plan.decisions
        decision = (
            decisions[self.decision_index] if self.decision_index < len(decisions) else "approve"
        )
        self.decision_index += 1
        return decision

    def approval_answer(self, value: dict[str, Any]) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        for action in value["action_requests"]:
            kind = self._next_decision()
            if kind == "reject":
                out.append({"type": "reject", "message": "not this one"})
            elif kind in ("edit", "edit_invalid"):
                args = edited_args(action["name"], action["args"], valid=kind == "edit")
                out.append(
                    {"type": "edit", "edited_action": {"name": action["name"], "args": args}}
                )
            else:
                out.append({"type": "approve"})
        return {"decisions": out, "reviewer": "chaos-reviewer"}

    def operator_answer(self, value: dict[str, Any]) -> dict[str, Any]:
        """An operator settles unknown outcomes by asking the provider by key."""
        keys = self.world.providers.truth()["keys"]
        decisions = []
        for unknown in value["effects"]:
            applied = keys.get(unknown["idempotency_key"], {}).get("executions", 0) >= 1
            decisions.append(
                {
                    "effect_id": unknown["effect_id"],
                    "decision": "committed" if applied else "not_applied",
                    "result": "confirmed with the provider" if applied else None,
                    "reviewer": "chaos-operator",
                }
            )
        return {"decisions": decisions}

    # ---- driving
    def drive(self, inp: Any) -> None:
        """Invoke until the thread rests: every interrupt answered, every crash resumed."""
        for _ in range(MAX_STEPS):
            step = self.invoke_retrying_lease(inp)
            if step.crashed:
                check_persisted_state_answers(self)  # I7, before anything resumes
                run = self.ledger.latest_run(self.thread_id)
                if step.crashed == "killed" or (run is not None and run.terminal):
                    return
                if self.plan.racing_resumes and not self.plan.use_async:
                    self.racing_resumes()  # then carry on from wherever the winner stopped
                inp = None  # resume the crashed run from its last checkpoint
                continue
            if not step.interrupts:
                return
            value = step.interrupts[0].value
            if isinstance(value, dict) and value.get("type") == "langgraph_cancel.reconcile":
                inp = Command(resume=self.operator_answer(value))
                continue
            index = self.approvals
            self.approvals += 1
            resume: Any = Command(resume=self.approval_answer(value))
            for inj in self.world.approval_injections(index):
                self.world.cancel_from_another_thread(f"chaos cancel at approval {index}")
                if inj.phase == "none":
                    resume = None
            inp = resume
        raise AssertionError(f"the thread did not come to rest in {MAX_STEPS} invocations")

    def play(self) -> None:
        """The whole plan: run, resume after the stop, check I1-I8."""
        for _inj in self.world.start_injections():
            # The run exists (a server created it) and is stopped before any node runs.
            self.ledger.start_run(self.thread_id)
            self.world.cancel_from_another_thread("chaos cancel before the start")
        self.drive({"messages": [HumanMessage("go")]})
        check_cancelled_run_starts_nothing(self)  # I8, first half
        unsettled_before = [
            e
            for e in self.ledger.effects(self.thread_id)
            if e.status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN)
        ]
        runs_before = {r.run_id for r in self.ledger.runs(self.thread_id)}
        self.drive({"messages": [HumanMessage("where do things stand?")]})
        check_resume_reconciles_first(self, unsettled_before, runs_before)  # I8, second half
        check_invariants(self)
        self.final_statuses = {e.status.value for e in self.ledger.effects(self.thread_id)}
        self.run_statuses = {r.status.value for r in self.ledger.runs(self.thread_id)}


# ------------------------------------------------------------------------------ checks
def _keys(runner: Runner) -> dict[str, dict[str, Any]]:
    keys: dict[str, dict[str, Any]] = runner.world.providers.truth()["keys"]
    return keys


def _applied(keys: dict[str, dict[str, Any]], ops: frozenset[str]) -> set[str]:
    return {k for k, v in keys.items() if v["operation"] in ops and v["executions"] >= 1}


def _fmt(effects: list[EffectRecord]) -> str:
    return "; ".join(
        f"{e.tool_call_id}:{e.tool}:{e.status.value}:{e.idempotency_key}" for e in effects
    )


def _task_tree(ledger: Ledger, run: RunRecord) -> list[RunRecord]:
    """``run`` and its sub-agents' runs, recursively."""
    tree, pending, seen = [], [run], set()
    while pending:
        here = pending.pop(0)
        if here.run_id in seen:
            continue
        seen.add(here.run_id)
        tree.append(here)
        pending.extend(ledger.child_runs(here.run_id))
    return tree


def check_buckets_add_up(runner: Runner) -> None:
    """Every call asked for is in exactly one bucket of its run's report.

    For each run of the thread, the report's buckets hold each call of the run
    and of its sub-agents' runs (recursively) exactly once, and nothing else;
    across the thread's runs, every call the model asked for (each tool call of
    each ``AIMessage`` in the thread's state) is accounted for.
    """
    ledger = runner.ledger
    thread = runner.thread_id
    accounted: Counter[str] = Counter()
    for run in ledger.runs(thread):
        report = get_report(runner.saver, thread, run_id=run.run_id)
        entries = [entry.effect_id for entry in report.entries()]
        calls = sorted(
            e.effect_id for r in _task_tree(ledger, run) for e in ledger.run_effects(r.run_id)
        )
        assert sorted(entries) == calls, (
            f"run {run.run_id} ({run.status.value}): its report's buckets hold {sorted(entries)}, "
            f"its task tree's calls are {calls}"
        )
        accounted.update(e.effect_id for e in ledger.run_effects(run.run_id))
    twice = sorted(effect_id for effect_id, n in accounted.items() if n > 1)
    assert not twice, f"calls in two runs' reports: {twice}"
    recorded = [e.tool_call_id for e in ledger.effects(thread)]
    messages = runner.graph.get_state(runner.cfg).values.get("messages", [])
    asked = [
        call["id"]
        for message in messages
        if isinstance(message, AIMessage)
        for call in message.tool_calls
        if call.get("id")
    ]
    # A call whose key an edit changed is recorded under ``<tool_call_id>~<digest>``.
    missing = [
        call_id
        for call_id in asked
        if not any(rec == call_id or rec.startswith(f"{call_id}~") for rec in recorded)
    ]
    assert not missing, f"calls the model asked for that no report accounts for: {missing}"


def check_persisted_state_answers(runner: Runner) -> None:
    """I7: after a crash, the ledger and the checkpoint alone say what was done and what next.

    Read through a fresh connection where the database allows it (another
    process would do exactly this).
    """
    runner.i7_checks += 1
    fresh: Ledger | None = None
    if runner.url is not None:
        fresh = Ledger.from_url(runner.url)
    ledger = fresh or runner.ledger
    try:
        effects = ledger.effects(runner.thread_id)
        run = ledger.latest_run(runner.thread_id)
    finally:
        if fresh is not None:
            fresh.close()
    keys = _keys(runner)
    by_key = {e.idempotency_key: e for e in effects}
    maybe = {
        EffectStatus.DISPATCHED,
        EffectStatus.COMMITTED,
        EffectStatus.UNKNOWN,
        EffectStatus.COMPENSATING,
        EffectStatus.COMPENSATED,
        EffectStatus.COMPENSATION_FAILED,
    }
    # What was (or may have been) committed: every key the world applied is known.
    for key in _applied(keys, IRREVERSIBLE_OPS | REVERSIBLE_OPS):
        rec = by_key.get(key)
        assert rec is not None, f"I7: the provider applied {key} but the ledger has no record"
        assert rec.status in maybe, f"I7: the provider applied {key}; the ledger says {rec}"
    # What was done: every committed side effect really happened.
    for record in effects:
        if record.kind is not EffectKind.READ_ONLY and record.status is EffectStatus.COMMITTED:
            assert keys.get(record.idempotency_key, {}).get("executions", 0) == 1, (
                f"I7: the ledger says {record.tool_call_id} committed, "
                "the provider never applied it"
            )
        if record.status is EffectStatus.DISPATCHED:
            assert record.owner, f"I7: {record.effect_id} is in flight with no owner"
        if record.status is EffectStatus.UNKNOWN:
            assert record.owner and record.next_action, (
                f"I7: {record.effect_id} unknown without owner/action"
            )
    # What the next step is: a live run resumes from its checkpoint's next node or
    # interrupt, or applies the saved writes of a step that finished but was not yet
    # committed (LangGraph lists no "next" for a task whose writes are saved). A
    # checkpoint at the very end (the failure hit a late checkpoint write) is a
    # finished agent turn with nothing in flight: resuming just closes the run.
    assert run is not None
    if not run.terminal:
        snapshot = runner.graph.get_state(runner.cfg)
        saved = runner.saver.get_tuple(runner.cfg)
        if not (snapshot.next or snapshot.interrupts or (saved and saved.pending_writes)):
            # A run whose cancel was asked for is finished by the next invoke of the
            # thread, whatever its checkpoint names: the graph had ended when the cancel
            # came, or a stopped task showed its stop under way in the thread state
            # (which leaves the calls it waited for unanswered), and the crash hit the
            # finish outside the graph (a compensation, say). The ledger says so (the
            # run's status), and that finish settles every effect the run left and
            # answers every call: it drops what never went out, reconciles what did
            # and compensates again what was being compensated. ``drive`` resumes it,
            # and the checks after the plan see that it did (I5 included).
            stopping = run.status in (RunStatus.CANCEL_REQUESTED, RunStatus.CANCELLING)
            messages = snapshot.values.get("messages", [])
            assert stopping or not dangling_calls(messages), (
                f"I7: run {run.run_id} is live, its checkpoint names no next step and leaves "
                f"calls unanswered: {dangling_calls(messages)}"
            )
            if not stopping:
                stuck = [
                    e for e in effects if e.status in UNSETTLED_STATUSES - {EffectStatus.UNKNOWN}
                ]
                assert not stuck, f"I7: nothing will settle {_fmt(stuck)}"


def _world_snapshot(runner: Runner) -> tuple[Any, ...]:
    keys = _keys(runner)
    return (
        {k: (v["attempts"], v["executions"]) for k, v in keys.items()},
        sum(runner.world.invocations.values()),
        runner.model.calls,
        [(e.effect_id, e.status) for e in runner.ledger.effects(runner.thread_id)],
    )


def check_cancelled_run_starts_nothing(runner: Runner) -> None:
    """I8 (first half) and I5: a cancelled run, continued, starts no new work."""
    run = runner.ledger.latest_run(runner.thread_id)
    if run is None or run.status is not RunStatus.CANCELLED:
        return
    runner.i8_checks += 1
    messages = runner.graph.get_state(runner.cfg).values.get("messages", [])
    assert dangling_calls(messages) == [], f"I5: dangling calls after cancel: {messages}"
    before = _world_snapshot(runner)
    step = runner.invoke(None)
    assert not step.crashed and not step.interrupts, step
    after = _world_snapshot(runner)
    assert after == before, f"I8: continuing a cancelled run did work: {before} -> {after}"
    assert runner.ledger.require_latest_run(runner.thread_id).run_id == run.run_id


def check_resume_reconciles_first(
    runner: Runner, unsettled_before: list[EffectRecord], runs_before: set[str]
) -> None:
    """I8 (second half): a resumed thread settles what it can before dispatching anything."""
    ledger = runner.ledger
    new_runs = [r for r in ledger.runs(runner.thread_id) if r.run_id not in runs_before]
    if not new_runs:
        return
    new_ids = {r.run_id for r in new_runs}
    first_dispatch = min(
        (
            t.at
            for e in ledger.effects(runner.thread_id)
            if e.run_id in new_ids
            for t in ledger.history(e.effect_id)
            if t.to_status is EffectStatus.DISPATCHED
        ),
        default=None,
    )
    if first_dispatch is None:
        return
    for old in unsettled_before:
        spec = spec_of(runner.graph.cancellation.tools[old.tool])
        if spec.reconcile is None:
            continue
        settled = [
            t
            for t in ledger.history(old.effect_id)
            if t.at >= old.updated_at
            and t.from_status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN)
        ]
        assert settled, f"I8: {old.effect_id} ({old.status.value}) was not reconciled on resume"
        assert settled[0].at <= first_dispatch, (
            f"I8: the resumed thread dispatched at {first_dispatch} before reconciling "
            f"{old.effect_id} at {settled[0].at}"
        )


def check_invariants(runner: Runner) -> None:
    """I1-I6 against the providers' truth, at rest, after the whole plan."""
    ledger = runner.ledger
    thread = runner.thread_id
    effects = ledger.effects(thread)
    runs = ledger.runs(thread)
    keys = _keys(runner)
    by_key = {e.idempotency_key: e for e in effects}
    tools = runner.graph.cancellation.tools
    messages = runner.graph.get_state(runner.cfg).values.get("messages", [])
    context = f"\nnotes: {runner.world.notes}\neffects: {_fmt(effects)}\nkeys: {keys}"

    # ---- I4: one terminal transition per run; the first reason wins
    assert runs, "no run was recorded"
    for run in runs:
        assert run.terminal, f"I4: run {run.run_id} is left {run.status.value}{context}"
        assert ledger.finish_run(run.run_id, RunStatus.CANCELLED) is False
        assert ledger.finish_run(run.run_id, RunStatus.COMPLETED) is False
        if run.requested_at is not None:
            assert run.status is RunStatus.CANCELLED, (
                f"I4: run {run.run_id} was asked to stop but ended {run.status.value}{context}"
            )
        if run.status is RunStatus.CANCELLED:
            assert run.report is not None and run.report["status"] == "cancelled"
            events = [e for e in runner.cancelled_events if e["report"]["run_id"] == run.run_id]
            assert len(events) <= 1, f"I4: {len(events)} cancelled events for one run"
        firsts = [c for c in runner.world.cancels if c.run_id == run.run_id and c.first]
        ours = [c for c in runner.world.cancels if c.run_id == run.run_id and c.accepted]
        assert len(firsts) <= 1, f"I4: {len(firsts)} cancel requests were 'first'"
        if firsts:
            assert run.reason == firsts[0].reason, (run.reason, firsts[0].reason)
        # Every accepted request, first or not, was told the reason that won.
        assert all(c.reason == run.reason for c in ours), (run.reason, ours)
        if run.status is RunStatus.CANCELLED and run.report is not None:
            assert run.report["reason"] == run.reason
    # ---- I1: nothing dispatched after the signal
    run_of = {e.effect_id: e.run_id for e in effects}
    for mark, run_id in runner.world.cancel_marks:
        # Dispatches of other threads on the same ledger (a sub-agent's) are not this run's.
        late_ids = [
            eid for tick, eid in runner.dispatches if tick > mark and run_of.get(eid) == run_id
        ]
        assert not late_ids, (
            f"I1: dispatched after the stop request was committed: {late_ids}{context}"
        )
    for run in runs:
        report = get_report(runner.saver, thread, run_id=run.run_id)
        assert report.dispatched_after_cancel == 0, f"I1: {report}{context}"
        # The report accounts for every call of the run, each in exactly one bucket.
        accounted = [entry.effect_id for entry in report.entries()]
        asked = sorted(e.effect_id for e in effects if e.run_id == run.run_id)
        assert sorted(accounted) == asked, (
            f"report buckets {sorted(accounted)} != the run's calls {asked}{context}"
        )
        cutoff = run.observed_at or run.requested_at
        if cutoff is not None:
            late = [
                e
                for e in effects
                if e.run_id == run.run_id
                and e.dispatched_at is not None
                and e.dispatched_at > cutoff
            ]
            assert not late, f"I1: dispatched after the signal was observed: {_fmt(late)}{context}"
            # Nothing the run dropped ever reached a provider.
            dropped = [e for e in late if e.status is EffectStatus.DROPPED]
            assert not dropped, _fmt(dropped)
    # ---- I2: no key applied twice; no call repeated beyond its recorded dispatches
    for key, info in keys.items():
        assert info["executions"] <= 1, f"I2: key {key} applied {info['executions']} times"
        owner = key[len(UNDO_PREFIX) :] if key.startswith(UNDO_PREFIX) else key
        assert owner in by_key, f"I2/I7: the provider saw key {key} the ledger does not know"
    allowed_by_key: Counter[str] = Counter()
    holders: dict[str, list[str]] = defaultdict(list)
    for record in effects:
        trail = ledger.history(record.effect_id)
        fresh = sum(
            1
            for t in trail
            if t.to_status is EffectStatus.DISPATCHED
            and t.from_status is not EffectStatus.DISPATCHED
        )
        again = sum(
            1
            for t in trail
            if t.to_status is EffectStatus.DISPATCHED and t.from_status is EffectStatus.DISPATCHED
        )
        if record.kind is EffectKind.READ_ONLY and fresh == 0:
            continue  # fast reads are recorded after they ran; a re-run may read again
        spec = spec_of(tools[record.tool])
        if not spec.retry_safe:
            assert again == 0, (
                f"I2: {record.tool_call_id} ({record.tool}) re-dispatched in flight{context}"
            )
        # A fresh dispatch follows a plan/approval, or a reconcile that proved "not applied".
        per = spec.max_attempts if spec.retry_safe else 1
        # A key an effect gave up (``#released-to:``) ran under its plain name: its
        # dispatches count for the key with those of the effect that holds it now.
        key = record.idempotency_key.split(RELEASED, 1)[0]
        allowed_by_key[key] += (fresh + again) * per
        holders[key].append(f"{record.tool_call_id} ({record.tool}) {fresh}+{again}")
    for key, allowed in allowed_by_key.items():
        ran = runner.world.invocations.get(key, 0)
        reached = keys.get(key, {}).get("attempts", 0)
        assert ran <= allowed and reached <= allowed, (
            f"I2: key {key} ran {ran} times, reached the provider {reached} times, for "
            f"{allowed} allowed (dispatches x attempts) of {holders[key]}{context}"
        )
    # ---- I3: every dispatched effect is settled or unknown with owner and next action
    for record in effects:
        if record.status is EffectStatus.UNKNOWN:
            assert record.owner and record.next_action, f"I3: {record}"
        else:
            assert record.status not in UNSETTLED_STATUSES, (
                f"I3: {record.tool_call_id} left {record.status.value} at rest{context}"
            )
        if (
            record.dispatched_at is None
            and record.kind is not EffectKind.READ_ONLY
            and not allowed_by_key[record.idempotency_key]  # no earlier holder went out under it
        ):
            assert runner.world.invocations.get(record.idempotency_key, 0) == 0, (
                f"I1: {record.tool_call_id} ran without a dispatch record{context}"
            )
        if record.status in (EffectStatus.DROPPED, EffectStatus.REJECTED) or (
            record.status in UNDISPATCHED_STATUSES
        ):
            assert keys.get(record.idempotency_key, {}).get("executions", 0) == 0, (
                f"{record.tool_call_id} is {record.status.value} "
                f"but the provider applied it{context}"
            )
    # ---- I3/I7: "not applied" is never said of a call the world had applied
    applied_at = runner.world.applied_at()
    for record in effects:
        when = applied_at.get(record.idempotency_key)
        if when is None:
            continue
        for transition in ledger.history(record.effect_id):
            if transition.to_status in (EffectStatus.NOT_APPLIED, EffectStatus.FAILED):
                assert when > transition.at - timedelta(milliseconds=2), (
                    f"{record.tool_call_id} recorded {transition.to_status.value} "
                    f"at {transition.at} by {transition.actor}, "
                    f"but the provider had applied it at {when}{context}"
                )
    # ---- I5: every tool call in the history is answered
    assert dangling_calls(messages) == [], f"I5: {dangling_calls(messages)}{context}"
    # ---- I6: permanent == what the providers did (irreversible); reversible too
    applied_irr = _applied(keys, IRREVERSIBLE_OPS)
    permanent = {
        e.idempotency_key
        for e in effects
        if e.kind is EffectKind.IRREVERSIBLE and e.status is EffectStatus.COMMITTED
    }
    unknown = {e.idempotency_key for e in effects if e.status is EffectStatus.UNKNOWN}
    assert permanent <= applied_irr, (
        f"I6: reported permanent, never applied: {permanent - applied_irr}{context}"
    )
    assert applied_irr <= permanent | unknown, (
        f"I6: applied, neither permanent nor unknown: {applied_irr - permanent - unknown}{context}"
    )
    for run in runs:
        report = get_report(runner.saver, thread, run_id=run.run_id)
        reported = {e.idempotency_key for e in report.permanent}
        assert reported <= applied_irr, f"I6: run {run.run_id} reports {reported - applied_irr}"
        if run.status is RunStatus.CANCELLED:
            run_applied = {k for k in applied_irr if by_key[k].run_id == run.run_id}
            seen = reported | {e.idempotency_key for e in report.unknown}
            assert run_applied <= seen, (
                f"I6: the cancel report of {run.run_id} misses {run_applied - seen}{context}"
            )
    truth = runner.world.providers.truth()
    tickets = {t["key"]: t for t in truth["tickets"]}
    for record in effects:
        if record.kind is not EffectKind.REVERSIBLE:
            continue
        if record.status is EffectStatus.COMMITTED:
            assert (
                record.idempotency_key in tickets
                and tickets[record.idempotency_key]["status"] == "open"
            )
        elif record.status is EffectStatus.COMPENSATED:
            assert tickets[record.idempotency_key]["status"] == "closed"
        elif record.status in (EffectStatus.DROPPED, EffectStatus.REJECTED, EffectStatus.FAILED):
            assert record.idempotency_key not in tickets, (
                f"{record.tool_call_id} {record.status.value}{context}"
            )


# ------------------------------------------------------------------------------ SIGKILL
def kill_worker(plan: Plan, root: str, thread_id: str, kill_point: tuple[int, str]) -> None:
    """Run ``plan``'s first invocation in this process until the kill point, and block there.

    Approvals are answered as the plan says. The lease TTL is short so the
    process that recovers the thread can take it over quickly.
    """
    import langgraph_cancel.lifecycle as lgc_lifecycle

    lgc_lifecycle.LEASE_TTL = 1.0
    rootp = Path(root)
    with open_saver("sqlite", rootp) as saver:
        runner = Runner(plan, rootp, saver, url=db_url_of("sqlite", rootp), thread_id=thread_id)
        runner.world.kill_point = kill_point
        runner.world.kill_marker = rootp / "killed-here"
        runner.drive({"messages": [HumanMessage("go")]})
    (rootp / "finished").write_text("the kill point was never reached")
    os._exit(0)


__all__ = [
    "TOOL_NAMES",
    "CallSpec",
    "Crash",
    "Inject",
    "Plan",
    "Runner",
    "World",
    "check_buckets_add_up",
    "check_invariants",
    "db_url_of",
    "kill_worker",
    "open_saver",
]

"""Chaos world: the refund agent's fake providers, the tools that reach them, the chaos hooks.

:class:`World` holds the external systems (``Providers``: a separate SQLite
file that counts every request and every application per idempotency key, the
providers' own truth), builds the chaos agent's tools on them, and fires a
plan's injections at the points the tools, the model and the reviewer report:
a cancel from other threads, a :class:`Crash` in a tool or in a reconcile or
compensate hook, the invocation's asyncio task cancelled, or a block at a kill
point for a SIGKILL.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from langchain_core.tools import BaseTool, tool

from chaos_plans import CANCEL_TIMEOUT, TOOL_KINDS, UNDO_PREFIX, Crash, Inject, Plan
from langgraph_cancel import (
    EffectKind,
    Outcome,
    effect,
    idempotency_key,
    request_cancel,
)
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.types import CancelRequestResult


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

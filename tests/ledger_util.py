"""Helpers shared by the ledger tests: building effects in any status, raw SQL errors, the
async ledger behind the sync interface."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import AsyncLedger
from langgraph_cancel.types import (
    EFFECT_TRANSITIONS,
    EffectKind,
    EffectRecord,
    EffectStatus,
    NewEffect,
    TransitionRequest,
)

T = TypeVar("T")

OWNER = "ops-oncall"
NEXT_ACTION = "check the payment provider dashboard"


def path_to(target: EffectStatus) -> list[EffectStatus]:
    """The shortest chain of legal transitions from ``planned`` to ``target`` (excluded start)."""
    start = EffectStatus.PLANNED
    prev: dict[EffectStatus, EffectStatus | None] = {start: None}
    queue: deque[EffectStatus] = deque([start])
    while queue:
        here = queue.popleft()
        if here is target:
            break
        for nxt in sorted(EFFECT_TRANSITIONS[here], key=lambda s: s.value):
            if nxt not in prev:
                prev[nxt] = here
                queue.append(nxt)
    if target not in prev:
        raise AssertionError(f"{target} is unreachable from planned")
    chain: list[EffectStatus] = []
    node: EffectStatus | None = target
    while node is not None and node is not start:
        chain.append(node)
        node = prev[node]
    return list(reversed(chain))


def unknown_kwargs(status: EffectStatus) -> dict[str, Any]:
    """``owner``/``next_action`` for a move to ``unknown`` (required there), else nothing."""
    if status is EffectStatus.UNKNOWN:
        return {"owner": OWNER, "next_action": NEXT_ACTION}
    return {}


def make_effect(
    ledger: Ledger,
    status: EffectStatus,
    *,
    thread_id: str,
    run_id: str,
    tool_call_id: str | None = None,
    seq: int = 0,
    tool: str = "refund",
    kind: EffectKind = EffectKind.IRREVERSIBLE,
) -> EffectRecord:
    """Plan a tool call and walk it, through legal transitions only, to ``status``."""
    record, created = ledger.plan(
        thread_id=thread_id,
        run_id=run_id,
        tool_call_id=tool_call_id or f"call-{uuid.uuid4().hex[:10]}",
        tool=tool,
        kind=kind,
        args={"order": "o-88", "amount": 12.5},
        seq=seq,
        actor="test-planner",
    )
    assert created
    for step in path_to(status):
        record = ledger.transition(
            record.effect_id, step, actor="test-walker", **unknown_kwargs(step)
        )
    assert record.status is status
    return record


def integrity_errors() -> tuple[type[BaseException], ...]:
    """Exceptions a database raises when a constraint or trigger refuses a raw statement."""
    errors: list[type[BaseException]] = [sqlite3.IntegrityError]
    try:
        import psycopg
    except ImportError:  # pragma: no cover - postgres extra missing
        return tuple(errors)
    errors.append(psycopg.errors.IntegrityError)
    return tuple(errors)


def new_id(prefix: str) -> str:
    """A short unique id for threads, runs and tool calls."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def batch_item(
    call_id: str,
    *,
    kind: str = "irreversible",
    seq: int = 0,
    status: EffectStatus = EffectStatus.PLANNED,
    idempotency_key: str | None = None,
    result: object = None,
    error: str | None = None,
    detail: dict[str, object] | None = None,
) -> NewEffect:
    """A ``refund`` call for a batch write, in ``status`` (planned unless told)."""
    return NewEffect(
        tool_call_id=call_id,
        tool="refund",
        kind=EffectKind(kind),
        args={"n": call_id},
        idempotency_key=idempotency_key,
        seq=seq,
        status=status,
        result=result,
        error=error,
        detail=detail,
    )


def running_thread(ledger: Ledger) -> tuple[str, str]:
    """A new thread with a running run: ``(thread_id, run_id)``."""
    thread = new_id("t")
    return thread, ledger.start_run(thread).run_id


def dispatch_request(effect_id: str) -> TransitionRequest:
    """The intent of ``effect_id`` as a batch write asks for it."""
    return TransitionRequest(effect_id=effect_id, to=EffectStatus.DISPATCHED, actor="w", owner="w")


class BlockingAsyncLedger:
    """An ``AsyncLedger`` behind the sync ``Ledger``'s method names, for the sync ledger tests.

    Each call ``name(...)`` awaits the async ledger's ``aname(...)`` on an event loop
    of its own (in a helper thread) and returns its result, so a test written
    against ``Ledger`` runs unchanged against the async ledger on the same
    database. ``backend`` is a sync ledger's on that database, for the tests that
    write raw SQL (in memory it is the very database the async ledger uses).

    Args:
        url: The database.
    """

    def __init__(self, url: str) -> None:
        self.raw = Ledger.from_url(url)
        self.backend = self.raw.backend
        self.url = url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.async_ledger: AsyncLedger = self.run(AsyncLedger.twin_of(self.raw))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the async ledger's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def add_cancel_listener(self, listener: Callable[[str, str], None]) -> None:
        """The async ledger's own (a plain method there too)."""
        self.async_ledger.add_cancel_listener(listener)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        twin = getattr(self.async_ledger, f"a{name}")

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(twin(*args, **kwargs))

        return call

    def close(self) -> None:
        """Close the async ledger, its loop and the sync one."""
        try:
            self.run(self.async_ledger.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            self.raw.close()


def open_fresh_sqlite_file(path: str, gate: str, results: Any) -> None:
    """A racer process (a child of the fork server): open the saver and its ledger on
    ``path`` as soon as ``gate`` exists."""
    while not os.path.exists(gate):
        time.sleep(0.0002)
    try:
        with SqliteCancelSaver.from_conn_string(path) as saver:
            saver.setup()
            saver.ledger.start_run(new_id("t"))
        results.put("ok")
    except Exception as exc:  # reported to the parent, which fails the test with it
        results.put(repr(exc))


def terminate_other_connections(url: str) -> int:
    """``pg_terminate_backend`` every other session on the database of ``url``; how many."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)

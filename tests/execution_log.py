"""The providers' truth for the graph-level tests: every execution of a tool, in a
SQLite file any process can read, so a count survives a ``kill -9`` of the process
that ran the tool.

``ExecutionLog(path)``
    One row per attempt, marked applied when the effect happened; gates that hold a
    tool at a phase until the test releases it (across threads and processes).
``counting_tool(log, name, kind, ...)``
    An ``effect``-classified tool that logs each execution, with reconcile and
    compensate hooks that ask the log (the external system) what happened.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from langgraph_cancel import EffectKind, Outcome, effect

_LOG_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS tool_executions (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        tool TEXT NOT NULL,
        key TEXT,
        item TEXT,
        pid INTEGER NOT NULL,
        started REAL NOT NULL,
        applied REAL
    )""",
    """CREATE TABLE IF NOT EXISTS tool_gates (
        tool TEXT NOT NULL,
        phase TEXT NOT NULL,
        released INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (tool, phase)
    )""",
)


class ExecutionLog:
    """What the tools really did, in a SQLite file any process can read.

    ``attempts`` counts calls that reached the tool; ``applied`` counts calls
    whose effect happened. A *gate* armed on ``(tool, phase)`` holds every
    call of the tool at that phase (``before`` the effect, ``after`` it, or
    ``undo`` in the compensate hook) until the gate is released.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        with self._conn() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            for statement in _LOG_SCHEMA:
                conn.execute(statement)

    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()

    # -- writes (by the tools)
    def start(self, tool: str, key: str | None, item: str | None) -> int:
        with self._conn() as conn:
            cur = conn.execute(
                "INSERT INTO tool_executions (tool, key, item, pid, started) VALUES (?,?,?,?,?)",
                (tool, key, item, os.getpid(), time.time()),
            )
            return int(cur.lastrowid or 0)

    def apply(self, seq: int) -> None:
        with self._conn() as conn:
            conn.execute("UPDATE tool_executions SET applied = ? WHERE seq = ?", (time.time(), seq))

    # -- gates
    def arm(self, tool: str, phase: str = "before") -> None:
        """Hold calls of ``tool`` at ``phase`` until :meth:`release`."""
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO tool_gates (tool, phase, released) VALUES (?, ?, 0) "
                "ON CONFLICT (tool, phase) DO UPDATE SET released = 0",
                (tool, phase),
            )

    def release(self, tool: str, phase: str = "before") -> None:
        with self._conn() as conn:
            conn.execute(
                "UPDATE tool_gates SET released = 1 WHERE tool = ? AND phase = ?", (tool, phase)
            )

    def held(self, tool: str, phase: str) -> bool:
        with self._conn() as conn:
            row = conn.execute(
                "SELECT released FROM tool_gates WHERE tool = ? AND phase = ?", (tool, phase)
            ).fetchone()
        return row is not None and not row["released"]

    def pass_gate(self, tool: str, phase: str, *, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.held(tool, phase):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {tool}/{phase} was never released")
            time.sleep(0.01)

    # -- reads (by the tests and the hooks)
    def rows(self, tool: str | None = None) -> list[dict[str, Any]]:
        with self._conn() as conn:
            if tool is None:
                found = conn.execute("SELECT * FROM tool_executions ORDER BY seq").fetchall()
            else:
                found = conn.execute(
                    "SELECT * FROM tool_executions WHERE tool = ? ORDER BY seq", (tool,)
                ).fetchall()
        return [dict(r) for r in found]

    def attempts(self, tool: str) -> int:
        return len(self.rows(tool))

    def applied(self, tool: str) -> int:
        return sum(1 for r in self.rows(tool) if r["applied"] is not None)

    def applied_for_key(self, tool: str, key: str) -> bool:
        return any(r["key"] == key and r["applied"] is not None for r in self.rows(tool))

    def started(self, tool: str) -> bool:
        return self.attempts(tool) > 0

    def order(self) -> list[str]:
        """Tool names in the order their calls started."""
        return [r["tool"] for r in self.rows()]


def _current_key() -> str | None:
    from langgraph_cancel import idempotency_key

    try:
        return idempotency_key()
    except RuntimeError:  # under a plain ToolNode
        return None


def counting_tool(
    log: ExecutionLog,
    name: str,
    kind: EffectKind | str | None = EffectKind.IRREVERSIBLE,
    *,
    reconcile: bool = True,
    retry_safe: bool = False,
    compensate: bool | None = None,
    fail: Sequence[BaseException | None] = (),
    fail_after_apply: Sequence[BaseException | None] = (),
    before: Callable[[str], None] | None = None,
    after: Callable[[str], None] | None = None,
    seen_keys: list[str] | None = None,
    max_attempts: int = 3,
) -> BaseTool:
    """A tool ``name(item: str)`` whose executions are counted in ``log``.

    Args:
        log: Where executions are recorded.
        name: The tool's name.
        kind: Its effect kind; ``None`` leaves it unclassified (for plain ``ToolNode``).
        reconcile: Give it a reconcile hook that asks the log by idempotency key.
        retry_safe: Declare that a retry with the same key cannot double the effect.
        compensate: Give it a compensate hook (default: for reversible tools).
        fail: Exceptions to raise, one per execution, before the effect (``None``: succeed).
        fail_after_apply: Exceptions to raise, one per execution, after the effect
            was applied (the response was lost).
        before: Called with the item before the effect (in the tool's thread).
        after: Called with the item after the effect, before the tool returns.
        seen_keys: Gets ``idempotency_key()`` of each execution appended.
        max_attempts: Attempts for retryable failures.
    """
    failures = list(fail)
    lost = list(fail_after_apply)
    lock = threading.Lock()

    def run(item: str) -> str:
        key = _current_key()
        if seen_keys is not None and key is not None:
            seen_keys.append(key)
        seq = log.start(name, key, item)
        with lock:
            exc = failures.pop(0) if failures else None
        if exc is not None:
            raise exc
        log.pass_gate(name, "before")
        if before is not None:
            before(item)
        log.apply(seq)
        log.pass_gate(name, "after")
        if after is not None:
            after(item)
        with lock:
            exc = lost.pop(0) if lost else None
        if exc is not None:
            raise exc
        return f"{name}({item}) ok"

    tool = StructuredTool.from_function(
        func=run, name=name, description=f"Test tool {name}: does {name} to an item."
    )
    if kind is None:
        return tool
    kind = EffectKind(kind)

    def ask(key: str, args: dict[str, Any]) -> Outcome:
        if log.applied_for_key(name, key):
            return Outcome.committed(f"{name}({args.get('item')}) ok")
        return Outcome.not_applied(f"no applied {name} with key {key}")

    def undo(key: str, args: dict[str, Any], result: Any) -> None:
        undo_name = f"undo:{name}"
        if any(r["key"] == key and r["applied"] for r in log.rows(undo_name)):
            return  # idempotent: already undone
        seq = log.start(undo_name, key, args.get("item"))
        log.pass_gate(name, "undo")
        log.apply(seq)

    wants_undo = kind is EffectKind.REVERSIBLE if compensate is None else compensate
    extra: dict[str, Any] = {}
    if kind is not EffectKind.READ_ONLY:
        extra["requires_approval"] = False
        if reconcile:
            extra["reconcile"] = ask
        if wants_undo:
            extra["compensate"] = undo
    return effect(kind, retry_safe=retry_safe, max_attempts=max_attempts, **extra)(tool)


__all__ = ["ExecutionLog", "counting_tool"]

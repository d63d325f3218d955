"""The invariants' lower bound: plain LangGraph plus only the durable writes I1 asks of a run.

A run that sends its side effects one at a time must have each call's intent on disk
before the call leaves (invariant I1): one commit that waits for the WAL flush per
call. A call's outcome can travel in the next call's commit, and the last outcome in
one commit that need not wait for the flush. So a run with N calls commits at least N
times with the flush and once without it more than plain LangGraph does, whoever
implements the protocol and however cheap each write is.

The throughput section's ``bound`` variant measures exactly that: plain ``ToolNode`` on
``PostgresSaver``, whose ``wrap_tool_call`` (``BoundWriter.wrap_tool_call``) writes one
row per call in the same database, each committed with the previous call's outcome
before the call goes out (one statement), and the last outcome when the run ends. It
takes no lease, writes no audit rows, checks no stop, reads nothing and does not wait
for the checkpoint that asked for the calls: it does less than any implementation of
the invariants, so its distance from ``plain`` is a floor under ours.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

TABLE = "bound_effects"
CREATE_TABLE = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    call_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    status TEXT NOT NULL,
    result TEXT
)"""
INSERT_INTENT = (
    f"INSERT INTO {TABLE} (call_id, run_id, status) VALUES (%(call_id)s, %(run_id)s, 'dispatched')"
)
RECORD_OUTCOME = (
    f"UPDATE {TABLE} SET status = 'committed', result = %(result)s WHERE call_id = %(done)s"
)
# The previous call's outcome and the next call's intent in one statement.
RECORD_OUTCOME_AND_INTENT = f"""WITH outcome AS ({RECORD_OUTCOME})
{INSERT_INTENT}"""


class BoundWriter:
    """One worker's durable writes; its calls go one at a time.

    Two autocommit connections: one whose commits wait for the WAL flush (the
    intents), one whose commits do not (the run's last outcome). Use ``start`` before a
    run, ``wrap_tool_call`` as the ``ToolNode``'s wrapper and ``end`` after the run.
    """

    def __init__(self, durable: Any, lazy: Any) -> None:
        self._durable = durable
        self._lazy = lazy
        # One call at a time: a side effect is sent after the previous one's outcome.
        self._lock = threading.Lock()
        # The run being written; set by ``start``.
        self._run_id = ""
        # The outcome not yet written: (call id, result), or None.
        self._outcome: tuple[str, str] | None = None

    @classmethod
    @contextlib.contextmanager
    def connect(cls, url: str) -> Iterator[BoundWriter]:
        """A writer on connections of its own to ``url``, closed on exit."""
        import psycopg

        with (
            psycopg.connect(url, autocommit=True) as durable,
            psycopg.connect(url, autocommit=True, options="-c synchronous_commit=off") as lazy,
        ):
            yield cls(durable, lazy)

    def setup(self) -> None:
        """Create the table of intents and outcomes."""
        self._durable.execute(CREATE_TABLE)

    def start(self, run_id: str) -> None:
        """Begin a run: its calls' rows carry ``run_id``. Writes nothing."""
        self._run_id = run_id
        self._outcome = None

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Commit the call's intent (with the previous call's outcome), then send it."""
        with self._lock:
            call_id = str(request.tool_call["id"])
            intent = {"call_id": call_id, "run_id": self._run_id}
            if self._outcome is None:
                self._durable.execute(INSERT_INTENT, intent)
            else:
                done, answer = self._outcome
                self._durable.execute(
                    RECORD_OUTCOME_AND_INTENT, {**intent, "done": done, "result": answer}
                )
            message = handler(request)
            self._outcome = (call_id, str(getattr(message, "content", message)))
            return message

    def end(self) -> None:
        """Write the last call's outcome in a commit that does not wait for the flush."""
        if self._outcome is not None:
            done, answer = self._outcome
            self._lazy.execute(RECORD_OUTCOME, {"done": done, "result": answer})
            self._outcome = None


__all__ = ["BoundWriter"]

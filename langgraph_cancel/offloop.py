"""Blocking work from sync code that may run on an event loop's thread.

Sync code runs on a loop's thread when a sync graph is invoked from inside async
code, or when ``ToolNode``'s async path calls a sync ``wrap_tool_call`` (it does,
when the node has no async one). Database I/O there would stall the loop, and a
LangGraph server's blocking-call checker refuses it; so it moves to a helper
thread, and the loop's thread waits for it as it would for the rest of the sync
call it is inside of.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def off_the_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``: here, or in a helper thread when a loop runs here."""
    if asyncio._get_running_loop() is None:
        return fn(*args, **kwargs)
    context = contextvars.copy_context()
    return _helpers().submit(context.run, fn, *args, **kwargs).result()


def _helpers() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=32, thread_name_prefix="langgraph-cancel-offloop"
            )
        return _pool


def _forget_after_fork() -> None:
    global _pool
    _pool = None  # the parent's threads do not exist in the child


os.register_at_fork(after_in_child=_forget_after_fork)

__all__ = ["off_the_loop"]

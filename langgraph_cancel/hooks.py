"""Calling tool authors' hooks safely: sync or async, bounded in time, never crashing a run.

A reconcile hook that raises, hangs past its timeout or returns something other
than an ``Outcome`` yields ``Outcome.unknown(...)`` naming the problem; the
effect then stays unknown with an owner instead of the run crashing.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import inspect
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from langgraph_cancel.effects import EffectSpec, Outcome
from langgraph_cancel.errors import HookError

logger = logging.getLogger("langgraph_cancel.hooks")


def _in_daemon_thread(fn: Any, *args: Any) -> asyncio.Future[Any]:
    """Run ``fn`` in a daemon thread of its own; a future for its result.

    Not ``asyncio.to_thread``: the loop's default executor is joined when the
    loop closes (``asyncio.run`` does it), so a hook hanging past its timeout
    would hold the whole run until the hook returned, or forever.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def target() -> None:
        try:
            ok, value = True, ctx.run(fn, *args)
        except BaseException as exc:
            ok, value = False, exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=target, name="langgraph-cancel-hook", daemon=True).start()
    return future


async def _call(fn: Any, *args: Any, seconds: float) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await asyncio.wait_for(fn(*args), seconds)
    # A sync hook runs in a thread so a hang cannot block the loop; the thread is
    # abandoned (not killed) on timeout, which Python cannot avoid.
    result = await asyncio.wait_for(_in_daemon_thread(fn, *args), seconds)
    if inspect.isawaitable(result):
        return await asyncio.wait_for(result, seconds)
    return result


async def call_reconcile(spec: EffectSpec, key: str, args: dict[str, Any]) -> Outcome:
    """Ask the tool's reconcile hook what became of a call; never raises."""
    hook = spec.reconcile
    if hook is None:
        return Outcome.unknown("the tool has no reconcile hook")
    try:
        outcome = await _call(hook, key, args, seconds=spec.hook_timeout)
    except TimeoutError:
        return Outcome.unknown(f"reconcile hook timed out after {spec.hook_timeout:g}s")
    except Exception as exc:
        logger.warning("reconcile hook failed for %s", key, exc_info=True)
        return Outcome.unknown(f"reconcile hook raised {exc!r}")
    if not isinstance(outcome, Outcome):
        return Outcome.unknown(f"reconcile hook returned {type(outcome).__name__}, not an Outcome")
    return outcome


async def call_compensate(spec: EffectSpec, key: str, args: dict[str, Any], result: Any) -> None:
    """Run the tool's compensating action.

    Raises:
        HookError: When the hook is missing, raises, or times out.
    """
    hook = spec.compensate
    if hook is None:
        raise HookError("the tool has no compensate hook")
    try:
        await _call(hook, key, args, result, seconds=spec.hook_timeout)
    except TimeoutError as exc:
        raise HookError(f"compensate hook timed out after {spec.hook_timeout:g}s") from exc
    except HookError:
        raise
    except Exception as exc:
        raise HookError(f"compensate hook raised {exc!r}") from exc


async def call_revoke(spec: EffectSpec, key: str, args: dict[str, Any], handle: Any) -> bool:
    """Ask the provider to withdraw a scheduled call; True when it did.

    Raises:
        HookError: When the hook is missing, raises, times out or answers with
            something other than a bool (nobody can tell what became of the call).
    """
    hook = spec.revoke
    if hook is None:
        raise HookError("the tool has no revoke hook")
    try:
        answer = await _call(hook, key, args, handle, seconds=spec.hook_timeout)
    except TimeoutError as exc:
        raise HookError(f"revoke hook timed out after {spec.hook_timeout:g}s") from exc
    except HookError:
        raise
    except Exception as exc:
        raise HookError(f"revoke hook raised {exc!r}") from exc
    if not isinstance(answer, bool):
        raise HookError(f"revoke hook answered {answer!r}, not a bool")
    return answer


class _SharedExecutor(ThreadPoolExecutor):
    """The default executor of every private loop: its threads outlive the loops.

    A fresh loop per node execution would otherwise start fresh worker threads
    for every sync tool call (``tool.ainvoke`` runs sync tools in the loop's
    default executor), which costs more than the call. ``loop.close()`` shuts
    its default executor down; for this one that is a no-op.
    """

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Keep running: other private loops share these threads."""


_executor: _SharedExecutor | None = None
_executor_lock = threading.Lock()


def _shared_executor() -> _SharedExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            # Generous: a sync read abandoned on cancel keeps its thread until it returns.
            _executor = _SharedExecutor(max_workers=64, thread_name_prefix="langgraph-cancel")
        return _executor


_idle_loops: list[asyncio.AbstractEventLoop] = []
_loops_lock = threading.Lock()


def _forget_after_fork() -> None:
    global _executor
    _executor = None  # the parent's threads do not exist in the child
    _idle_loops.clear()  # their selectors are the parent's


os.register_at_fork(after_in_child=_forget_after_fork)


def _take_loop() -> asyncio.AbstractEventLoop:
    """An idle private loop (creating one costs more than a short node's work)."""
    with _loops_lock:
        if _idle_loops:
            return _idle_loops.pop()
    loop = asyncio.new_event_loop()
    loop.set_default_executor(_shared_executor())
    return loop


def _close_idle_loops() -> None:
    with _loops_lock:
        while _idle_loops:
            _idle_loops.pop().close()


atexit.register(_close_idle_loops)


def _run_on_private_loop(coro: Any) -> Any:
    """``asyncio.run`` without waiting for the default executor's threads.

    A read-only call abandoned on cancel may still be running in an executor
    thread; ``asyncio.run`` would join it, holding the cancel hostage. The loop
    goes back to a pool once its tasks are finished or cancelled.
    """
    loop = _take_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        reusable = False
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            # No shutdown_asyncgens(): the loop is reused, and async generators left
            # unfinished are closed by their finalizer hook on its next run.
            reusable = True
        finally:
            if reusable:
                with _loops_lock:
                    _idle_loops.append(loop)
            else:
                loop.close()


def run_sync(coro: Any) -> Any:
    """Run a coroutine from sync code, even when this thread already has a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_on_private_loop(coro)
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(_run_on_private_loop(coro))
        except BaseException as exc:
            error.append(exc)

    ctx = contextvars.copy_context()
    thread = threading.Thread(target=ctx.run, args=(target,))
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


__all__ = ["call_compensate", "call_reconcile", "call_revoke", "run_sync"]

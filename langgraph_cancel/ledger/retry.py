"""Retrying a ledger transaction on transient faults, for the sync and the async ledger.

Lost connections, lock and serialization conflicts are retried with backoff; a
fault that outlives the retries is raised as one typed error,
``TransientDatabaseError``, with the driver's own as its cause.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from langgraph_cancel.errors import TransientDatabaseError

logger = logging.getLogger("langgraph_cancel.ledger")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")


def is_transient(exc: BaseException) -> bool:
    """True for faults worth retrying: lost connections, lock and serialization conflicts.

    Integrity errors (a duplicate key, a check constraint) are never transient.
    """
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return "locked" in text or "busy" in text
    try:
        import psycopg
        from psycopg import errors as pge
        from psycopg_pool import PoolClosed, PoolTimeout
    except ImportError:  # pragma: no cover - postgres extra not installed
        return False
    if isinstance(exc, pge.IntegrityError | pge.RaiseException | PoolClosed):
        return False  # PoolClosed: the ledger was closed; waiting will not reopen it
    if isinstance(exc, pge.SerializationFailure | pge.DeadlockDetected | PoolTimeout):
        return True
    return isinstance(exc, psycopg.OperationalError)


def _give_up(state: RetryCallState) -> Any:
    """Out of retries: one typed error, the driver's own as its cause."""
    exc = state.outcome.exception() if state.outcome is not None else None
    if exc is None:  # pragma: no cover - tenacity only calls this after a failure
        raise TransientDatabaseError("database unavailable after retries")
    # The first attempt ran before tenacity took over.
    raise raise_transient(exc, 1 + state.attempt_number) from exc


def _policy(attempts: int) -> dict[str, Any]:
    """tenacity's settings for the attempts after a transaction's first one failed."""
    return {
        "retry": retry_if_exception(is_transient),
        "stop": stop_after_attempt(attempts - 1),
        "wait": wait_exponential(multiplier=0.02, min=0.01, max=1.0),
        "before_sleep": before_sleep_log(logger, logging.WARNING),
        "retry_error_callback": _give_up,
        "reraise": True,
    }


def transient_retry(attempts: int = 6) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Retry a whole transaction on transient faults, with backoff, logged.

    The first attempt is a plain call (the retry machinery costs more than a
    ledger read, so it is built only after a transient fault); tenacity takes
    over from there. A fault that outlives the retries is raised as
    ``TransientDatabaseError`` (the driver's error is its ``__cause__``); an
    outer retry does not retry it again. Any other error is raised as it is, at
    once.
    """

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def first_then_retrying(*args: Any, **kwargs: Any) -> T:
            return call_with_retry(functools.partial(fn, *args, **kwargs), attempts, fn)

        return first_then_retrying

    return decorate


def call_with_retry(
    call: Callable[[], T], attempts: int = 6, named: Callable[..., Any] | None = None
) -> T:
    """``call()``, retried as ``transient_retry`` retries (no decorator built per call).

    Args:
        call: The whole transaction, taking no arguments.
        attempts: Attempts in all, the first one included.
        named: What the log line names (``call`` itself by default).
    """
    try:
        return call()
    except Exception as exc:
        if not is_transient(exc):
            raise
        logger.warning("Retrying %s at once as it raised %r.", _name(named or call), exc)
    retrying = Retrying(**_policy(attempts))
    result: T = retrying(_logged_as(call, named))
    return result


def _retried(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function a call retries: a partial's own function, else the call itself."""
    return fn.func if isinstance(fn, functools.partial) else fn


def _name(fn: Callable[..., Any]) -> str:
    target = _retried(fn)
    return str(getattr(target, "__qualname__", target))


def _logged_as(call: Callable[[], T], named: Callable[..., Any] | None) -> Callable[[], T]:
    """``call`` under the name tenacity's log lines give it: the function retried, not
    a partial's repr with its arguments (built only once a first attempt failed)."""

    def attempt() -> T:
        return call()

    return _renamed(attempt, named or call)


def _alogged_as(
    call: Callable[[], Coroutine[Any, Any, T]], named: Callable[..., Any] | None
) -> Callable[[], Coroutine[Any, Any, T]]:
    """``_logged_as`` for a coroutine function (tenacity awaits only those)."""

    async def attempt() -> T:
        return await call()

    return _renamed(attempt, named or call)


def _renamed(attempt: F, named: Callable[..., Any]) -> F:
    target = _retried(named)
    attempt.__qualname__ = getattr(target, "__qualname__", attempt.__qualname__)
    attempt.__module__ = getattr(target, "__module__", attempt.__module__)
    return attempt


def atransient_retry(
    attempts: int = 6,
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """``transient_retry`` for coroutines: the whole transaction again on a transient fault.

    The first attempt is a plain await; tenacity's ``AsyncRetrying`` takes over
    after a transient fault (its waits are ``asyncio.sleep``, the loop stays free).
    A fault that outlives the retries is raised as ``TransientDatabaseError``.
    """

    def decorate(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(fn)
        async def first_then_retrying(*args: P.args, **kwargs: P.kwargs) -> T:
            return await acall_with_retry(functools.partial(fn, *args, **kwargs), attempts, fn)

        return first_then_retrying

    return decorate


async def acall_with_retry(
    call: Callable[[], Coroutine[Any, Any, T]],
    attempts: int = 6,
    named: Callable[..., Any] | None = None,
) -> T:
    """``await call()``, retried as ``atransient_retry`` retries (no decorator per call)."""
    try:
        return await call()
    except Exception as exc:
        if not is_transient(exc):
            raise
        logger.warning("Retrying %s at once as it raised %r.", _name(named or call), exc)
    retrying = AsyncRetrying(**_policy(attempts))
    result: T = await retrying(_alogged_as(call, named))
    return result


def raise_transient(exc: BaseException, attempts: int | None = None) -> TransientDatabaseError:
    """Wrap a fault that outlived its retries."""
    tries = f" ({attempts} attempts)" if attempts else ""
    return TransientDatabaseError(f"database unavailable after retries{tries}: {exc}")


__all__ = [
    "acall_with_retry",
    "atransient_retry",
    "call_with_retry",
    "is_transient",
    "raise_transient",
    "transient_retry",
]

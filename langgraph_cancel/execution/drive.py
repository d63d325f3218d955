"""Running a protocol (``steps.py``): the loop every driver shares, and ledger-only drivers.

A protocol yields steps and is sent their answers, or thrown their exceptions.
``drive`` and ``adrive`` run that loop around an ``answer`` function; the
ledger-only drivers answer nothing but ``LedgerCall`` steps, for code that
settles records outside a tool call (the cancel node, the reconciler).
``see_through`` and ``despite_cancel`` keep a ledger write whole when the run's
task is cancelled while it is under way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from typing import Any, TypeVar, cast

from langgraph_cancel.execution.steps import LedgerCall, Protocol, Step
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import async_twin_of
from langgraph_cancel.ledger.flush import commit_before_flush

T = TypeVar("T")


def drive(protocol: Protocol[T], answer: Callable[[Step[Any]], Any]) -> T:
    """Run ``protocol``, answering each step with ``answer`` (blocking)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = protocol.send(value) if error is None else protocol.throw(error)
        except StopIteration as stop:
            return cast(T, stop.value)
        value, error = None, None
        try:
            value = answer(step)
        except BaseException as exc:
            error = exc


async def adrive(protocol: Protocol[T], answer: Callable[[Step[Any]], Awaitable[Any]]) -> T:
    """Run ``protocol``, answering each step with ``await answer(step)``."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = protocol.send(value) if error is None else protocol.throw(error)
        except StopIteration as stop:
            return cast(T, stop.value)
        value, error = None, None
        try:
            value = await answer(step)
        except BaseException as exc:
            error = exc


def call_ledger(ledger: Ledger, step: LedgerCall[Any]) -> Any:
    """Answer a ``LedgerCall`` with the sync method (looked up on the ledger itself)."""
    method = getattr(ledger, step.method.__name__)
    with commit_before_flush() if step.before_flush else nullcontext():
        return method(*step.args, **step.kwargs)


async def acall_ledger(ledger: Ledger, step: LedgerCall[Any]) -> Any:
    """Answer a ``LedgerCall`` with the method's ``a*`` twin: the bound ``AsyncLedger``'s
    (on this loop, no thread), else the sync ledger's (in a thread)."""
    native = async_twin_of(ledger)
    method = getattr(ledger if native is None else native, "a" + step.method.__name__)
    with commit_before_flush() if step.before_flush else nullcontext():
        return await method(*step.args, **step.kwargs)


def drive_ledger(ledger: Ledger, protocol: Protocol[T]) -> T:
    """Run a protocol that only asks the ledger, from sync code."""

    def answer(step: Step[Any]) -> Any:
        if not isinstance(step, LedgerCall):
            raise TypeError(f"a ledger-only protocol asked for {type(step).__name__}")
        return call_ledger(ledger, step)

    return drive(protocol, answer)


async def adrive_ledger(ledger: Ledger, protocol: Protocol[T]) -> T:
    """Run a protocol that only asks the ledger, on the event loop."""

    async def answer(step: Step[Any]) -> Any:
        if not isinstance(step, LedgerCall):
            raise TypeError(f"a ledger-only protocol asked for {type(step).__name__}")
        return await acall_ledger(ledger, step)

    return await adrive(protocol, answer)


async def see_through(work: Awaitable[T]) -> tuple[asyncio.Future[T], bool]:
    """``work`` run to its end even if this task is cancelled meanwhile.

    For a ledger write (bounded by its own retries) that a cancel must not cut short:
    cut short, it may commit anyway, and nobody would know what it did.

    Returns:
        ``work``'s future, done, and whether this task was cancelled while it ran; the
        caller raises the cancel once it has dealt with what the work did (a cancel
        is never lost).
    """
    future = asyncio.ensure_future(work)
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:
            break
    return future, cancelled


async def despite_cancel(work: Awaitable[T]) -> T:
    """``work``'s result, run to its end even if this task is cancelled meanwhile;
    the cancel is raised once it has ended (``see_through``)."""
    future, cancelled = await see_through(work)
    if cancelled:
        raise asyncio.CancelledError from (None if future.cancelled() else future.exception())
    return future.result()


__all__ = [
    "acall_ledger",
    "adrive",
    "adrive_ledger",
    "call_ledger",
    "despite_cancel",
    "drive",
    "drive_ledger",
    "see_through",
]

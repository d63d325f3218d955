"""Running a protocol (``steps.py``): the loop every driver shares, and ledger-only drivers.

A protocol yields steps and is sent their answers, or thrown their exceptions.
``drive`` and ``adrive`` run that loop around an ``answer`` function; the
ledger-only drivers answer nothing but ``LedgerCall`` steps, for code that
settles records outside a tool call (the cancel node, the reconciler).
"""

from __future__ import annotations

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


__all__ = ["acall_ledger", "adrive", "adrive_ledger", "call_ledger", "drive", "drive_ledger"]

"""Ledger operations written once, as generators of database steps, and their two drivers.

An operation is a generator (sans-IO, as DBOS serves sync and async steps with one
body): it yields steps and receives what each produced, or has the exception a
step raised thrown back in at its ``yield``, where it may catch it. ``run`` drives
an operation on a sync backend and ``arun`` awaits it on an async one; the
operation never knows which. The steps:

- ``Unit``: open a cursor (a ``transaction``, a self-contained ``statement`` or a
  ``read``) and run a body in it; the body yields ``Execute`` / ``ExecuteMany`` on
  that cursor (and may yield nested units, which join the open transaction);
- ``Pipeline``: self-contained statements in one round trip (``all_rows``);
- ``Retry``: a sub-operation retried as a whole on transient faults, where the
  ledger's retry boundary lies inside an operation (a write token made once,
  outside the retried part, lets a retry recognise its own earlier write).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from langgraph_cancel.ledger.retry import acall_with_retry, call_with_retry

T = TypeVar("T")

Fetch = Literal["one", "all", "none"]


@dataclass(frozen=True, slots=True)
class Execute:
    """One statement on the enclosing unit's cursor; replies with its first row
    (``fetch="one"``), all of them (``"all"``), or None (``"none"``)."""

    sql: str
    params: dict[str, Any] | None
    fetch: Fetch = "one"


@dataclass(frozen=True, slots=True)
class ExecuteMany:
    """One statement per parameter set on the enclosing unit's cursor; replies None."""

    sql: str
    params: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Unit:
    """Open a cursor of this kind and run ``body`` with it; replies with what it returns."""

    kind: Literal["transaction", "statement", "read"]
    body: Generator[Any, Any, Any]


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Statements in order, in one round trip; replies with the rows of each."""

    statements: list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Retry:
    """``make()``'s operation, made again and rerun on a transient fault; replies with
    its result."""

    make: Callable[[], Generator[Any, Any, Any]]


Step = Execute | ExecuteMany | Unit | Pipeline | Retry
#: An operation returning ``T``.
Operation = Generator[Step, Any, T]


def in_order(*executes: Execute) -> Generator[Step, Any, Any]:
    """A unit's body running ``executes`` in order; returns the last one's reply."""
    reply: Any = None
    for execute in executes:
        reply = yield execute
    return reply


def within(
    kind: Literal["transaction", "statement", "read"], body: Generator[Any, Any, T]
) -> Operation[T]:
    """``body`` run in a unit of this kind, typed: ``x = yield from within(kind, body)``."""
    result: T = yield Unit(kind, body)
    return result


def read(sql: str, params: dict[str, Any], fetch: Fetch = "one") -> Unit:
    """A read unit of one ``SELECT``."""
    return Unit("read", in_order(Execute(sql, params, fetch)))


def nothing() -> Generator[Step, Any, None]:
    """A body or operation that does nothing (a dialect's no-op)."""
    return
    yield  # pragma: no cover - makes this a generator


# ------------------------------------------------------------------------ sync driver
def run(backend: Any, operation: Operation[T]) -> T:
    """Drive ``operation`` on a sync backend."""
    return _trampoline(operation, lambda step: _perform(backend, step, None))


def _trampoline(operation: Generator[Step, Any, T], perform: Callable[[Step], Any]) -> T:
    send: Callable[[Any], Step] = operation.send
    reply: Any = None
    while True:
        try:
            step = send(reply)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            reply, send = perform(step), operation.send
        except Exception as exc:  # thrown back in at the yield, where it may be caught
            reply, send = exc, operation.throw


def _perform(backend: Any, step: Step, cursor: Any) -> Any:
    if isinstance(step, Unit):
        with getattr(backend, step.kind)() as cur:
            return _trampoline(step.body, lambda inner: _perform(backend, inner, cur))
    if isinstance(step, Pipeline):
        return backend.all_rows(step.statements)
    if isinstance(step, Retry):
        return call_with_retry(lambda: run(backend, step.make()), named=step.make)
    if cursor is None:
        raise RuntimeError(f"{type(step).__name__} outside of any unit")
    if isinstance(step, ExecuteMany):
        cursor.executemany(step.sql, step.params)
        return None
    cursor.execute(step.sql, step.params)
    if step.fetch == "one":
        return cursor.fetchone()
    return cursor.fetchall() if step.fetch == "all" else None


# ----------------------------------------------------------------------- async driver
async def arun(backend: Any, operation: Operation[T]) -> T:
    """Drive ``operation`` on an async backend: the same steps, awaited."""
    return await _atrampoline(operation, lambda step: _aperform(backend, step, None))


async def _atrampoline(
    operation: Generator[Step, Any, T], perform: Callable[[Step], Awaitable[Any]]
) -> T:
    send: Callable[[Any], Step] = operation.send
    reply: Any = None
    while True:
        try:
            step = send(reply)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            reply, send = await perform(step), operation.send
        except Exception as exc:  # thrown back in at the yield, where it may be caught
            reply, send = exc, operation.throw


async def _aperform(backend: Any, step: Step, cursor: Any) -> Any:
    if isinstance(step, Unit):
        async with getattr(backend, step.kind)() as cur:
            return await _atrampoline(step.body, lambda inner: _aperform(backend, inner, cur))
    if isinstance(step, Pipeline):
        return await backend.all_rows(step.statements)
    if isinstance(step, Retry):
        return await acall_with_retry(lambda: arun(backend, step.make()), named=step.make)
    if cursor is None:
        raise RuntimeError(f"{type(step).__name__} outside of any unit")
    if isinstance(step, ExecuteMany):
        await cursor.executemany(step.sql, step.params)
        return None
    await cursor.execute(step.sql, step.params)
    if step.fetch == "one":
        return await cursor.fetchone()
    return await cursor.fetchall() if step.fetch == "all" else None


__all__ = [
    "Execute",
    "ExecuteMany",
    "Operation",
    "Pipeline",
    "Retry",
    "Step",
    "Unit",
    "arun",
    "in_order",
    "nothing",
    "read",
    "run",
    "within",
]

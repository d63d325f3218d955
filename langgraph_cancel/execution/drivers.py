"""The two ways a call's protocol runs: blocking (a sync graph) and on an event loop.

Both answer the same steps (``steps.py``); they differ in how they wait.

``SyncDriver`` runs the handler in the calling thread. Inside a sync
``EffectToolNode`` a side effect runs in the batch's worker thread while the
node's thread supervises it (``nodes/supervision.py``), and the node's thread
watches its pooled reads; on its own (``create_agent``'s tool node) the driver
watches itself, with the call in a helper thread, so that a cancelled run can
stop waiting for a call that outlives its grace.

``AsyncDriver`` runs the handler as a task on the graph's loop and waits for it
while it watches the cancel signal. When its own task is cancelled (a server's
``runs.cancel``, a disconnect), it waits for the call in flight within its grace,
shielded, and hands the protocol what it found (``DispatchCancelled``); the
protocol's last ledger writes then run shielded too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_cancel.checkpointers.durable import await_plan, wait_for_plan
from langgraph_cancel.effects import bound_idempotency_key
from langgraph_cancel.errors import BatchSuperseded
from langgraph_cancel.execution.batch import Batch
from langgraph_cancel.execution.drive import acall_ledger, adrive, call_ledger, drive, see_through
from langgraph_cancel.execution.group import AsyncGroupCommit, ThreadGroupCommit
from langgraph_cancel.execution.settlement import (
    mark_never_sent,
    mark_unknown,
    record_late_outcome,
    stop_running,
)
from langgraph_cancel.execution.steps import (
    Abandoned,
    AwaitPlanSaved,
    CancelCheck,
    Dispatch,
    DispatchCancelled,
    GroupWrite,
    IntentWrite,
    IntentWriteCancelled,
    LedgerCall,
    Observe,
    Pause,
    PlanWaitCancelled,
    Protocol,
    Reconcile,
    SettleWhenReturned,
    Step,
    StoppedWaiting,
)
from langgraph_cancel.execution.supervision import InFlight
from langgraph_cancel.hooks import call_reconcile, run_sync
from langgraph_cancel.offloop import off_the_loop
from langgraph_cancel.process import CALL_THREADS
from langgraph_cancel.runtime import RunScope, current_scope
from langgraph_cancel.types import EffectRecord

logger = logging.getLogger("langgraph_cancel.tools")

T = TypeVar("T")
#: How often a wait looks at the cancel signal while a call is in flight.
POLL_SECONDS = 0.05

SyncHandler = Callable[[ToolCallRequest], Any]
AsyncHandler = Callable[[ToolCallRequest], Awaitable[Any]]


class SyncDriver:
    """Answers a protocol's steps with blocking calls.

    Args:
        scope: The run.
        batch: The call's batch (its supervisor, if any).
        handler: ``ToolNode``'s execution of a request.
        watch: Whether this driver watches the cancel signal itself while a call
            runs (a call on its own); inside a node's phases the node watches.
    """

    def __init__(self, scope: RunScope, batch: Batch, handler: SyncHandler, *, watch: bool) -> None:
        self.scope = scope
        self.batch = batch
        self.handler = handler
        self.watch = watch

    def run(self, protocol: Protocol[T]) -> T:
        """The protocol's answer (its I/O off an event loop that runs in this thread)."""
        answer: T = off_the_loop(drive, protocol, self.answer)
        return answer

    def answer(self, step: Step[Any]) -> Any:
        """One step's answer."""
        scope = self.scope
        if isinstance(step, LedgerCall):
            return call_ledger(scope.ledger, step)
        if isinstance(step, IntentWrite):
            return self.answer(step.write)
        if isinstance(step, CancelCheck):
            return scope.cancel_called()
        if isinstance(step, Observe):
            scope.signal.observe()
            return None
        if isinstance(step, Dispatch):
            return self._dispatch(step)
        if isinstance(step, GroupWrite):
            group = step.group
            assert isinstance(group, ThreadGroupCommit)
            return group.write(step.request)
        if isinstance(step, Reconcile):
            return run_sync(call_reconcile(step.spec, step.key, step.args))
        if isinstance(step, AwaitPlanSaved):
            wait_for_plan(step.config, step.timeout)
            return None
        if isinstance(step, Pause):
            time.sleep(step.seconds)
            return None
        if isinstance(step, SettleWhenReturned):
            _settle_when_returned(scope, step)
            return None
        raise TypeError(f"unknown step {type(step).__name__}")

    def _dispatch(self, step: Dispatch) -> Any:
        supervisor = self.batch.supervisor
        if supervisor is not None and step.record is not None:
            return self._supervised(step)
        if self.watch and (step.abandon or step.record is not None):
            return self._watched(step)
        return _call(self.handler, step, self.scope)

    def _supervised(self, step: Dispatch) -> Any:
        """A side effect in the batch's worker, while the node's thread supervises it."""
        supervisor = self.batch.supervisor
        rec, spec = step.record, step.spec
        assert supervisor is not None and rec is not None and spec is not None
        scope = self.scope
        grace = step.grace
        call = InFlight(
            scope=scope,
            grace=grace,
            give_up=lambda: mark_unknown(
                scope.ledger, rec, spec, str(StoppedWaiting(grace or 0.0, None))
            ),
            record=rec,
        )
        try:
            supervisor.begin(call)
        except BatchSuperseded:
            # Stopped between the intent and the call: it never left the process.
            mark_never_sent(scope.ledger, rec, scope.owner, "the batch was stopped")
            raise
        try:
            output = _call(self.handler, step, scope)
        except BaseException as exc:
            if supervisor.end(call):
                raise BatchSuperseded("gave up on the call in flight") from exc  # stays unknown
            raise
        if supervisor.end(call):
            record_late_outcome(scope.ledger, rec, scope.owner, output)
            raise BatchSuperseded("gave up on the call in flight")
        return output

    def _watched(self, step: Dispatch) -> Any:
        """The call in a helper thread, the wait here, with an eye on the cancel signal."""
        context = contextvars.copy_context()
        future = CALL_THREADS.get().submit(context.run, _call, self.handler, step, self.scope)
        deadline: float | None = None
        while True:
            # wait(), not result(timeout): a tool may raise TimeoutError itself.
            concurrent.futures.wait((future,), timeout=POLL_SECONDS)
            if future.done():
                return future.result()
            if deadline is None and self.scope.cancel_called():
                self.scope.signal.observe()
                if step.abandon:
                    future.cancel()
                    raise Abandoned
                if step.record is not None:
                    self.scope.await_effect(step.record, step.grace)
                deadline = time.monotonic() + (math.inf if step.grace is None else step.grace)
            if deadline is not None and time.monotonic() >= deadline:
                raise StoppedWaiting(step.grace or 0.0, future)


class AsyncDriver:
    """Answers a protocol's steps on the graph's event loop.

    Args:
        scope: The run.
        batch: The call's batch.
        handler: ``ToolNode``'s async execution of a request.
        cancel_timeout: Seconds a cancelled task still waits for a call in flight
            (a tool's own ``cancel_timeout`` wins).
    """

    def __init__(
        self, scope: RunScope, batch: Batch, handler: AsyncHandler, *, cancel_timeout: float
    ) -> None:
        self.scope = scope
        self.batch = batch
        self.handler = handler
        self.cancel_timeout = cancel_timeout
        #: Set once this task was cancelled during a call: every later step is shielded.
        self.cancelled = False

    async def run(self, protocol: Protocol[T]) -> T:
        """The protocol's answer."""
        return await adrive(protocol, self.answer)

    async def answer(self, step: Step[Any]) -> Any:
        """One step's answer (shielded once the task was cancelled)."""
        if self.cancelled and not isinstance(step, Dispatch):
            return await asyncio.shield(self._answer(step))
        if isinstance(step, LedgerCall | GroupWrite):
            return await self._ledger_step(step)
        return await self._answer(step)

    async def _ledger_step(self, step: LedgerCall[Any] | GroupWrite) -> Any:
        """A ledger read or write, to its end even if the run's task is cancelled
        meanwhile; then the cancel goes on, the stop noted first.

        Cut short, a write may still commit (its thread runs on) or be cancelled on
        the server: either way the run would not know what the ledger holds (a call's
        outcome lost, say, and the stop waiting for a call long returned).
        """
        done, cancelled = await see_through(self._ledger_work(step))
        if cancelled:
            await self._task_cancelled()
            raise asyncio.CancelledError from (None if done.cancelled() else done.exception())
        return done.result()

    def _ledger_work(self, step: Step[Any]) -> Awaitable[Any]:
        """A ledger step's answer, to await: a group write joins its group at once
        (``AsyncGroupCommit.submit``), before its call counts as finished."""
        if isinstance(step, GroupWrite):
            group = step.group
            assert isinstance(group, AsyncGroupCommit)
            return group.submit(step.request)
        return self._answer(step)

    async def _task_cancelled(self) -> None:
        """The run's task was cancelled: every later step is shielded, and the stop is
        noted (``RunScope.atask_cancelled``)."""
        self.cancelled = True
        await self.scope.atask_cancelled()

    async def _answer(self, step: Step[Any]) -> Any:
        scope = self.scope
        if isinstance(step, LedgerCall):
            return await acall_ledger(scope.ledger, step)
        if isinstance(step, IntentWrite):
            return await self._write_intent(step)
        if isinstance(step, CancelCheck):
            if scope.run_task_cancelled():
                # The run's task was cancelled and the cancel was caught before it
                # reached this node (LangGraph waits out the step's save): a stop.
                await scope.atask_cancelled()
                return True
            return await scope.signal.acancel_called()
        if isinstance(step, Observe):
            await scope.signal.aobserve()
            return None
        if isinstance(step, Dispatch):
            return await self._dispatch(step)
        if isinstance(step, GroupWrite):
            return await self._ledger_work(step)
        if isinstance(step, Reconcile):
            return await call_reconcile(step.spec, step.key, step.args)
        if isinstance(step, AwaitPlanSaved):
            try:
                await await_plan(step.config, step.timeout)
            except asyncio.CancelledError:
                # The run's task was cancelled (a server's runs.cancel) before the call
                # left: a stop like any other, and what the call writes next is shielded.
                await self._task_cancelled()
                raise PlanWaitCancelled from None
            return None
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            return None
        if isinstance(step, SettleWhenReturned):
            _settle_when_returned(scope, step)
            return None
        raise TypeError(f"unknown step {type(step).__name__}")

    async def _write_intent(self, step: IntentWrite[Any]) -> Any:
        """The intent write, to its end even if the run's task is cancelled meanwhile.

        Cut short, a write may still commit (its statement left, or its thread runs
        on), leaving a call ``dispatched`` that never went: so it is seen through, and
        then ``IntentWriteCancelled`` tells the protocol what it wrote.
        """
        write, cancelled = await see_through(self._ledger_work(step.write))
        if not cancelled:
            return write.result()
        await self._task_cancelled()
        if write.cancelled():
            raise IntentWriteCancelled() from None
        error = write.exception()
        if error is not None:
            raise IntentWriteCancelled(error=error) from error
        raise IntentWriteCancelled(write.result()) from None

    async def _dispatch(self, step: Dispatch) -> Any:
        task = asyncio.ensure_future(_acall(self.handler, step, self.scope))
        try:
            return await self._wait(task, step)
        except asyncio.CancelledError:
            # The run's task was cancelled (a server's runs.cancel, a disconnect): a stop
            # like any other, raised for the whole run before anything else.
            if step.record is None:
                self.scope.signal.set()
                task.cancel()  # a read: nothing outside changes, nothing to wait for
                raise
            await self._task_cancelled()
            spec = step.spec
            wait = (spec.cancel_timeout if spec is not None else None) or self.cancel_timeout
            self.scope.await_effect(step.record, wait)
            done, _ = await asyncio.wait({task}, timeout=wait)
            if not done:
                raise DispatchCancelled(finished=False, pending=task) from None
            error = task.exception()
            raise DispatchCancelled(
                finished=True, output=None if error else task.result(), error=error
            ) from None

    async def _wait(self, task: asyncio.Future[Any], step: Dispatch) -> Any:
        """Wait for the call, noting the cancel signal the moment it arrives.

        A side effect has left the process: the wait goes on after a cancel for its
        grace (``None``: until the end), then ``StoppedWaiting`` is raised and the
        call keeps running. A read that may be abandoned is, at once.
        """
        signal = self.scope.signal
        deadline: float | None = None
        while not task.done():
            await asyncio.wait({task}, timeout=POLL_SECONDS)
            if task.done():
                break
            if deadline is None and await signal.acancel_called():
                await signal.aobserve()
                if step.abandon:
                    task.cancel()
                    raise Abandoned
                if step.record is not None:
                    self.scope.await_effect(step.record, step.grace)
                deadline = time.monotonic() + (math.inf if step.grace is None else step.grace)
            if deadline is not None and time.monotonic() >= deadline:
                raise StoppedWaiting(step.grace or 0.0, task)
        return await task


def _call(handler: SyncHandler, step: Dispatch, scope: RunScope) -> Any:
    """The handler on the step's request, with the call's key and run in reach of the tool."""
    token = current_scope.set(scope)
    try:
        key = step.record.idempotency_key if step.record is not None else step.key
        if key is None:
            return handler(step.request)
        with bound_idempotency_key(key):
            return handler(step.request)
    finally:
        current_scope.reset(token)


async def _acall(handler: AsyncHandler, step: Dispatch, scope: RunScope) -> Any:
    token = current_scope.set(scope)
    try:
        key = step.record.idempotency_key if step.record is not None else step.key
        if key is None:
            return await handler(step.request)
        with bound_idempotency_key(key):
            return await handler(step.request)
    finally:
        current_scope.reset(token)


def _settle_when_returned(scope: RunScope, step: SettleWhenReturned) -> None:
    """When the call comes back, record its outcome (off any event loop) and end it."""
    rec: EffectRecord = step.record

    def returned(done: Any) -> None:
        try:
            if done.cancelled() or done.exception() is not None:
                return  # still unknown: reconciliation (or a person) settles it
            threading.Thread(
                target=record_late_outcome,
                args=(scope.ledger, rec, step.actor, done.result()),
                name="langgraph-cancel-late",
                daemon=True,
            ).start()
        finally:
            stop_running(rec.effect_id)

    step.pending.add_done_callback(returned)


__all__ = ["POLL_SECONDS", "AsyncDriver", "SyncDriver"]

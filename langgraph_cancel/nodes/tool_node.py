"""``EffectToolNode``: LangGraph's ``ToolNode`` that never dispatches an effect twice.

It is ``ToolNode`` with the effect interceptor (``execution/interceptor.py``) on its
own tool-call seam, inside a ``wrap_tool_call`` of yours if you give one (yours
outermost), so that everything a call goes through (error handling and its
defaults, injection of state, store and runtime, ``Command`` outputs, a tool's own
``interrupt()``, wrapper-served tools) is ``ToolNode``'s own.

What needs the whole batch is this node's: the order (read-only calls first,
concurrently; then reversible, then irreversible ones, one at a time unless
``effect_concurrency`` says otherwise: ``execution/schedule.py``), and the batch's
ledger writes (one read and one planning write before the calls, carrying the
intents of the calls to go first, outcomes folded into the next intents, the
reads' outcomes written together: ``execution/batch.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from langchain_core.messages import AnyMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ContextThreadPoolExecutor, get_config_list
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolRuntime
from langgraph.runtime import Runtime
from pydantic import BaseModel

from langgraph_cancel.checkpointers.durable import PLAN_SAVE_TIMEOUT
from langgraph_cancel.effects import EffectSpec, spec_of
from langgraph_cancel.execution.answers import ABANDONED_READ
from langgraph_cancel.execution.batch import Batch
from langgraph_cancel.execution.call_lease import CALL_LEASES, call_lease_owner
from langgraph_cancel.execution.drive import adrive_ledger, despite_cancel, drive_ledger
from langgraph_cancel.execution.group import AsyncGroupCommit, ThreadGroupCommit
from langgraph_cancel.execution.identity import as_tool_call, history_of
from langgraph_cancel.execution.interceptor import (
    DEFAULT_CANCEL_TIMEOUT,
    Carried,
    EffectInterceptor,
    compose_async,
    compose_sync,
)
from langgraph_cancel.execution.plan import CallPlan
from langgraph_cancel.execution.schedule import (
    Phases,
    answer_copies,
    concurrency_limit,
    goes_at_once,
    sort_calls,
    to_begin,
    twins,
)
from langgraph_cancel.execution.served import Classification, ServedEffects, effect_seam
from langgraph_cancel.execution.supervision import InFlight, Supervisor, supervise
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.runtime import RunScope
from langgraph_cancel.types import CancelPolicy, EffectStatus

logger = logging.getLogger("langgraph_cancel.tools")

InputType = Literal["list", "dict", "tool_calls"]
HandleToolErrors = bool | str | Callable[..., str] | type[Exception] | tuple[type[Exception], ...]

#: ``ToolNode``'s own default for ``handle_tool_errors`` (invalid arguments become a
#: message for the model; a tool's own exception propagates).
TOOLNODE_HANDLE_TOOL_ERRORS: Any = (
    inspect.signature(ToolNode.__init__).parameters["handle_tool_errors"].default
)
_READ_POLL = 0.05


def _abandon_reads(
    pending: set[concurrent.futures.Future[Any]],
    futures: dict[concurrent.futures.Future[Any], int],
    phases: Phases,
    outputs: list[Any],
    batch: Batch,
) -> set[concurrent.futures.Future[Any]]:
    """Give up the pending reads whose policy is ``abandon``; return them.

    Each is recorded failed as abandoned and answered so; its thread finishes on
    its own and its answer is never used.
    """
    abandoned: set[concurrent.futures.Future[Any]] = set()
    for future in pending:
        plan = phases.plans.get(futures[future])
        if plan is None or plan.spec.cancel_policy is not CancelPolicy.ABANDON:
            continue
        abandoned.add(future)
        future.cancel()
        drive_ledger(
            batch.scope.ledger,
            batch.note_read(
                plan,
                status=EffectStatus.FAILED,
                error=ABANDONED_READ,
                detail={"abandoned": True},
            ),
        )
        outputs[plan.index] = ToolMessage(
            ABANDONED_READ,
            name=plan.tool.name,
            tool_call_id=plan.call_id,
            status="error",
        )
    return abandoned


class EffectToolNode(ToolNode):
    """``ToolNode`` whose calls go through the effect protocol: none is dispatched twice.

    Swap it in for ``ToolNode``; it takes the same arguments plus a few of its own.

    Args:
        tools: Tools (``BaseTool`` or callables); classify them with ``effect(...)``.
            An unclassified tool counts as irreversible (one warning names it): it
            needs approval, asked where the call stands unless an ``ApprovalGate``
            decided before.
        name: Node name.
        tags: Tags for tracing.
        handle_tool_errors: As in ``ToolNode``, with ``ToolNode``'s default.
        messages_key: State key holding the messages.
        wrap_tool_call: As in ``ToolNode``; it wraps the ledger-guarded execution
            (yours is outermost: what it passes on is what the ledger records).
        awrap_tool_call: Async twin of ``wrap_tool_call``.
        ledger: The ledger (or its URL); default: it follows the checkpointer.
        effects: Classifications by tool name (``effect(...)`` as a decorator, or a
            kind) for tools no ``effect(...)`` decorated: ones your ``wrap_tool_call``
            serves, or ones given here undecorated.
        effect_concurrency: Side-effecting calls dispatched at once (default 1:
            plan order, so a cancel mid-batch costs nothing it need not). Above 1,
            each call still writes its intent before its dispatch, but the intents
            and outcomes of calls in flight together share round trips.
        cancel_timeout: Seconds an in-flight side-effecting call may take to
            finish once its run is cancelled, before it is recorded unknown.
        checkpoint_timeout: Seconds a side-effecting call waits for the checkpoint
            of the step that asked for it (LangGraph may still be writing it, under
            the default ``durability="async"``) before it is refused with
            ``CheckpointNotSavedError``; nothing is dispatched then.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: HandleToolErrors = TOOLNODE_HANDLE_TOOL_ERRORS,
        messages_key: str = "messages",
        wrap_tool_call: Any = None,
        awrap_tool_call: Any = None,
        ledger: Ledger | str | None = None,
        effects: Mapping[str, Classification] | None = None,
        effect_concurrency: int = 1,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
        checkpoint_timeout: float = PLAN_SAVE_TIMEOUT,
    ) -> None:
        if effect_concurrency < 1:
            raise ValueError("effect_concurrency must be at least 1")
        self.interceptor = EffectInterceptor(
            ledger=ledger,
            cancel_timeout=cancel_timeout,
            checkpoint_timeout=checkpoint_timeout,
            capture=bool(handle_tool_errors)
            and handle_tool_errors is not TOOLNODE_HANDLE_TOOL_ERRORS,
            carry_ledger_errors=True,
            carry_tool_errors=wrap_tool_call is None and awrap_tool_call is None,
        )
        self.served = served = ServedEffects(effects)
        guarded, aguarded = effect_seam(self.interceptor, served)
        # ToolNode calls a sync wrapper from its async path when it has no async one;
        # so does this node, for a sync wrapper of yours.
        async_wrapper = (
            compose_async(awrap_tool_call, aguarded)
            if awrap_tool_call is not None or wrap_tool_call is None
            else None
        )
        super().__init__(
            [served.classify(tool) if isinstance(tool, BaseTool) else tool for tool in tools],
            name=name,
            tags=tags,
            handle_tool_errors=handle_tool_errors,
            messages_key=messages_key,
            wrap_tool_call=compose_sync(wrap_tool_call, guarded),
            awrap_tool_call=async_wrapper,
        )
        #: Whether a wrapper of the user's may rewrite calls: the batch then plans
        #: nothing ahead (each call is recorded as it reaches the interceptor).
        self.wrapped = wrap_tool_call is not None or awrap_tool_call is not None
        #: The state key of the messages (ToolNode keeps it privately).
        self.history_key = messages_key
        self.ledger = ledger
        self.effect_concurrency = effect_concurrency
        self.cancel_timeout = cancel_timeout
        self.checkpoint_timeout = checkpoint_timeout
        self.specs: dict[str, EffectSpec] = {
            tool_name: spec_of(tool) for tool_name, tool in self.tools_by_name.items()
        }

    # ------------------------------------------------------------ LangGraph
    def _func(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        tool_calls, input_type = self._parse_input(input)
        calls = [as_tool_call(call) for call in tool_calls]
        scope = self.interceptor.scope(config)
        batch = Batch(scope, defer=True)
        config = batch.attach(config)
        runtimes = self._runtimes(input, config, runtime, calls)
        phases = self._sort(calls, scope, history_of(input, self.history_key))
        owner = call_lease_owner(scope, config) if phases.effects else None
        with CALL_LEASES.holding(scope, owner):
            if not self.wrapped:
                self._prepare(batch, phases, config)
            outputs: list[Any] = [None] * len(calls)
            try:
                if phases.reads:
                    self._reads(phases, calls, runtimes, input_type, outputs, batch)
                if phases.effects:
                    self._effects(phases, calls, runtimes, input_type, outputs, batch, config)
            except Carried as failure:
                raise failure.error from failure.error.__cause__
        return self._combine_tool_outputs(outputs, input_type)

    async def _afunc(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        tool_calls, input_type = self._parse_input(input)
        calls = [as_tool_call(call) for call in tool_calls]
        scope = await self.interceptor.ascope(config)
        batch = Batch(scope, defer=True)
        config = batch.attach(config)
        runtimes = self._runtimes(input, config, runtime, calls)
        phases = self._sort(calls, scope, history_of(input, self.history_key))
        owner = call_lease_owner(scope, config) if phases.effects else None
        async with CALL_LEASES.aholding(scope, owner):
            return await self._arun_batch(batch, phases, calls, runtimes, input_type, config)

    async def _arun_batch(
        self,
        batch: Batch,
        phases: Phases,
        calls: list[ToolCall],
        runtimes: list[ToolRuntime[Any, Any]],
        input_type: Literal["list", "dict", "tool_calls"],
        config: RunnableConfig,
    ) -> Any:
        """``_afunc``'s batch, planned, run and answered."""
        scope = batch.scope
        outputs: list[Any] = [None] * len(calls)
        try:
            if not self.wrapped:
                await self._aprepare(batch, phases, config)
            if phases.reads:
                try:
                    answers = await asyncio.gather(
                        *(
                            self._arun_one(calls[index], input_type, runtimes[index])
                            for index in phases.reads
                        )
                    )
                finally:
                    await despite_cancel(adrive_ledger(scope.ledger, batch.flush_reads()))
                for index, answer in zip(phases.reads, answers, strict=True):
                    outputs[index] = answer
            if phases.effects:
                await self._aeffects(phases, calls, runtimes, input_type, outputs, batch, config)
        except Carried as failure:
            raise failure.error from failure.error.__cause__
        except asyncio.CancelledError:
            if batch.begun:
                await despite_cancel(self._aabandon_begun(batch))
            raise
        return self._combine_tool_outputs(outputs, input_type)

    @staticmethod
    async def _aabandon_begun(batch: Batch) -> None:
        """The run's task was cancelled (a server's ``runs.cancel``) before calls whose
        intents went with the plan were taken by their dispatch: none of them left, so
        each is recorded never sent, after the stop is noted."""
        scope = batch.scope
        await scope.atask_cancelled()
        await adrive_ledger(scope.ledger, batch.abandon_begun("the run's task was cancelled"))

    # ------------------------------------------------------------- batches
    def _runtimes(
        self, input: Any, config: RunnableConfig, runtime: Runtime[Any], calls: list[ToolCall]
    ) -> list[ToolRuntime[Any, Any]]:
        """One ``ToolRuntime`` per call, built as ``ToolNode`` builds them."""
        runtimes: list[ToolRuntime[Any, Any]] = []
        for call, call_config in zip(calls, get_config_list(config, len(calls)), strict=False):
            runtimes.append(
                ToolRuntime(
                    state=self._extract_state(input, call_config),
                    tool_call_id=call["id"],
                    config=call_config,
                    context=runtime.context,
                    store=runtime.store,
                    stream_writer=runtime.stream_writer,
                    tools=list(self.tools_by_name.values()),
                    execution_info=runtime.execution_info,
                    server_info=runtime.server_info,
                )
            )
        return runtimes

    def _sort(self, calls: list[ToolCall], scope: RunScope, history: Sequence[Any]) -> Phases:
        """The batch's phases (``schedule.sort_calls``) for this node's tools."""
        return sort_calls(
            calls,
            tools_by_name=self.tools_by_name,
            specs=self.specs,
            wrapped=self.wrapped,
            thread_id=scope.thread_id,
            history=history,
        )

    def _prepare(self, batch: Batch, phases: Phases, config: RunnableConfig) -> None:
        """The batch planned (``Batch.prepare``), with the intents of the side effects to
        go out first when they may and the run is not stopped.

        The write does not wait for the step's checkpoint: LangGraph saves it while
        this step runs, and the two commits overlap. A begun call goes out only once
        that checkpoint is saved and the stop checked again (``dispatch``).
        """
        scope = batch.scope
        begin = self._to_begin(phases, config, scope)
        if begin and scope.cancel_called():
            begin = []
        drive_ledger(scope.ledger, batch.prepare(*phases.planned(), begin=begin))

    async def _aprepare(self, batch: Batch, phases: Phases, config: RunnableConfig) -> None:
        """``_prepare`` on the event loop."""
        scope = batch.scope
        begin = self._to_begin(phases, config, scope)
        if begin and await scope.signal.acancel_called():
            begin = []
        # A cancel of the run's task must not cut the write short: the calls it begins
        # are known only once it has answered, and are then recorded never sent.
        await despite_cancel(
            adrive_ledger(scope.ledger, batch.prepare(*phases.planned(), begin=begin))
        )

    def _to_begin(self, phases: Phases, config: RunnableConfig, scope: RunScope) -> list[CallPlan]:
        """The side effects whose intents go with the batch's plan (``schedule.to_begin``)."""
        return to_begin(phases, config, self.effect_concurrency, limited=scope.limits is not None)

    def _reads(
        self,
        phases: Phases,
        calls: list[ToolCall],
        runtimes: list[ToolRuntime[Any, Any]],
        input_type: InputType,
        outputs: list[Any],
        batch: Batch,
    ) -> None:
        """A sync graph's reads: concurrently in a pool, as ``ToolNode`` runs its calls.

        The wait checks the cancel signal; on cancel, reads that may be abandoned are
        (their threads finish on their own, their answers unused), the others are
        waited for.
        """
        scope = batch.scope
        limit = runtimes[0].config.get("max_concurrency") if runtimes else None
        pool = ContextThreadPoolExecutor(max_workers=limit)
        failure: BaseException | None = None  # raised once every other outcome is kept
        try:
            futures = {
                pool.submit(self._run_one, calls[index], input_type, runtimes[index]): index
                for index in phases.reads
            }
            pending = set(futures)
            observed = False
            while pending:
                _done, pending = concurrent.futures.wait(pending, timeout=_READ_POLL)
                if pending and not observed and scope.cancel_called():
                    observed = True
                    scope.signal.observe()
                    pending -= _abandon_reads(pending, futures, phases, outputs, batch)
            for future, index in futures.items():
                if outputs[index] is not None:
                    continue
                error = future.exception()
                if error is not None:
                    failure = failure or error
                else:
                    outputs[index] = future.result()
        finally:
            pool.shutdown(wait=False)  # an abandoned read's thread ends on its own
            drive_ledger(scope.ledger, batch.flush_reads())
        if failure is not None:
            raise failure

    def _effects(
        self,
        phases: Phases,
        calls: list[ToolCall],
        runtimes: list[ToolRuntime[Any, Any]],
        input_type: InputType,
        outputs: list[Any],
        batch: Batch,
        config: RunnableConfig,
    ) -> None:
        """A sync graph's side effects: one at a time in a supervised worker, or at once."""
        ledger = batch.scope.ledger
        if goes_at_once(phases, config, self.effect_concurrency):
            self._effects_at_once(phases, calls, runtimes, input_type, outputs, batch, config)
            return
        order, copies = twins(phases, calls)
        supervisor = Supervisor()
        batch.supervisor = supervisor

        def work() -> None:
            for index in order:
                supervisor.check()
                outputs[index] = self._run_one(calls[index], input_type, runtimes[index])

        def take_over(_call: InFlight) -> None:
            # Given up on a call (recorded unknown), this thread finishes the batch as
            # after a crash: recorded answers are replayed, the calls behind it dropped.
            batch.supervisor = None
            for index in order:
                if outputs[index] is None:
                    outputs[index] = self._run_one(calls[index], input_type, runtimes[index])

        try:
            supervise(work, take_over, supervisor)
        finally:
            drive_ledger(ledger, batch.flush_outcome())
        answer_copies(outputs, copies)

    def _effects_at_once(
        self,
        phases: Phases,
        calls: list[ToolCall],
        runtimes: list[ToolRuntime[Any, Any]],
        input_type: InputType,
        outputs: list[Any],
        batch: Batch,
        config: RunnableConfig,
    ) -> None:
        group = ThreadGroupCommit(batch.scope.ledger)
        batch.group, batch.defer = group, False
        unique, copies = twins(phases, calls)
        limit = concurrency_limit(config, self.effect_concurrency)
        with ContextThreadPoolExecutor(max_workers=limit) as pool:

            def run(index: int) -> Any:
                group.got_slot()
                return self._run_one(calls[index], input_type, runtimes[index])

            group.waits_for_slot(len(unique))
            futures = [(index, pool.submit(run, index)) for index in unique]
            for index, future in futures:
                outputs[index] = future.result()
        answer_copies(outputs, copies)

    async def _aeffects(
        self,
        phases: Phases,
        calls: list[ToolCall],
        runtimes: list[ToolRuntime[Any, Any]],
        input_type: InputType,
        outputs: list[Any],
        batch: Batch,
        config: RunnableConfig,
    ) -> None:
        ledger = batch.scope.ledger
        unique, copies = twins(phases, calls)
        if not goes_at_once(phases, config, self.effect_concurrency):
            try:
                for index in unique:
                    outputs[index] = await self._arun_one(calls[index], input_type, runtimes[index])
            finally:
                # The last call's outcome: whole, even if the run's task is cancelled now.
                await despite_cancel(adrive_ledger(ledger, batch.flush_outcome()))
            answer_copies(outputs, copies)
            return
        group = AsyncGroupCommit(ledger)
        batch.group, batch.defer = group, False
        limit = concurrency_limit(config, self.effect_concurrency)
        slots = asyncio.Semaphore(limit)

        async def bounded(index: int) -> Any:
            with group.queued():
                await slots.acquire()
            try:
                return await self._arun_one(calls[index], input_type, runtimes[index])
            finally:
                slots.release()

        answers = await asyncio.gather(*(bounded(index) for index in unique))
        for index, answer in zip(unique, answers, strict=True):
            outputs[index] = answer
        answer_copies(outputs, copies)


__all__ = ["TOOLNODE_HANDLE_TOOL_ERRORS", "Classification", "EffectToolNode", "ServedEffects"]

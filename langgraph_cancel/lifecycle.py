"""A run's lifecycle: each invocation of a compiled graph is one scoped, leased, closable run.

``CancellableGraph.stream`` / ``astream`` open an ``Invocation`` (the run's scope,
its lease and heartbeat, its limits), run the graph inside it, tell how the
invocation ended (a ``RunEnding``) and close the run accordingly:

- ``completed``: the graph ran to its end; the run is closed ``completed``;
- ``paused``: it stopped at an interrupt; the run goes on later;
- ``cancelled``: the cancel node finished the stop and drained the graph;
- ``interrupted``: the run's task was cancelled (a server's ``runs.cancel``, a
  client disconnect, Ctrl-C): recorded as a stop request, and the stop finished
  from the ledger;
- ``empty``: LangGraph refused the invocation before its first step;
- ``failed``: it raised; the run stays live, to be resumed like a crash.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, Self, cast

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config, merge_configs, var_child_runnable_config
from langgraph.callbacks import GraphCallbackHandler, GraphInterruptEvent
from langgraph.errors import EmptyInputError, GraphDrained
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl
from langgraph.types import Command

from langgraph_cancel.errors import IllegalTransitionError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import async_twin_of
from langgraph_cancel.ledger.flush import commit_before_flush
from langgraph_cancel.limits import LimitGuard
from langgraph_cancel.nodes.cancel import DRAIN_REASON, finalize_cancel
from langgraph_cancel.nodes.settings import CancellationSettings
from langgraph_cancel.runtime import (
    CONFIG_KEY_LEDGER,
    INTERRUPTED_REASON,
    LEASES,
    RunScope,
    ascope_for,
    check_durability,
    current_scope,
    drop_scope,
    scope_for,
    worker_id,
)
from langgraph_cancel.runtime.config import CONFIG_KEY_WORKER
from langgraph_cancel.thread_state import ThreadState
from langgraph_cancel.types import RunStatus

logger = logging.getLogger("langgraph_cancel.graph")

#: Seconds of an invocation's lease on its thread (renewed by its heartbeat).
LEASE_TTL = 30.0


class RunEnding(str, Enum):
    """How one invocation of a run ended, which decides how the run is closed."""

    COMPLETED = "completed"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    EMPTY = "empty"
    FAILED = "failed"


RunEndingLiteral = Literal["completed", "paused", "cancelled", "interrupted", "empty", "failed"]

#: What stops a sync run from outside: Ctrl-C.
SYNC_STOPS: tuple[type[BaseException], ...] = (KeyboardInterrupt,)
#: What stops an async run from outside: its task cancelled, or Ctrl-C.
ASYNC_STOPS: tuple[type[BaseException], ...] = (asyncio.CancelledError, KeyboardInterrupt)


def ending_of(exc: BaseException, stops: tuple[type[BaseException], ...]) -> RunEnding:
    """How an invocation that raised ``exc`` ended; ``stops``: what counts as a stop."""
    if isinstance(exc, GraphDrained):
        return RunEnding.CANCELLED if exc.reason == DRAIN_REASON else RunEnding.FAILED
    if isinstance(exc, stops):
        return RunEnding.INTERRUPTED
    if isinstance(exc, EmptyInputError):
        return RunEnding.EMPTY
    return RunEnding.FAILED


class PauseWatch(GraphCallbackHandler):
    """Notes that the invocation paused at an interrupt (LangGraph's lifecycle event).

    A run whose stream returned without one ran to its end: no ``get_state`` needed
    to tell a completed run from a paused one.
    """

    run_inline = True
    # Only the graph's lifecycle events matter here: skip every other callback.
    ignore_chain = ignore_llm = ignore_chat_model = ignore_retriever = True
    ignore_agent = ignore_retry = ignore_custom_event = True

    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.run_id: str | None = None

    def on_interrupt(self, event: GraphInterruptEvent) -> None:
        """The graph paused: its run goes on later.

        A graph invoked from inside one of this graph's nodes inherits the handler;
        its pauses are its own (``run_id`` tells them apart).
        """
        if str(event.run_id) == self.run_id:
            self.paused = True


@dataclass(frozen=True, slots=True)
class RunStart:
    """What an invocation's run starts from: its ledger, owner and kind of input."""

    bound: Ledger | str | None
    owner: str
    new_run: bool
    run_id: str | None

    @classmethod
    def of(cls, graph: CancellableGraph, input: Any, config: RunnableConfig) -> RunStart:
        """The start of ``graph``'s run for ``input`` under ``config``."""
        conf = config.get("configurable", {})
        bound = graph.cancellation.ledger
        if bound is None and isinstance(getattr(graph.checkpointer, "ledger", None), Ledger):
            bound = graph.checkpointer.ledger  # type: ignore[union-attr]
        # A continuation (no input, or a Command) goes on with the thread's last run.
        continuation = input is None or isinstance(input, Command)
        return cls(
            bound=bound,
            owner=str(conf.get(CONFIG_KEY_WORKER) or worker_id()),
            new_run=not continuation,
            run_id=conf.get("run_id"),
        )


class Invocation:
    """One invocation's run scope, lease and heartbeat."""

    def __init__(
        self,
        graph: CancellableGraph,
        input: Any,
        config: RunnableConfig,
        scope: RunScope | None = None,
    ) -> None:
        self.graph = graph
        self.config = config
        self.settings = graph.cancellation
        check_durability(config)
        start = RunStart.of(graph, input, config)
        self.scope = scope or scope_for(
            config,
            ledger=start.bound,
            new_run=start.new_run,
            run_id=start.run_id,
            owner=start.owner,
            lease_ttl=LEASE_TTL,
            # New input passes START's router first: its ledger read rides along.
            prefetch_unsettled=start.new_run,
        )
        self.ledger = self.scope.ledger
        self.owner = start.owner
        self._released = False
        self._lease = LEASES.hold(self.ledger, self.scope.thread_id, self.owner, ttl=LEASE_TTL)
        self.token = current_scope.set(self.scope)
        self.watch = PauseWatch()
        # An invocation nested in one of the run's nodes leaves the outer one's guard be.
        limits = self.settings.limits
        self._guarded = False
        if limits is not None and self.scope.limits is None and not self.scope.run.terminal:
            self.scope.enforce(LimitGuard(limits, self.ledger, self.scope.run))
            self._guarded = True
        self.state = ThreadState(graph, config, self.settings, self.scope)
        self._shown_cancelling = False
        self.scope.on_task_cancel = self._ashow_cancelling

    @classmethod
    async def aopen(cls, graph: CancellableGraph, input: Any, config: RunnableConfig) -> Self:
        """The invocation of an async run: its start awaited on the loop when the ledger
        has an async twin here (an async saver's), else made in a thread."""
        check_durability(config)
        # A saver of ours that learns its database on the loop knows its ledger once
        # set up; the run starts in that ledger, before LangGraph sets the saver up.
        prepare = getattr(graph.checkpointer, "aprepare_ledger", None)
        if prepare is not None:
            await prepare()
        start = RunStart.of(graph, input, config)
        twin = None
        if isinstance(start.bound, Ledger) and current_scope.get() is None:
            twin = async_twin_of(start.bound)
        if twin is None or not isinstance(start.bound, Ledger):
            return await asyncio.to_thread(cls, graph, input, config)
        scope = await ascope_for(
            config,
            twin,
            ledger=start.bound,
            new_run=start.new_run,
            run_id=start.run_id,
            owner=start.owner,
            lease_ttl=LEASE_TTL,
            prefetch_unsettled=start.new_run,
        )
        return cls(graph, input, config, scope)

    async def aend_completed(self) -> bool:
        """Close a run that ran to its end on the loop, through the ledger's async twin.

        True when this call closed it (and released the lease with it); False when
        the run needs the full ``end`` (no twin here, paused, asked to stop meanwhile).
        """
        twin = async_twin_of(self.ledger)
        if twin is None or self.graph.checkpointer is None or self.watch.paused:
            return False
        try:
            with commit_before_flush():  # see ``_complete``
                closed = await twin.afinish_run(
                    self.scope.run_id, RunStatus.COMPLETED, release_lease=self.owner
                )
        except IllegalTransitionError:
            return False
        if not closed:
            return False
        self._released = True
        self._forget()
        return True

    def _forget(self) -> None:
        """Leave the run's scope: no more the current one, its lease no more renewed."""
        try:
            current_scope.reset(self.token)
        except ValueError:  # ended from another context (generator closed elsewhere)
            current_scope.set(None)
        self.scope.unsettled_at_start = None  # read for this invocation only
        self.scope.on_task_cancel = None
        if self._guarded:
            self.scope.enforce(None)  # a paused run's deadline is checked again on resume
        LEASES.let_go(self._lease)

    async def _ashow_cancelling(self) -> None:
        await asyncio.to_thread(self._show_cancelling)

    def watching(self, config: RunnableConfig | None) -> RunnableConfig:
        """``config`` with the handler that sees the graph pause.

        Added to the callbacks the graph would inherit (a parent graph's, when
        invoked from inside one of its nodes), not in place of them.
        """
        out: dict[str, Any] = dict(config or {})
        # LangGraph's run id for this invocation (the caller's, when given): the
        # lifecycle events of this graph carry it.
        if out.get("run_id") is None:
            out["run_id"] = uuid.uuid4()
        self.watch.run_id = str(out["run_id"])
        # Not merge_configs: inside another graph's node it would fold that graph's
        # configurable (thread, namespace) into this one's.
        callbacks = out.get("callbacks")
        if callbacks is None:
            ambient = var_child_runnable_config.get() or {}
            callbacks = ambient.get("callbacks")
        if callbacks is None:
            out["callbacks"] = [self.watch]
        elif isinstance(callbacks, list):
            out["callbacks"] = [*callbacks, self.watch]
        else:
            manager = callbacks.copy()
            manager.add_handler(self.watch, inherit=True)
            out["callbacks"] = manager
        return cast(RunnableConfig, out)

    def end(self, ending: RunEnding) -> None:
        """Close the run as ``ending`` says; clear drained work; release the lease.

        ``INTERRUPTED``: the run's task was cancelled (a server's ``runs.cancel``,
        a client disconnect, Ctrl-C). That is a stop request too: it is recorded
        as one and the cancel is finished from the ledger (the graph state of
        the interrupted step is gone; the next invocation answers its calls).

        ``EMPTY``: LangGraph refused the invocation before its first step
        (``EmptyInputError``: no input and no checkpoint to resume). A failed
        invocation otherwise leaves its run live, to be resumed like a crash;
        a run with no checkpoint and no effect has nothing to resume, so it is
        closed ``failed`` instead of being left ``running`` forever.

        A stream that returned after the graph paused at an interrupt ended
        ``PAUSED``, not ``COMPLETED``: the run goes on later.
        """
        if ending is RunEnding.COMPLETED and self.watch.paused:
            ending = RunEnding.PAUSED
        self._forget()
        # Whether the thread's state is as the run's end leaves it: the graph's own
        # saves went through, and so did this end's writes to the state.
        settled = False
        try:
            written = True
            if ending is RunEnding.CANCELLED:
                written = self.state.clear_queue()
            if ending is RunEnding.INTERRUPTED:
                self._record_interruption()
                if not self._shown_cancelling:
                    self._show_cancelling()
            if ending is RunEnding.EMPTY:
                self._close_empty_run()
            elif ending is not RunEnding.FAILED:
                written = self._close_run(ending) and written
            settled = written and ending is not RunEnding.FAILED
        finally:
            try:
                if not self._released and not self._left_open(settled):
                    self.ledger.release_lease(self.scope.thread_id, self.owner)
            finally:
                drop_scope(self.scope)

    def _left_open(self, settled: bool) -> bool:
        """Whether the run is cancelled and its thread's state was not put right here.

        The cancel node's saves were lost (the invocation failed after the
        ``cancelled`` transition: the database went away, say), or this end's own
        write to the state failed: the thread is not closed. The lease is then kept,
        to expire unrenewed, and the sweeper that finds it closes the thread, as it
        does after a worker that died there. When the run cannot be read (the database
        is away), the lease is kept too: released, a cancelled run's open thread would
        be found by no sweeper, while a kept one costs other workers its TTL at most.
        """
        if settled:
            return False
        try:
            return self.ledger.get_run(self.scope.run_id).status is RunStatus.CANCELLED
        except Exception:
            logger.warning(
                "could not read run %s after it failed; its lease is kept to expire",
                self.scope.run_id,
                exc_info=True,
            )
            return True

    def _record_interruption(self) -> None:
        try:
            self.ledger.request_cancel(
                self.scope.thread_id,
                reason=INTERRUPTED_REASON,
                requested_by="runtime",
                cascade=True,
            )
        except Exception:
            logger.warning("could not record the interruption as a cancel", exc_info=True)

    def _show_cancelling(self) -> None:
        self._shown_cancelling = True
        self.state.show_cancelling()

    def _close_run(self, ending: RunEnding) -> bool:
        """Close the run as ``ending`` says; False if its state could not be settled."""
        # A run whose task was cancelled is a stopped run, never a completed one, even
        # when the task cancel was swallowed and the graph ran on to its end.
        if ending is RunEnding.COMPLETED and self._complete():
            return True
        run = self.ledger.get_run(self.scope.run_id)
        if run.terminal:
            if run.status is RunStatus.CANCELLED:
                return self.state.settle(None, [])
            return True
        if run.cancel_requested:
            # The signal arrived after the last check: finish the cancel here. Calls the
            # saved state leaves unanswered (e.g. paused at an approval interrupt) will
            # never run: the cancel records them as not run.
            dangling = self.state.dangling()
            report = finalize_cancel(self.scope, self.settings, dangling)
            return self.state.settle(report, dangling)
        return True

    def _close_empty_run(self) -> None:
        """Close a run that nothing ran under (see ``end``); leave any other alone."""
        try:
            if self.ledger.run_effects(self.scope.run_id):
                return
            if self.state.has_values():
                return
            self._released = self.ledger.finish_run(
                self.scope.run_id, RunStatus.FAILED, release_lease=self.owner
            )
        except Exception:
            logger.warning("could not close the run of an empty invocation", exc_info=True)

    def _complete(self) -> bool:
        """Mark the run completed if the graph ran to its end; True if this call did.

        The compare-and-set only moves a ``running`` run: a run asked to stop
        meanwhile, or already finished, is left to ``_close_run``.
        """
        if self.graph.checkpointer is None:
            return False
        try:
            # The lease goes back in the same round trip when this call ends the run.
            # Its commit need not wait for the disk: the run's last checkpoint is there
            # already, and a completion lost with the database leaves the run live, as
            # a worker that died before this write does; the thread's next input
            # continues it.
            with commit_before_flush():
                self._released = self.ledger.finish_run(
                    self.scope.run_id, RunStatus.COMPLETED, release_lease=self.owner
                )
        except IllegalTransitionError:
            return False
        return self._released


class CancellableGraph(CompiledStateGraph):  # type: ignore[type-arg]
    """A compiled graph whose every invocation is one scoped, leased, closable run."""

    cancellation: CancellationSettings

    def _with_bound_ledger(self, config: RunnableConfig | None) -> RunnableConfig | None:
        """Hand ``add_cancellation(..., ledger=...)`` to every node through the config."""
        bound = self.cancellation.ledger
        if bound is None:
            return config
        out: dict[str, Any] = dict(config or {})
        out["configurable"] = {**(out.get("configurable") or {}), CONFIG_KEY_LEDGER: bound}
        return cast(RunnableConfig, out)

    def copy(self, update: dict[str, Any] | None = None) -> Self:
        """As ``Pregel.copy``, keeping the cancellation settings.

        ``Pregel.copy`` rebuilds the object from its constructor arguments, which
        drops attributes set after ``compile()``. The LangGraph API server copies
        every graph it runs (``copy(update={"checkpointer": ..., "store": ...})``),
        and ``with_config`` copies too.
        """
        clone = super().copy(update)
        clone.cancellation = self.cancellation
        return clone

    def _prepare(
        self, config: RunnableConfig | None, kwargs: dict[str, Any]
    ) -> tuple[RunnableConfig | None, RunnableConfig | None]:
        """The config to run with, and the merged one when the run is a thread's (else None).

        Refuses a durability the ledger cannot keep before any node runs.
        """
        config = self._with_bound_ledger(config)
        merged = ensure_config(merge_configs(self.config, config))
        check_durability(merged, kwargs.get("durability"))
        if not merged.get("configurable", {}).get("thread_id"):
            return config, None
        kwargs.setdefault("control", RunControl())
        return config, merged

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """As ``CompiledStateGraph.stream``, inside the run's scope."""
        config, merged = self._prepare(config, kwargs)
        if merged is None:
            yield from super().stream(input, config, **kwargs)
            return
        invocation = Invocation(self, input, merged)
        ending = RunEnding.FAILED
        try:
            yield from super().stream(input, invocation.watching(config), **kwargs)
            ending = RunEnding.COMPLETED
        except BaseException as exc:
            ending = ending_of(exc, SYNC_STOPS)
            if ending is not RunEnding.CANCELLED:
                raise
        finally:
            invocation.end(ending)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """As ``CompiledStateGraph.astream``, inside the run's scope."""
        config, merged = self._prepare(config, kwargs)
        if merged is None:
            async for chunk in super().astream(input, config, **kwargs):
                yield chunk
            return
        outer = current_scope.get()
        invocation = await Invocation.aopen(self, input, merged)
        current_scope.set(invocation.scope)
        enclosing_task = invocation.scope.run_task
        invocation.scope.run_task = asyncio.current_task()
        ending = RunEnding.FAILED
        try:
            async for chunk in super().astream(input, invocation.watching(config), **kwargs):
                yield chunk
                # A server steps the generator from a task per step.
                invocation.scope.run_task = asyncio.current_task()
            # A task cancel that something inside the run swallowed is still a stop
            # (the task asked now: a server steps the generator from a task per step).
            task = asyncio.current_task()
            stopped = task is not None and task.cancelling() > 0
            ending = RunEnding.INTERRUPTED if stopped else RunEnding.COMPLETED
        except BaseException as exc:
            ending = ending_of(exc, ASYNC_STOPS)
            if ending is RunEnding.INTERRUPTED:
                # The stop is raised in this process before anything else: nodes still
                # running (a tool waiting for its turn) see it at their next check.
                invocation.scope.signal.set()
            if ending is not RunEnding.CANCELLED:
                raise
        finally:
            # The caller's context gets its scope back here: the end runs in a task of
            # its own, whose context is a copy.
            current_scope.set(outer)
            invocation.scope.run_task = enclosing_task
            await asyncio.shield(asyncio.ensure_future(self._aend(invocation, ending)))

    @staticmethod
    async def _aend(invocation: Invocation, ending: RunEnding) -> None:
        """End an async run: a run that ran to its end is closed on the loop when it can
        be, anything else (a stop, a failure, a pause) in a thread."""
        if ending is RunEnding.COMPLETED and await invocation.aend_completed():
            drop_scope(invocation.scope)
            return
        await asyncio.to_thread(invocation.end, ending)


__all__ = [
    "ASYNC_STOPS",
    "CONFIG_KEY_WORKER",
    "LEASE_TTL",
    "SYNC_STOPS",
    "CancellableGraph",
    "Invocation",
    "PauseWatch",
    "RunEnding",
    "RunEndingLiteral",
    "RunStart",
    "ending_of",
]

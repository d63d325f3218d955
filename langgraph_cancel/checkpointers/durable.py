"""Before a side effect leaves the process, the step that asked for it is on disk.

Under LangGraph's default ``durability="async"`` a step's checkpoint is written
while the next step runs. The tool step can then dispatch a refund before the
checkpoint holding the model's tool calls exists; a crash in that window loses
those calls, the resumed run asks the model again, and a refund keyed by its
tool-call id would be a new refund. So a side-effecting dispatch first waits for
the checkpoint its task was prepared from (LangGraph names it in the task's
``checkpoint_map``). It was submitted before the task started; the tool node
plans its calls (and records the first intents) while it is being saved,
and the call waits only for what is left of that commit.

Our savers note the checkpoints they save or load (``SavedCheckpoints``), so the
wait needs no I/O. Any other saver is asked for the checkpoint by id.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_cancel.errors import CheckpointNotSavedError

# LangGraph's task config keys (langgraph._internal._constants), as strings: the
# module is private.
_CONFIG_KEY_CHECKPOINTER = "__pregel_checkpointer"
_CONFIG_KEY_CHECKPOINT_MAP = "checkpoint_map"
_CONFIG_KEY_DURABILITY = "__pregel_durability"
_NS_SEP = "|"

logger = logging.getLogger("langgraph_cancel.checkpointers")

#: How long a dispatch waits for its step's checkpoint before refusing to go.
PLAN_SAVE_TIMEOUT = 30.0


class SavedCheckpoints:
    """The ids of the checkpoints a saver wrote or read in this process (the latest ones)."""

    def __init__(self, capacity: int = 4096) -> None:
        # None: saved; an exception: its save failed (LangGraph does not retry it).
        self._ids: OrderedDict[str, BaseException | None] = OrderedDict()
        self._capacity = capacity
        self._changed = threading.Condition()
        self._awaiting: dict[str, list[asyncio.Future[None]]] = {}
        # Per (thread, namespace): the last checkpoint saved, read or failed.
        self._last: OrderedDict[tuple[str, str], tuple[str, BaseException | None]] = OrderedDict()

    def note(
        self,
        checkpoint_id: str,
        failed: BaseException | None = None,
        *,
        thread: tuple[str, str] | None = None,
    ) -> None:
        """``checkpoint_id`` is in the database; or, with ``failed``, its save failed.

        ``thread``: its (thread id, checkpoint namespace), whose last event this is.
        """
        with self._changed:
            if thread is not None:
                self._last[thread] = (checkpoint_id, failed)
                self._last.move_to_end(thread)
                while len(self._last) > self._capacity:
                    self._last.popitem(last=False)
            if failed is not None and checkpoint_id in self:
                return  # saved after all (read back): that wins
            self._ids[checkpoint_id] = failed
            self._ids.move_to_end(checkpoint_id)
            while len(self._ids) > self._capacity:
                self._ids.popitem(last=False)
            self._changed.notify_all()
            awaiting = self._awaiting.pop(checkpoint_id, [])
        for fut in awaiting:
            fut.get_loop().call_soon_threadsafe(_resolve, fut)

    def __contains__(self, checkpoint_id: object) -> bool:
        """Whether the checkpoint is known saved."""
        return (
            isinstance(checkpoint_id, str)
            and checkpoint_id in self._ids
            and self._ids[checkpoint_id] is None
        )

    def failure(
        self, checkpoint_id: str, thread: tuple[str, str] | None = None
    ) -> BaseException | None:
        """Why the checkpoint's save failed or never can happen, if so.

        LangGraph saves a run's checkpoints in order, each after the one before: once
        a save of the thread failed, no later checkpoint of the run gets saved. So
        when the thread's last event is a failed save of this checkpoint or an earlier
        one (ids sort by time), waiting is pointless. A later save or read of the
        thread (a new run) clears it.
        """
        own = self._ids.get(checkpoint_id)
        if own is not None or thread is None:
            return own
        last = self._last.get(thread)
        if last is not None and last[1] is not None and last[0] <= checkpoint_id:
            return last[1]
        return None

    def wait(self, checkpoint_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``checkpoint_id`` to be noted.

        Returns:
            Whether it is known saved (False as well when its save failed: see ``failure``).
        """
        with self._changed:
            self._changed.wait_for(lambda: checkpoint_id in self._ids, timeout)
            return checkpoint_id in self

    async def await_noted(self, checkpoint_id: str, within: float) -> bool:
        """``wait`` on an event loop, holding no thread meanwhile.

        A thread per waiting call could take every worker of the loop's default
        executor, the one a threaded ``aput`` needs to save the checkpoint.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._changed:
            if checkpoint_id in self._ids:
                return checkpoint_id in self
            self._awaiting.setdefault(checkpoint_id, []).append(fut)
        try:
            await asyncio.wait_for(fut, within)
        except TimeoutError:
            pass
        finally:
            with self._changed:
                left = self._awaiting.get(checkpoint_id)
                if left is not None and fut in left:
                    left.remove(fut)
                    if not left:
                        del self._awaiting[checkpoint_id]
        return checkpoint_id in self


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


if TYPE_CHECKING:
    _SaverBase = BaseCheckpointSaver[Any]
else:
    _SaverBase = object


class NotesSavedCheckpoints(_SaverBase):
    """Mixin for a saver: remember which checkpoints are known to be in the database.

    A checkpoint is known saved once ``put`` returns it, or once ``get_tuple``
    reads it back (a resumed run starts from one).
    """

    @property
    def saved_checkpoints(self) -> SavedCheckpoints:
        """The checkpoints this saver wrote or read in this process."""
        found: SavedCheckpoints | None = self.__dict__.get("_saved_checkpoints")
        if found is None:
            found = self.__dict__.setdefault("_saved_checkpoints", SavedCheckpoints())
        return found

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """``put``, then note the checkpoint as saved (or its save as failed)."""
        with self._noting_save(config, checkpoint):
            return super().put(config, checkpoint, metadata, new_versions)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """``aput``, then note the checkpoint as saved (or its save as failed)."""
        with self._noting_save(config, checkpoint):
            return await super().aput(config, checkpoint, metadata, new_versions)

    @contextmanager
    def _noting_save(self, config: RunnableConfig, checkpoint: Checkpoint) -> Iterator[None]:
        thread = _thread_of(config)
        try:
            yield
        except BaseException as exc:
            self.saved_checkpoints.note(checkpoint["id"], failed=exc, thread=thread)
            raise
        self.saved_checkpoints.note(checkpoint["id"], thread=thread)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``get_tuple``; a checkpoint read back is a saved one."""
        found = super().get_tuple(config)
        if found is not None:
            self.saved_checkpoints.note(found.checkpoint["id"], thread=_thread_of(config))
        return found

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``aget_tuple``; a checkpoint read back is a saved one."""
        found = await super().aget_tuple(config)
        if found is not None:
            self.saved_checkpoints.note(found.checkpoint["id"], thread=_thread_of(config))
        return found


@dataclass(frozen=True, slots=True)
class PlanCheckpoint:
    """The checkpoint a task was prepared from, which a dispatch must find saved."""

    saver: BaseCheckpointSaver[Any]
    config: RunnableConfig
    checkpoint_id: str

    def known_saved(self) -> bool:
        """Saved, as far as this process knows without asking the database."""
        noted = getattr(self.saver, "saved_checkpoints", None)
        return noted is not None and self.checkpoint_id in noted

    def wait(self, timeout: float | None = None) -> None:
        """Block until the checkpoint is saved.

        A read that fails (the database dropped the connection) counts as not
        saved yet: the wait goes on until the deadline.

        Args:
            timeout: Seconds; default ``PLAN_SAVE_TIMEOUT``.

        Raises:
            CheckpointNotSavedError: Not saved within ``timeout`` seconds (the save
                failed or hangs): nothing may be dispatched on its behalf.
        """
        timeout = PLAN_SAVE_TIMEOUT if timeout is None else timeout
        noted = self._noted()
        last_error: Exception | None = None
        for pause in _rounds(timeout, noted is not None):
            if noted is not None:
                if noted.wait(self.checkpoint_id, pause):
                    return
                self._raise_if_failed(noted, timeout)
            else:
                time.sleep(pause)
            try:
                found = self.saver.get_tuple(self.config)
            except NotImplementedError:
                _cannot_ask(self.saver)
                return
            except Exception as exc:
                last_error = exc
                continue
            if self._found(found):
                return
        raise CheckpointNotSavedError(self.checkpoint_id, timeout) from last_error

    async def await_saved(self, within: float | None = None) -> None:
        """``wait`` for an async graph: the event loop's threads stay free meanwhile.

        Args:
            within: Seconds; default ``PLAN_SAVE_TIMEOUT``.

        Raises:
            CheckpointNotSavedError: As ``wait``.
        """
        timeout = PLAN_SAVE_TIMEOUT if within is None else within
        noted = self._noted()
        last_error: Exception | None = None
        for pause in _rounds(timeout, noted is not None):
            if noted is not None:
                if await noted.await_noted(self.checkpoint_id, pause):
                    return
                self._raise_if_failed(noted, timeout)
            else:
                await asyncio.sleep(pause)
            try:
                found = await self._aget_tuple()
            except NotImplementedError:
                _cannot_ask(self.saver)
                return
            except Exception as exc:
                last_error = exc
                continue
            if self._found(found):
                return
        raise CheckpointNotSavedError(self.checkpoint_id, timeout) from last_error

    async def _aget_tuple(self) -> CheckpointTuple | None:
        try:
            return await self.saver.aget_tuple(self.config)
        except NotImplementedError:
            # A sync saver (LangGraph's raise here): its sync read, in a thread.
            return await asyncio.to_thread(self.saver.get_tuple, self.config)

    def _raise_if_failed(self, noted: SavedCheckpoints, timeout: float) -> None:
        """A save that failed is not retried by LangGraph: no use waiting for it."""
        failed = noted.failure(self.checkpoint_id, _thread_of(self.config))
        if failed is not None:
            raise CheckpointNotSavedError(self.checkpoint_id, timeout, failed=failed) from failed

    def _noted(self) -> SavedCheckpoints | None:
        noted: SavedCheckpoints | None = getattr(self.saver, "saved_checkpoints", None)
        return noted

    def _found(self, found: CheckpointTuple | None) -> bool:
        noted = self._noted()
        if found is not None and noted is not None:
            noted.note(self.checkpoint_id)
        return found is not None


def _thread_of(config: RunnableConfig) -> tuple[str, str] | None:
    conf = config.get("configurable") or {}
    thread_id = conf.get("thread_id")
    return None if thread_id is None else (str(thread_id), str(conf.get("checkpoint_ns") or ""))


def _rounds(timeout: float, noting: bool) -> Iterator[float]:
    """How long each round of a wait lasts before the database is asked, until ``timeout``.

    A saver that notes its saves is waited on for up to a second a round (asking
    the database covers a checkpoint this process never wrote or read); any other
    saver is asked at once, then with a pause that doubles up to 50 ms.
    """
    deadline = time.monotonic() + timeout
    pause = 0.0
    while True:
        yield max(0.0, min(deadline - time.monotonic(), 1.0 if noting else pause))
        if time.monotonic() >= deadline:
            return
        pause = min(max(pause * 2, 0.001), 0.05)


def _cannot_ask(saver: object) -> None:
    """A saver that reads nothing back cannot be waited on: say so (once) and go on."""
    name = type(saver).__qualname__
    if name not in _UNASKABLE:
        _UNASKABLE.add(name)
        logger.warning(
            "%s cannot read a checkpoint back, so side effects are dispatched without "
            "waiting for the checkpoint of the step that asked for them; a crash in "
            'that window can lose the calls. Run with durability="sync" to close it.',
            name,
        )


_UNASKABLE: set[str] = set()


def plan_checkpoint(config: RunnableConfig | None) -> PlanCheckpoint | None:
    """What a side-effecting dispatch in the task of ``config`` must wait for.

    None when there is nothing to wait for: not inside a LangGraph task, no
    checkpointer, an in-memory one (a crash loses it anyway), or
    ``durability="sync"`` (LangGraph saved the step before starting this one).
    """
    conf = (config or {}).get("configurable") or {}
    if conf.get(_CONFIG_KEY_DURABILITY, "async") == "sync":
        return None
    saver = conf.get(_CONFIG_KEY_CHECKPOINTER)
    if not isinstance(saver, BaseCheckpointSaver) or isinstance(saver, InMemorySaver):
        return None
    task_ns = str(conf.get("checkpoint_ns") or "")
    parent_ns = task_ns.rpartition(_NS_SEP)[0]
    checkpoint_id = (conf.get(_CONFIG_KEY_CHECKPOINT_MAP) or {}).get(parent_ns)
    thread_id = conf.get("thread_id")
    if not checkpoint_id or thread_id is None:
        return None
    return PlanCheckpoint(
        saver=saver,
        config={
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": parent_ns,
                "checkpoint_id": checkpoint_id,
            }
        },
        checkpoint_id=str(checkpoint_id),
    )


def wait_for_plan(config: RunnableConfig | None, timeout: float) -> None:
    """Block until the checkpoint a dispatch in the task of ``config`` needs is saved.

    Raises:
        CheckpointNotSavedError: Not saved within ``timeout`` seconds.
    """
    plan = plan_checkpoint(config)
    if plan is not None and not plan.known_saved():
        plan.wait(timeout)


async def await_plan(config: RunnableConfig | None, within: float) -> None:
    """``wait_for_plan`` for an event loop.

    Raises:
        CheckpointNotSavedError: Not saved within ``within`` seconds.
    """
    plan = plan_checkpoint(config)
    if plan is not None and not plan.known_saved():
        await plan.await_saved(within)


__all__ = [
    "PLAN_SAVE_TIMEOUT",
    "NotesSavedCheckpoints",
    "PlanCheckpoint",
    "SavedCheckpoints",
    "await_plan",
    "plan_checkpoint",
    "wait_for_plan",
]

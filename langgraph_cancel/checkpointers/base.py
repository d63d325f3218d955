"""What every cancel-aware saver shares: it owns a ledger in its own database."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import AsyncLedger


def close_on_loop(ledger: AsyncLedger, loop: asyncio.AbstractEventLoop) -> None:
    """Close an async ledger from a finalizer: on its own loop, if that still runs
    (a loop that has ended took its connections' sockets with it)."""
    if loop.is_closed():
        return
    with contextlib.suppress(RuntimeError):
        asyncio.run_coroutine_threadsafe(ledger.aclose(), loop)


class LedgerOwner:
    """Mixin: a LangGraph checkpointer that also owns the effect ledger.

    The nodes of ``langgraph_cancel`` find the ledger through the graph's
    checkpointer (``saver.ledger``), so one connection string and one
    ``setup()`` cover checkpoints, effects, runs and cancel requests.
    """

    ledger: Ledger

    def setup_ledger(self) -> None:
        """Create or migrate the ledger tables."""
        self.ledger.setup()

    async def aprepare_ledger(self) -> None:
        """Make ``ledger`` known before an async run starts (a saver that learns its
        database on the loop sets itself up here; the others have it already)."""


class ThreadedAsyncMixin:
    """Async checkpointer methods for a sync saver, run in a worker thread.

    The official sync savers raise ``NotImplementedError`` from their async
    methods; ours serve async graphs too (the work is blocking database I/O,
    so a thread is the honest way to keep the event loop free).
    """

    if TYPE_CHECKING:  # provided by the saver this is mixed into

        def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
            raise NotImplementedError

        def list(
            self,
            config: RunnableConfig | None,
            *,
            filter: dict[str, Any] | None = None,
            before: RunnableConfig | None = None,
            limit: int | None = None,
        ) -> Any:
            raise NotImplementedError

        def put(
            self,
            config: RunnableConfig,
            checkpoint: Checkpoint,
            metadata: CheckpointMetadata,
            new_versions: ChannelVersions,
        ) -> RunnableConfig:
            raise NotImplementedError

        def put_writes(
            self,
            config: RunnableConfig,
            writes: Sequence[tuple[str, Any]],
            task_id: str,
            task_path: str = "",
        ) -> None:
            raise NotImplementedError

        def delete_thread(self, thread_id: str) -> None:
            raise NotImplementedError

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async ``get_tuple``."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async ``list``."""
        items = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async ``put``."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async ``put_writes``."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async ``delete_thread``."""
        await asyncio.to_thread(self.delete_thread, thread_id)

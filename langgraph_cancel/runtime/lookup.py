"""Which run a node works for: the invocation's scope, the thread's live run, or a new one.

Inside an invocation of a cancel-aware graph every node finds the invocation's
scope; elsewhere (a node run on its own, a tool called directly) the thread's
live run, or a new run, or, with no checkpointer or no thread, a run with a
ledger of its own in memory. Scopes are kept per ledger and thread for the
process (``SCOPES``).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from langchain_core.runnables import RunnableConfig

from langgraph_cancel.ledger import Ledger, SqliteBackend
from langgraph_cancel.ledger.aio import AsyncLedger
from langgraph_cancel.ledger.flush import commit_before_flush
from langgraph_cancel.ledgers import (
    checkpointer_of,
    explicit_source,
    known_saver_ledger,
    resolve_ledger,
)
from langgraph_cancel.process import worker_id
from langgraph_cancel.runtime.config import thread_id_of
from langgraph_cancel.runtime.scope import RunScope, current_scope
from langgraph_cancel.runtime.signal import HUB, CancelSignal
from langgraph_cancel.types import EffectRecord, RunRecord, RunStatus

# Process-wide (see ``langgraph_cancel.process``): the live run of each thread, by
# ledger URL and thread id, so the nodes of one run (and a request to cancel it from
# this process) find the same scope and the same cancel signal.
#: Guards ``SCOPES``.
SCOPES_LOCK = threading.Lock()
SCOPES: dict[tuple[str, str], RunScope] = {}


def invocation_scope(config: RunnableConfig | None, ledger: Any = None) -> RunScope | None:
    """The invocation's scope, when ``scope_for(config, ledger=ledger, new_run=False)``
    would return it; found without database I/O (for event loops), else None."""
    active = current_scope.get()
    if active is None or (config or {}).get("configurable", {}).get("thread_id") != (
        active.requested_thread
    ):
        return None
    source = explicit_source(config, ledger)
    if source is None:
        saver = checkpointer_of(config)
        if saver is None:
            return active if active.ephemeral else None
        return active if known_saver_ledger(saver) is active.ledger else None
    if isinstance(source, str):
        same = source == active.ledger.url
    else:
        same = source is active.ledger or getattr(source, "ledger", None) is active.ledger
    return active if same else None


def scope_for(
    config: RunnableConfig | None,
    *,
    ledger: Ledger | str | None = None,
    new_run: bool = True,
    run_id: str | None = None,
    owner: str | None = None,
    parent_run_id: str | None = None,
    lease_ttl: float | None = None,
    prefetch_unsettled: bool = False,
) -> RunScope:
    """The run scope of the thread in ``config``.

    Inside an invocation of a cancel-aware graph this is the invocation's scope.
    Otherwise: the thread's live run; or, when the last run is over, a new run
    if ``new_run`` (new input) else the finished run (a continuation of a
    cancelled run must not start new work).

    ``lease_ttl``: also hold the thread's lease for the owner; a run started
    here takes it in the same round trip.

    ``prefetch_unsettled``: a run started here also reads the thread's unsettled
    effects in that round trip, kept in ``RunScope.unsettled_at_start``.

    Raises:
        ThreadBusyError: With ``lease_ttl``: another owner holds the thread.
    """
    worker = owner or worker_id()
    named = ((config or {}).get("configurable") or {}).get("thread_id")
    resolved = resolve_ledger(config, ledger) if named else None
    if resolved is None:
        return ephemeral_scope(config, owner=worker, run_id=run_id)
    thread_id = str(named)
    found = _known_scope(resolved, thread_id, new_run=new_run)
    if found is not None:
        if lease_ttl is not None:
            resolved.acquire_lease(thread_id, worker, ttl=lease_ttl)
        if prefetch_unsettled:
            found.unsettled_at_start = None  # an older read is no snapshot of now
        return found
    if not new_run:
        latest = resolved.latest_run(thread_id)
        if latest is not None and latest.terminal:
            if lease_ttl is not None:
                resolved.acquire_lease(thread_id, worker, ttl=lease_ttl)
            return _cache_new_scope(resolved, thread_id, latest, worker, None)
    unsettled: list[EffectRecord] | None = None
    start = resolved.start_run_and_unsettled if prefetch_unsettled else resolved.start_run
    # No side effect leaves on its strength before a commit that waits for the disk.
    with commit_before_flush():
        started = start(
            thread_id,
            run_id=run_id,
            owner=worker,
            parent_run_id=parent_run_id,
            lease_ttl=lease_ttl,
        )
    run, unsettled = started if isinstance(started, tuple) else (started, None)
    return _cache_new_scope(resolved, thread_id, run, worker, unsettled)


def _known_scope(ledger: Ledger, thread_id: str, *, new_run: bool) -> RunScope | None:
    """The scope this process already has for the thread, when ``scope_for`` returns it.

    The invocation's own (unless a new run is asked for), else the one kept for the
    thread while its run goes on (or, when no new run is asked for, even once over).
    """
    active = None if new_run else current_scope.get()
    if active is not None and active.thread_id == thread_id and active.ledger.url == ledger.url:
        return active
    with SCOPES_LOCK:
        kept = SCOPES.get((ledger.url, thread_id))
    if kept is not None and (not kept.run.terminal or not new_run):
        return kept
    return None


def _cache_new_scope(
    ledger: Ledger,
    thread_id: str,
    run: RunRecord,
    owner: str,
    unsettled: list[EffectRecord] | None,
) -> RunScope:
    """The scope of a run just started (or found finished), kept for the thread."""
    scope = RunScope(
        ledger=ledger,
        thread_id=thread_id,
        run=run,
        owner=owner,
        signal=HUB.signal(ledger, run.run_id),
        unsettled_at_start=unsettled,
    )
    if run.status is not RunStatus.RUNNING:
        scope.signal.set()
    else:
        scope.signal.saw(run)
    with SCOPES_LOCK:
        SCOPES[(ledger.url, thread_id)] = scope
    return scope


async def ascope_for(
    config: RunnableConfig,
    twin: AsyncLedger,
    *,
    ledger: Ledger,
    new_run: bool,
    run_id: str | None,
    owner: str,
    lease_ttl: float,
    prefetch_unsettled: bool,
) -> RunScope:
    """``scope_for`` of an invocation whose ledger has an async twin on this loop.

    The same rules, with the run's start (its row, its lease and the thread's
    unsettled effects, in one round trip) awaited on the loop: an async graph on
    an async saver starts its run without a thread hop.

    Raises:
        ThreadBusyError: Another owner holds the thread.
    """
    thread_id = thread_id_of(config)
    with SCOPES_LOCK:
        scope = SCOPES.get((ledger.url, thread_id))
    if scope is not None and (not scope.run.terminal or not new_run):
        await twin.aacquire_lease(thread_id, owner, ttl=lease_ttl)
        if prefetch_unsettled:
            scope.unsettled_at_start = None  # an older read is no snapshot of now
        return scope
    if not new_run:
        latest = await twin.alatest_run(thread_id)
        if latest is not None and latest.terminal:
            await twin.aacquire_lease(thread_id, owner, ttl=lease_ttl)
            return _cache_new_scope(ledger, thread_id, latest, owner, None)
    unsettled: list[EffectRecord] | None = None
    with commit_before_flush():  # as in ``scope_for``
        if prefetch_unsettled:
            run, unsettled = await twin.astart_run_and_unsettled(
                thread_id, run_id=run_id, owner=owner, lease_ttl=lease_ttl
            )
        else:
            run = await twin.astart_run(thread_id, run_id=run_id, owner=owner, lease_ttl=lease_ttl)
    return _cache_new_scope(ledger, thread_id, run, owner, unsettled)


def ephemeral_scope(
    config: RunnableConfig | None, *, owner: str | None = None, run_id: str | None = None
) -> RunScope:
    """A run with an in-memory ledger of its own: no checkpointer, or no thread.

    As ``ToolNode`` works without either, so does every node here: calls are
    recorded and checked as usual, for this run alone. The invocation's scope is
    reused when there is one (``add_cancellation``'s graph starts it).
    """
    named = ((config or {}).get("configurable") or {}).get("thread_id")
    active = current_scope.get()
    if (
        active is not None
        and active.ephemeral
        and active.named_thread == (str(named) if named else None)
    ):
        return active
    ledger = Ledger(SqliteBackend(":memory:"))
    ledger.setup()
    thread_id = str(named) if named else f"no-thread-{uuid.uuid4().hex[:12]}"
    worker = owner or worker_id()
    run = ledger.start_run(thread_id, run_id=run_id, owner=worker)
    return RunScope(
        ledger=ledger,
        thread_id=thread_id,
        run=run,
        owner=worker,
        signal=CancelSignal(ledger, run.run_id, poll_interval=0.05),
        ephemeral=True,
        named_thread=str(named) if named else None,
    )


def peek_scope(ledger: Ledger, thread_id: str) -> RunScope | None:
    """The cached scope of a thread in this process, if any."""
    with SCOPES_LOCK:
        return SCOPES.get((ledger.url, thread_id))


def drop_scope(scope: RunScope) -> None:
    """Forget a finished run's scope."""
    with SCOPES_LOCK:
        if SCOPES.get((scope.ledger.url, scope.thread_id)) is scope:
            del SCOPES[(scope.ledger.url, scope.thread_id)]
    HUB.forget(scope.ledger, scope.run_id)


def is_cancelled() -> bool:
    """Inside a node or tool of a cancel-aware graph: was this run asked to stop?

    Like Temporal's ``activity.is_cancelled()``; long-running tools can poll it
    between chunks of work. False outside a run.
    """
    scope = current_scope.get()
    return scope.cancel_called() if scope is not None else False


__all__ = [
    "ascope_for",
    "drop_scope",
    "ephemeral_scope",
    "invocation_scope",
    "is_cancelled",
    "peek_scope",
    "scope_for",
]

"""Run scope: which ledger, thread, run and worker a node is working for, and the cancel signal.

The signal is level-triggered (trio): once a run is cancel-requested it stays
so, and the first reason wins (the ledger keeps it). A check is cheap: an
in-process flag, set at once by ``request_cancel`` in the same process, by a
PostgreSQL ``LISTEN`` thread, or by a throttled poll of the run row.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig

from langgraph_cancel.errors import ConfigurationError, DurabilityError
from langgraph_cancel.ledger import Ledger, SqliteBackend, default_owner
from langgraph_cancel.ledger.aio import AsyncLedger, async_twin_of
from langgraph_cancel.ledger.flush import commit_before_flush
from langgraph_cancel.ledgers import (
    CONFIG_KEY_LEDGER,
    ENV_DB,
    checkpointer_of,
    coerce_ledger,
    explicit_source,
    known_saver_ledger,
    ledger_for_url,
    resolve_ledger,
)
from langgraph_cancel.limits import LimitGuard
from langgraph_cancel.progress import ProgressKind, announce_effect, announce_observed
from langgraph_cancel.types import EffectRecord, RunRecord, RunStatus
from langgraph_cancel.urls import DEFAULT_DB_URL

logger = logging.getLogger("langgraph_cancel")

_CONFIG_KEY_DURABILITY = "__pregel_durability"
#: The stop a cancelled run task stands for (a server's runs.cancel, a disconnect).
INTERRUPTED_REASON = "run task cancelled (server cancel, disconnect or Ctrl-C)"

#: This process's worker identity (lease owner, effect owner). Renewed in a forked
#: child: processes forked from one parent that imported the library (Celery prefork,
#: gunicorn --preload, a multiprocessing fork server) are different workers, and two
#: workers sharing an identity would share a thread's lease. Read it when needed
#: (``worker_id()``), not once at import.
WORKER_ID = default_owner()


def worker_id() -> str:
    """This process's worker identity (see ``WORKER_ID``)."""
    return WORKER_ID


def _renew_worker_id() -> None:
    global WORKER_ID
    WORKER_ID = default_owner()


os.register_at_fork(after_in_child=_renew_worker_id)


def default_db_url() -> str:
    """The command line's default database: ``$LANGGRAPH_CANCEL_DB`` or a file here."""
    return os.environ.get(ENV_DB) or DEFAULT_DB_URL


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


def thread_id_of(config: RunnableConfig | None) -> str:
    """The thread id of a run.

    Raises:
        ConfigurationError: When the config has none (nothing durable without it).
    """
    conf = (config or {}).get("configurable", {})
    thread_id = conf.get("thread_id")
    if not thread_id:
        raise ConfigurationError(
            "langgraph-cancel needs a thread: invoke with "
            'config={"configurable": {"thread_id": ...}}'
        )
    return str(thread_id)


def check_durability(config: RunnableConfig | None, durability: str | None = None) -> None:
    """Refuse ``durability="exit"``: a crash would lose every tool batch of the run.

    Args:
        config: A node's config (LangGraph puts the run's durability in it).
        durability: The ``durability=`` an invocation was given, checked at its start.

    Raises:
        DurabilityError: Under ``durability="exit"``.
    """
    conf = (config or {}).get("configurable", {})
    if (durability or conf.get(_CONFIG_KEY_DURABILITY)) == "exit":
        raise DurabilityError(
            'durability="exit" writes one checkpoint at the end of the run, so a crash '
            "loses every tool batch; langgraph-cancel needs a checkpoint after each batch: "
            'use durability="sync" or "async" (the default)'
        )


class CancelSignal:
    """Whether a run has been asked to stop, answered cheaply and often.

    Args:
        ledger: The ledger holding the run row.
        run_id: The run.
        poll_interval: Seconds between reads of the run row (0: every check).
    """

    def __init__(self, ledger: Ledger, run_id: str, *, poll_interval: float) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.poll_interval = poll_interval
        self._event = threading.Event()
        #: When this process first saw the signal up (epoch seconds), else None.
        self.raised_at: float | None = None
        self._last_poll = 0.0
        self._observed = False
        self._lock = threading.Lock()
        #: The run's limits, checked with the signal: True once one was breached (a
        #: breach requests cancel, which raises the signal). Blocking.
        self.limit_check: Callable[[], bool] | None = None

    def set(self) -> None:
        """Mark the signal up (from a listener or a same-process request)."""
        if self.raised_at is None:
            self.raised_at = time.time()
        self._event.set()

    def saw(self, run: RunRecord) -> None:
        """The run row was just read: count it as this interval's poll."""
        if run.cancel_requested or run.terminal:
            self.set()
        else:
            self._last_poll = time.monotonic()

    @property
    def cancel_called(self) -> bool:
        """True once cancellation was requested (may poll the database)."""
        if self._event.is_set():
            return True
        limit_check = self.limit_check
        if limit_check is not None and limit_check():
            return True
        return self._claim_poll() and self._poll()

    async def acancel_called(self) -> bool:
        """``cancel_called`` for event loops: the flag inline; a due poll through the
        ledger's async twin on this loop, else in a thread."""
        if self._event.is_set():
            return True
        limit_check = self.limit_check
        if limit_check is not None and await asyncio.to_thread(limit_check):
            return True
        if not self._claim_poll():
            return False
        native = async_twin_of(self.ledger)
        if native is None:
            return await asyncio.to_thread(self._poll)
        try:
            run = await native.aget_run(self.run_id)
        except Exception:  # a lost database must not crash a check; the DB guard holds
            logger.warning("cancel poll failed for run %s", self.run_id, exc_info=True)
            return False
        return self._polled(run)

    def _claim_poll(self) -> bool:
        """Whether a poll is due; the caller that gets True makes it.

        Claimed before the read, so the calls of a whole batch arriving together
        cost one read per interval, not one each.
        """
        now = time.monotonic()
        with self._lock:
            if now - self._last_poll < self.poll_interval:
                return False
            self._last_poll = now
            return True

    def _poll(self) -> bool:
        try:
            run = self.ledger.get_run(self.run_id)
        except Exception:  # a lost database must not crash a check; the DB guard holds
            logger.warning("cancel poll failed for run %s", self.run_id, exc_info=True)
            return False
        return self._polled(run)

    def _polled(self, run: RunRecord) -> bool:
        if run.cancel_requested:
            self.set()
            return True
        return False

    def observe(self) -> RunRecord | None:
        """Record, once, that the run saw its signal (``cancel_requested -> cancelling``)."""
        if not self._claim_observe():
            return None
        return self._observed_run(self.ledger.mark_observed(self.run_id))

    async def aobserve(self) -> RunRecord | None:
        """``observe`` for event loops: through the ledger's async twin on this loop, else
        in a thread."""
        native = async_twin_of(self.ledger)
        if native is None:
            return await asyncio.to_thread(self.observe)
        if not self._claim_observe():
            return None
        return self._observed_run(await native.amark_observed(self.run_id))

    def _claim_observe(self) -> bool:
        """Whether this caller is the one to record the observation (once per signal)."""
        with self._lock:
            if self._observed:
                return False
            self._observed = True
            return True

    def _observed_run(self, run: RunRecord) -> RunRecord:
        if run.requested_at is not None:
            announce_observed(run)
        return run

    def wait(self, timeout: float) -> bool:
        """Block until the signal is up or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            if self.cancel_called:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._event.wait(min(left, max(self.poll_interval, 0.01)))


class _SignalHub:
    """Process-wide registry of live cancel signals, fed by every source."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._signals: dict[tuple[str, str], CancelSignal] = {}
        self._listeners: dict[str, Any] = {}
        # Ledgers whose same-process cancels we hear: weak, since ids are reused.
        self._hooked: weakref.WeakSet[Ledger] = weakref.WeakSet()

    def signal(self, ledger: Ledger, run_id: str) -> CancelSignal:
        key = (ledger.url, run_id)
        with self._lock:
            sig = self._signals.get(key)
            if sig is None:
                pg = ledger.backend.dialect == "postgres"
                sig = CancelSignal(ledger, run_id, poll_interval=1.0 if pg else 0.05)
                self._signals[key] = sig
            if ledger not in self._hooked:
                self._hooked.add(ledger)
                ledger.add_cancel_listener(self._make_listener(ledger.url))
            listener = self._listeners.get(ledger.url)
            if ledger.backend.dialect == "postgres" and (
                listener is None or not listener.is_alive()
            ):
                self._listeners[ledger.url] = _start_pg_listener(ledger, self._on_notify)
        return sig

    def _make_listener(self, url: str) -> Callable[[str, str], None]:
        def listener(_thread_id: str, run_id: str) -> None:
            self._on_notify(url, run_id)

        return listener

    def _on_notify(self, url: str, run_id: str) -> None:
        with self._lock:
            sig = self._signals.get((url, run_id))
        if sig is not None:
            sig.set()

    def forget(self, ledger: Ledger, run_id: str) -> None:
        with self._lock:
            self._signals.pop((ledger.url, run_id), None)


def _start_pg_listener(ledger: Ledger, on_notify: Callable[[str, str], None]) -> threading.Thread:
    """A daemon thread that ``LISTEN``s for cancel requests and reconnects when dropped."""
    from langgraph_cancel.ledger import PostgresBackend

    backend = ledger.backend
    assert isinstance(backend, PostgresBackend)
    conninfo = backend.conninfo
    url = ledger.url

    def loop() -> None:
        import psycopg

        # Ends with its ledger: a closed ledger stops listening within a second.
        while not backend.closed:
            try:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute("LISTEN lgc_cancel")
                    while not backend.closed:
                        for note in conn.notifies(timeout=1.0):
                            _thread, _, run_id = note.payload.partition("\x1f")
                            on_notify(url, run_id)
            except Exception:
                logger.debug("cancel listener reconnecting", exc_info=True)
                time.sleep(0.5)

    thread = threading.Thread(target=loop, name="langgraph-cancel-listen", daemon=True)
    thread.start()
    return thread


HUB = _SignalHub()


@dataclass(slots=True)
class _Held:
    ledger: Ledger
    thread_id: str
    owner: str
    ttl: float
    due: float


class LeaseKeeper:
    """Renews every lease this process holds, from one daemon thread.

    Each lease is renewed every third of its time to live. A renewal that fails
    is logged and tried again a third of a TTL later, so a lease lapses only
    when renewals keep failing for its whole TTL (then another worker may take
    the thread over, as after a crash).
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._held: dict[int, _Held] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def hold(self, ledger: Ledger, thread_id: str, owner: str, *, ttl: float) -> int:
        """Keep renewing ``owner``'s lease on ``thread_id`` until ``let_go``; returns a handle."""
        with self._lock:
            handle = next(self._ids)
            self._held[handle] = _Held(ledger, thread_id, owner, ttl, time.monotonic() + ttl / 3)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._renew_forever, name="langgraph-cancel-leases", daemon=True
                )
                self._thread.start()
            self._changed.notify()
            return handle

    def let_go(self, handle: int) -> None:
        """Stop renewing a lease (releasing it is the caller's own write)."""
        with self._lock:
            self._held.pop(handle, None)

    def held(self) -> int:
        """How many leases are being renewed."""
        with self._lock:
            return len(self._held)

    def _renew_forever(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                due = [(k, h) for k, h in self._held.items() if h.due <= now]
                if not due:
                    soonest = min((h.due for h in self._held.values()), default=None)
                    self._changed.wait(None if soonest is None else soonest - now)
                    continue
                for _, h in due:
                    h.due = now + h.ttl / 3
            for handle, h in due:
                with self._lock:
                    if handle not in self._held:
                        continue  # let go meanwhile: its run is ending
                try:
                    h.ledger.heartbeat(h.thread_id, h.owner, ttl=h.ttl)
                except Exception:
                    logger.warning("lease heartbeat failed for %s", h.thread_id, exc_info=True)


#: The process's lease keeper (``_Invocation`` holds each run's lease through it).
LEASES = LeaseKeeper()
os.register_at_fork(after_in_child=LEASES._reset)  # the parent's thread is not ours


@dataclass
class RunScope:
    """Everything a node needs to act for one run of one thread."""

    ledger: Ledger
    thread_id: str
    run: RunRecord
    owner: str
    signal: CancelSignal
    extra: dict[str, Any] = field(default_factory=dict)
    #: The thread's unsettled effects as read with the run's start, until taken.
    unsettled_at_start: list[EffectRecord] | None = None
    #: True for a run with a ledger of its own, in memory (no checkpointer, no thread):
    #: nothing of it outlives the run, and no other process can reach it.
    ephemeral: bool = False
    #: The thread id the run's config named (None: it named none).
    named_thread: str | None = None
    #: Effects in flight that this run's stop waits for: each leaves the set when its
    #: outcome is recorded and streamed as ``settled`` (``progress.py``).
    awaited: set[str] = field(default_factory=set)
    #: Called once when the run's task is cancelled, after the stop is recorded (the
    #: invocation shows the stop under way in the thread state).
    on_task_cancel: Callable[[], Awaitable[None]] | None = None
    #: True once the run's task was cancelled and that was recorded as a stop.
    task_cancelled: bool = False
    #: The run's limits while an invocation enforces them (``add_cancellation(limits=...)``).
    limits: LimitGuard | None = None

    def enforce(self, guard: LimitGuard | None) -> None:
        """Check ``guard`` with the run's cancel signal (None: stop checking limits)."""
        previous = self.limits
        if previous is not None:
            previous.stop()
        self.limits = guard
        self.signal.limit_check = None if guard is None else guard.check
        if guard is not None:
            guard.start()

    def count_tokens(self, tokens: int) -> None:
        """Count model tokens for the run's token budget (when it has one)."""
        if self.limits is not None:
            self.limits.add_tokens(tokens)

    def await_effect(self, record: EffectRecord, grace: float | None) -> None:
        """The stop waits for ``record``, in flight, for ``grace`` seconds (None: until
        it returns): say so on the stream, once per effect."""
        if record.effect_id in self.awaited:
            return
        self.awaited.add(record.effect_id)
        announce_effect(ProgressKind.WAITING, record, grace_s=grace)

    @property
    def requested_thread(self) -> str | None:
        """The thread id a config must name for this scope to be its invocation's."""
        return self.named_thread if self.ephemeral else self.thread_id

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.run.run_id

    def take_unsettled_at_start(self) -> list[EffectRecord] | None:
        """The unsettled effects read when this invocation started the run, once.

        For START's router, the first step of an invocation: nothing has run
        since the read. None when there is no such read (or it was taken).
        """
        taken, self.unsettled_at_start = self.unsettled_at_start, None
        return taken

    def cancel_called(self) -> bool:
        """Level-triggered: has anyone asked this run to stop?"""
        return self.signal.cancel_called

    def refresh(self) -> RunRecord:
        """Re-read the run row."""
        self.run = self.ledger.get_run(self.run.run_id)
        return self.run

    async def arefresh(self) -> RunRecord:
        """``refresh`` for event loops (the ledger's async twin on this loop, else a thread)."""
        self.run = await async_ledger_of(self.ledger).aget_run(self.run.run_id)
        return self.run

    async def atask_cancelled(self) -> None:
        """The run's asyncio task was cancelled (a server's ``runs.cancel``, a client
        disconnect, Ctrl-C): that is a stop request like any other.

        The signal goes up in this process at once, before any I/O, so every node
        of the run (a model stream, a tool waiting for its turn) stops by itself
        at its next check instead of relying on the task cancel reaching it; then
        the request is recorded in the ledger (the first reason wins). A failed
        write is logged: the run's end records the interruption again.
        """
        self.signal.set()
        if self.task_cancelled:
            return
        self.task_cancelled = True
        try:
            await async_ledger_of(self.ledger).arequest_cancel(
                self.thread_id, reason=INTERRUPTED_REASON, requested_by="runtime", cascade=True
            )
        except Exception:
            logger.warning("could not record the cancelled task as a stop", exc_info=True)
        if self.on_task_cancel is not None:
            try:
                await self.on_task_cancel()
            except Exception:
                logger.warning("could not show the stop under way", exc_info=True)


def async_ledger_of(ledger: Ledger) -> AsyncLedger | Ledger:
    """Where an event loop sends ``ledger``'s ``a*`` calls: its bound ``AsyncLedger``
    (on the loop, no thread), else the ledger itself (its ``a*`` methods use a thread)."""
    return async_twin_of(ledger) or ledger


_scopes: dict[tuple[str, str], RunScope] = {}
_scopes_lock = threading.Lock()
current_scope: contextvars.ContextVar[RunScope | None] = contextvars.ContextVar(
    "langgraph_cancel_scope", default=None
)


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
    worker = owner or WORKER_ID
    named = ((config or {}).get("configurable") or {}).get("thread_id")
    resolved = resolve_ledger(config, ledger) if named else None
    if resolved is None:
        return ephemeral_scope(config, owner=worker, run_id=run_id)
    thread_id = str(named)

    def leased(found: RunScope) -> RunScope:
        if lease_ttl is not None:
            resolved.acquire_lease(thread_id, worker, ttl=lease_ttl)
        if prefetch_unsettled:
            found.unsettled_at_start = None  # an older read is no snapshot of now
        return found

    active = None if new_run else current_scope.get()
    if active is not None and active.thread_id == thread_id and active.ledger.url == resolved.url:
        return leased(active)
    key = (resolved.url, thread_id)
    with _scopes_lock:
        scope = _scopes.get(key)
    if scope is not None and (not scope.run.terminal or not new_run):
        return leased(scope)
    run: RunRecord | None = None
    if not new_run:
        latest = resolved.latest_run(thread_id)
        if latest is not None and latest.terminal:
            run = latest
            if lease_ttl is not None:
                resolved.acquire_lease(thread_id, worker, ttl=lease_ttl)
    unsettled: list[EffectRecord] | None = None
    if run is None:
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
    with _scopes_lock:
        _scopes[(ledger.url, thread_id)] = scope
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
    with _scopes_lock:
        scope = _scopes.get((ledger.url, thread_id))
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
    worker = owner or WORKER_ID
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
    with _scopes_lock:
        return _scopes.get((ledger.url, thread_id))


def drop_scope(scope: RunScope) -> None:
    """Forget a finished run's scope."""
    with _scopes_lock:
        if _scopes.get((scope.ledger.url, scope.thread_id)) is scope:
            del _scopes[(scope.ledger.url, scope.thread_id)]
    HUB.forget(scope.ledger, scope.run_id)


def is_cancelled() -> bool:
    """Inside a node or tool of a cancel-aware graph: was this run asked to stop?

    Like Temporal's ``activity.is_cancelled()``; long-running tools can poll it
    between chunks of work. False outside a run.
    """
    scope = current_scope.get()
    return scope.cancel_called() if scope is not None else False


__all__ = [
    "CONFIG_KEY_LEDGER",
    "DEFAULT_DB_URL",
    "ENV_DB",
    "HUB",
    "INTERRUPTED_REASON",
    "LEASES",
    "WORKER_ID",
    "CancelSignal",
    "LeaseKeeper",
    "RunScope",
    "ascope_for",
    "async_ledger_of",
    "check_durability",
    "coerce_ledger",
    "current_scope",
    "default_db_url",
    "drop_scope",
    "ephemeral_scope",
    "invocation_scope",
    "is_cancelled",
    "ledger_for_url",
    "peek_scope",
    "resolve_ledger",
    "scope_for",
    "thread_id_of",
    "worker_id",
]

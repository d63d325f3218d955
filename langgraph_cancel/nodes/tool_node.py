"""``EffectToolNode``: a drop-in ``ToolNode`` that never dispatches an effect twice.

Per batch: malformed calls are answered with error messages and recorded
``failed``; read-only calls run concurrently first; side-effecting calls then
run in plan order, reversible before irreversible, one at a time by default.
Before each dispatch the node checks the cancel signal and the approval state,
then writes the intent (``dispatched``) durably; only then does the call leave
the process. A re-run of the node (interrupt, crash, retry policy) replays
what the ledger already knows instead of calling the tool again.

Ledger I/O is batched where the semantics allow (see ``_Batch``): one read for
the batch's earlier records, one write planning its side effects, each call's
outcome written with the next call's intent, and the read-only outcomes
written together once the reads are back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar, cast

from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import get_config_list
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import (
    INVALID_TOOL_NAME_ERROR_TEMPLATE,
    ToolCallRequest,
    ToolRuntime,
    _handle_tool_error,
    _infer_handled_types,
)
from langgraph.runtime import Runtime
from pydantic import BaseModel, ValidationError
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from langgraph_cancel.checkpointers.durable import PLAN_SAVE_TIMEOUT, plan_checkpoint
from langgraph_cancel.effects import (
    CLASSIFIED_TOOLS,
    EffectSpec,
    Outcome,
    bound_idempotency_key,
    spec_of,
)
from langgraph_cancel.errors import (
    BatchSuperseded,
    DispatchRefusedError,
    DuplicateIdempotencyKeyError,
    EffectConflictError,
    IllegalTransitionError,
    LedgerError,
)
from langgraph_cancel.hooks import call_reconcile
from langgraph_cancel.hooks import run_sync as _run_sync
from langgraph_cancel.ledger import Ledger, derive_idempotency_key
from langgraph_cancel.nodes.supervision import (
    InFlight,
    Supervisor,
    call_outside_loop,
    current_supervisor,
    supervise,
    supervise_async,
)
from langgraph_cancel.runtime import (
    RunScope,
    check_durability,
    current_scope,
    invocation_scope,
    scope_for,
)
from langgraph_cancel.types import (
    CancelPolicy,
    EffectKind,
    EffectRecord,
    EffectStatus,
    NewEffect,
    TransitionRequest,
)

logger = logging.getLogger("langgraph_cancel.tools")

T = TypeVar("T")

HandleToolErrors = bool | str | Callable[..., str] | type[Exception] | tuple[type[Exception], ...]

NOT_RUN_CANCELLED = "Not run: the run was cancelled before this call was dispatched."
ABANDONED_READ = (
    "Not completed: the run was cancelled while this read-only call was in flight; "
    "it was abandoned (no side effect)."
)
_KIND_ORDER = {EffectKind.READ_ONLY: 0, EffectKind.REVERSIBLE: 1, EffectKind.IRREVERSIBLE: 2}
DEFAULT_CANCEL_TIMEOUT = 30.0
#: Longest an outcome of a concurrent batch waits to share its write with the
#: outcomes of the calls still in flight beside it (seconds).
OUTCOME_LINGER = 0.005
#: A read ``_run_reads_pooled`` leaves to ``_run_read``.
_NOT_POOLED: Any = object()
#: The stop a cancelled run task stands for (a server's runs.cancel, a disconnect).
INTERRUPTED_REASON = "run task cancelled (server cancel, disconnect or Ctrl-C)"

#: Tools known in this process by name: every ``effect(...)``-classified tool, plus
#: the tools of every EffectToolNode (unclassified ones included).
TOOL_REGISTRY: dict[str, BaseTool] = CLASSIFIED_TOOLS
_registry_lock = threading.Lock()


def message_payload(msg: ToolMessage) -> dict[str, Any]:
    """What the ledger keeps of a tool's answer, JSON-safe."""
    payload: dict[str, Any] = {"content": msg.content, "status": msg.status}
    if msg.artifact is not None:
        payload["artifact"] = msg.artifact
    return cast(dict[str, Any], json.loads(json.dumps(payload, default=str)))


def _canonical(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


def _call_identity(p: _Planned) -> tuple[str, str, str]:
    """What makes two calls of a batch one step: ledger id, tool and arguments."""
    return (p.ledger_id, p.tool.name, _canonical(p.call.get("args")))


def recorded_call(call: Any) -> ToolCall:
    """A call as the ledger records it, malformed or not: the tool's name as text
    (``"(none)"`` when it has none) and arguments that are an object.

    Whoever records a call and whoever later looks for its record compare this
    form, so the same malformed call twice finds one record, not two.
    """
    raw_name = call.get("name")
    name = raw_name if isinstance(raw_name, str) else "" if raw_name is None else str(raw_name)
    args = call.get("args")
    return cast(
        ToolCall,
        {
            "name": name or "(none)",
            "args": args if isinstance(args, dict) else {"__raw__": repr(args)},
            "id": str(call.get("id")),
        },
    )


def reused_call_id(call: ToolCall) -> str:
    """The ledger id of a call whose tool-call id already names another call's record.

    The id plus a digest of the call's tool and arguments: the same call gets the
    same id again (a re-run records nothing twice), another call another one.
    """
    content = f"{call.get('name')}\0{_canonical(call.get('args'))}"
    return f"{call['id']}~{hashlib.sha256(content.encode()).hexdigest()[:12]}"


def ensure_same_call(rec: EffectRecord, name: str, args: Any) -> None:
    """The check before acting on a found record: is it this call ("same step?")?

    Same tool and the recorded arguments, or the arguments an approved edit
    replaced. A re-run of the call (crash, interrupt, retry) always passes.

    Raises:
        EffectConflictError: The record is another call's: its tool-call id was
            reused (some providers number ids per message).
    """
    wanted = _canonical(args)
    if rec.tool == name and _canonical(rec.args) == wanted:
        return
    approval = rec.approval or {}
    if (
        rec.tool == name
        and approval.get("decision") == "edit"
        and _canonical(approval.get("original_args")) == wanted
    ):
        return
    raise EffectConflictError(
        rec.effect_id,
        rec.tool_call_id,
        f"{rec.tool} with {_canonical(rec.args)}, {rec.status.value}",
        f"{name} with {wanted}",
    )


def is_same_call(rec: EffectRecord, call: ToolCall) -> bool:
    """Whether ``rec`` records ``call`` (see ``ensure_same_call``)."""
    try:
        ensure_same_call(rec, str(call.get("name") or ""), call.get("args"))
    except EffectConflictError:
        return False
    return True


def find_own_record(
    ledger: Ledger, thread_id: str, call: ToolCall
) -> tuple[str, EffectRecord | None]:
    """The id this call is known by in the ledger, and its record if it has one.

    Its tool-call id, unless that names another call's record (a provider that
    numbers ids per message): then ``reused_call_id(call)``.
    """
    call_id = str(call["id"])
    rec = ledger.find_effect(thread_id, call_id)
    if rec is None or is_same_call(rec, call):
        return call_id, rec
    return moved_record(ledger, thread_id, call)


def moved_record(ledger: Ledger, thread_id: str, call: ToolCall) -> tuple[str, EffectRecord | None]:
    """``find_own_record`` for a call whose tool-call id names another call's record.

    Its id is ``reused_call_id(call)``, a digest of its tool and arguments, unless an
    approved edit changed the arguments since it was recorded: then its record is
    the one under this tool-call id that holds the edited arguments.
    """
    own = reused_call_id(call)
    rec = ledger.find_effect(thread_id, own)
    if rec is not None:
        return own, rec
    for moved in ledger.find_moved(thread_id, str(call["id"])):
        if is_same_call(moved, call):
            return moved.tool_call_id, moved
    return own, None


def replay_message(rec: EffectRecord, call: ToolCall | None = None) -> ToolMessage:
    """The ToolMessage a recorded effect stands for, without calling anything."""
    tool_call_id = call["id"] if call is not None and call.get("id") else rec.tool_call_id
    status: Literal["success", "error"] = "success"
    content: Any
    artifact = None
    if rec.status in (
        EffectStatus.COMMITTED,
        EffectStatus.COMPENSATING,
        EffectStatus.COMPENSATED,
        EffectStatus.COMPENSATION_FAILED,
    ):
        result = rec.result
        if isinstance(result, dict) and "content" in result:
            content = result["content"]
            artifact = result.get("artifact")
            status = "error" if result.get("status") == "error" else "success"
        else:
            content = result if isinstance(result, str) else json.dumps(result, default=str)
    elif rec.status is EffectStatus.FAILED:
        content, status = rec.error or "Error: the call failed.", "error"
    elif rec.status is EffectStatus.REJECTED:
        note = (rec.approval or {}).get("message")
        content = f"Rejected by reviewer: {note}" if note else "Rejected by reviewer."
        status = "error"
    elif rec.status is EffectStatus.DROPPED:
        content, status = rec.error or NOT_RUN_CANCELLED, "error"
    elif rec.status is EffectStatus.UNKNOWN:
        content = (
            f"Outcome unknown: {rec.error or 'no answer from the external system'}. "
            f"Owner: {rec.owner}. Next action: {rec.next_action}. Do not retry this call."
        )
        status = "error"
    elif rec.status is EffectStatus.NOT_APPLIED:
        content, status = "Not applied: the external system has no record of this call.", "error"
    else:
        content, status = f"Call is {rec.status.value}.", "error"
    return ToolMessage(
        content=content, name=rec.tool, tool_call_id=tool_call_id, status=status, artifact=artifact
    )


@dataclass(slots=True)
class _Planned:
    index: int
    call: ToolCall
    tool: BaseTool
    spec: EffectSpec
    key: str
    runtime: ToolRuntime[Any, Any]
    #: The id the ledger knows this call by, when not its tool-call id.
    own_id: str | None = None

    @property
    def call_id(self) -> str:
        """The tool-call id (checked non-empty when the call was classified)."""
        return str(self.call["id"])

    @property
    def ledger_id(self) -> str:
        """The id of this call's ledger record: its tool-call id, or ``own_id``."""
        return self.own_id or self.call_id

    def needs_own_id(self, rec: EffectRecord) -> bool:
        """Whether ``rec``, found under this call's tool-call id, is another call's."""
        return self.own_id is None and not is_same_call(rec, self.call)

    def under_own_id(self, thread_id: str, own: str) -> _Planned:
        """This call under the id of its own record (see ``moved_record``): its
        tool-call id names another call's record.

        A key derived from the tool-call id is derived from the new id too; a
        declared key stays what the tool declares.
        """
        key = (
            self.key
            if self.spec.idempotency_key is not None
            else derive_idempotency_key(thread_id, own)
        )
        return replace(self, key=key, own_id=own)

    def new_effect(self, **fields: Any) -> NewEffect:
        """This call as a ledger row for ``plan_many`` (``fields``: status, result...)."""
        return NewEffect(
            tool_call_id=self.ledger_id,
            tool=self.tool.name,
            kind=self.spec.kind,
            args=self.call["args"],
            idempotency_key=self.key,
            seq=self.index,
            **fields,
        )


@dataclass(slots=True)
class _Batch:
    """One node execution's ledger I/O, folded into as few statements as it allows.

    ``records``: what the ledger already holds for the batch's calls (one read),
    then the side effects' new records (one write). ``reads``: read-only outcomes,
    recorded together once every read is back (nothing outside changed, so no
    intent is owed before they run). ``outcome``: the last side effect's success,
    written with the next call's intent (one round trip) or when the loop ends.
    """

    records: dict[str, EffectRecord] = field(default_factory=dict)
    reads: dict[int, NewEffect] = field(default_factory=dict)
    outcome: TransitionRequest | None = None
    #: Side effects dispatched concurrently: their intents and outcomes, grouped.
    commits: _GroupCommit | None = None

    def take_outcome(self) -> TransitionRequest | None:
        """The deferred outcome, handed over once."""
        outcome, self.outcome = self.outcome, None
        return outcome


class _GroupCommit:
    """Compare-and-sets asked for by concurrent calls, written together.

    Each call still waits for its own write (an intent before its dispatch, an
    outcome after it); the requests made while a write is on its way, or in the
    same turn of the event loop, go together in the next ``transition_many``.

    An outcome may wait a little (``OUTCOME_LINGER``) for the outcomes of the
    calls still in flight: calls dispatched together tend to finish together,
    and their outcomes then share one round trip instead of a chain of them.
    Nothing lingers while an intent is waiting (a dispatch is behind it) or a
    call waits for a dispatch slot, and the wait ends once no call is in flight:
    the batch ends no later for it, and an outcome reaches the ledger at most
    ``OUTCOME_LINGER`` later than it could have.
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.waiting: list[
            tuple[TransitionRequest, asyncio.Future[EffectRecord | LedgerError]]
        ] = []
        self.writing = False
        self.in_flight = 0
        self.waiting_for_slot = 0
        self._changed: asyncio.Event | None = None

    @contextlib.contextmanager
    def queued(self) -> Iterator[None]:
        """A call of the group waits for a dispatch slot (no outcome lingers then:
        the slot it waits for may be the lingering call's)."""
        self.waiting_for_slot += 1
        self._wake()
        try:
            yield
        finally:
            self.waiting_for_slot -= 1

    def started(self) -> None:
        """A call of the group was dispatched: its outcome is coming."""
        self.in_flight += 1

    def finished(self) -> None:
        """A call of the group returned (or its wait was given up)."""
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def write(self, req: TransitionRequest) -> EffectRecord | LedgerError:
        """``req``'s compare-and-set: the moved record, or the error ``transition`` raises."""
        done: asyncio.Future[EffectRecord | LedgerError] = (
            asyncio.get_running_loop().create_future()
        )
        self.waiting.append((req, done))
        self._wake()
        if not self.writing:
            self.writing = True
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._drain()))
        return await done

    def _only_outcomes(self) -> bool:
        return all(req.to is not EffectStatus.DISPATCHED for req, _ in self.waiting)

    async def _linger(self) -> None:
        """Wait while only outcomes are waiting and calls are still in flight."""
        deadline = time.monotonic() + OUTCOME_LINGER
        if self._changed is None:
            self._changed = asyncio.Event()
        while self.in_flight > 0 and not self.waiting_for_slot and self._only_outcomes():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def _drain(self) -> None:
        try:
            while self.waiting:
                await self._linger()
                # One request per effect a write (the same call twice in a batch asks
                # twice): a repeat waits for the next write, which tells it it lost.
                group: list[tuple[TransitionRequest, Any]] = []
                later: list[tuple[TransitionRequest, Any]] = []
                seen: set[str] = set()
                for item in self.waiting:
                    (later if item[0].effect_id in seen else group).append(item)
                    seen.add(item[0].effect_id)
                self.waiting = later
                try:
                    results = await _db(self.ledger.transition_many, [r for r, _ in group])
                except Exception as exc:  # the whole group failed: each waiter is told
                    for _, done in group:
                        if not done.done():
                            done.set_exception(exc)
                    continue
                for (_, done), result in zip(group, results, strict=True):
                    if not done.done():
                        done.set_result(result)
        finally:
            self.writing = False


class EffectToolNode(ToolNode):
    """Run effect-classified tool calls so that none is ever dispatched twice.

    Swap it in for ``ToolNode``; it takes the same arguments plus a few of its own.

    Args:
        tools: Tools (``BaseTool`` or callables); classify them with ``effect(...)``.
            An unclassified tool counts as irreversible (one warning names it).
        name: Node name.
        tags: Tags for tracing.
        handle_tool_errors: As in ``ToolNode``; default ``True``: every tool
            failure becomes an error ToolMessage for the model.
        messages_key: State key holding the messages.
        wrap_tool_call: As in ``ToolNode``; wraps the ledger-guarded execution.
        awrap_tool_call: Async twin of ``wrap_tool_call``.
        ledger: The ledger (or its URL); default: found through the run's config.
        effect_concurrency: Side-effecting calls dispatched at once (default 1:
            plan order, so a cancel mid-batch costs nothing it need not). Above 1,
            each call still writes its intent before its dispatch, but the intents
            and outcomes of calls in flight together share round trips.
        cancel_timeout: Seconds an in-flight side-effecting call may take to
            finish once its task is cancelled, before it is recorded unknown.
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
        handle_tool_errors: HandleToolErrors = True,
        messages_key: str = "messages",
        wrap_tool_call: Any = None,
        awrap_tool_call: Any = None,
        ledger: Ledger | str | None = None,
        effect_concurrency: int = 1,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
        checkpoint_timeout: float = PLAN_SAVE_TIMEOUT,
    ) -> None:
        super().__init__(
            tools,
            name=name,
            tags=tags,
            handle_tool_errors=handle_tool_errors,
            messages_key=messages_key,
            wrap_tool_call=wrap_tool_call,
            awrap_tool_call=awrap_tool_call,
        )
        if effect_concurrency < 1:
            raise ValueError("effect_concurrency must be at least 1")
        if not checkpoint_timeout > 0:
            raise ValueError("checkpoint_timeout must be a positive number of seconds")
        self.ledger = ledger
        self.effect_concurrency = effect_concurrency
        self.cancel_timeout = cancel_timeout
        self.checkpoint_timeout = checkpoint_timeout
        self.specs: dict[str, EffectSpec] = {
            tool_name: spec_of(t) for tool_name, t in self.tools_by_name.items()
        }
        with _registry_lock:
            TOOL_REGISTRY.update(self.tools_by_name)

    # ------------------------------------------------------------ LangGraph
    def _func(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        def run_batch() -> Any:
            return _run_sync(self._abatch(input, config, runtime))

        if not self._batch_in_worker(input, async_graph=False):
            return run_batch()
        # Given up on a call (recorded unknown), the supervisor runs the batch again, as
        # after a crash: recorded answers are replayed, the calls behind it dropped.
        return supervise(run_batch, lambda _call: run_batch())

    def _batch_in_worker(self, input: Any, *, async_graph: bool) -> bool:
        """Whether the batch runs in a supervised worker thread (``nodes/supervision.py``).

        A sync graph's batch does when it has side effects to run one at a time
        (each then runs in the worker, with no hand-over); an async graph's when
        every call names a tool with a sync body, so that nothing in the batch
        needs the graph's event loop.
        """
        if self._wrap_tool_call is not None or self._awrap_tool_call is not None:
            return False
        if not async_graph and self.effect_concurrency != 1:
            return False
        try:
            tool_calls, _ = self._parse_input(input)
        except Exception:
            return False  # _abatch reports it
        effects = False
        for call in tool_calls:
            name = call.get("name") if isinstance(call, Mapping) else None
            tool = self.tools_by_name.get(name) if isinstance(name, str) else None
            spec = self.specs.get(name) if isinstance(name, str) else None
            if tool is None or spec is None:
                continue  # answered as a malformed call: nothing runs
            if not _has_sync_body(tool):
                if async_graph:
                    return False
                continue
            effects = effects or (
                spec.kind is not EffectKind.READ_ONLY or spec.requires_approval is not None
            )
        return async_graph or effects

    async def _afunc(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        if not self._batch_in_worker(input, async_graph=True):
            return await self._abatch_on_loop(input, config, runtime)

        async def take_over(call: InFlight) -> Any:
            # As in a sync graph (see _func), on this loop.
            return await self._abatch_on_loop(input, config, runtime)

        return await supervise_async(
            lambda: _run_sync(self._abatch(input, config, runtime)),
            take_over,
            self._record_task_cancel,
            wait_after_cancel=self.cancel_timeout,
        )

    async def _abatch_on_loop(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        """The batch on the graph's event loop, its blocking work in threads."""
        token = _offload.set(True)
        try:
            return await self._abatch(input, config, runtime)
        finally:
            _offload.reset(token)

    @staticmethod
    def _record_task_cancel(sup: Supervisor) -> None:
        """An async graph's task was cancelled while its batch ran in a worker: record
        the stop (a call in flight is then waited for, as ``_settle_after_task_cancel``
        does; without one, the graph records the same stop when it unwinds)."""
        scope = sup.scope
        if scope is None:
            return
        in_flight = sup.in_flight() is not None
        try:
            scope.ledger.request_cancel(
                scope.thread_id,
                reason="run task cancelled" if in_flight else INTERRUPTED_REASON,
                requested_by="asyncio" if in_flight else "runtime",
            )
        except Exception:  # the outcome of the call in flight matters more than the flag
            logger.warning("could not flag run %s as cancel_requested", scope.run_id, exc_info=True)

    async def _abatch(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        check_durability(config)
        tool_calls, input_type = self._parse_input(input)
        scope = invocation_scope(config, self.ledger)
        if scope is None or scope.run.terminal:
            scope = await _db(scope_for, config, ledger=self.ledger)
        sup = current_supervisor.get()
        if sup is not None:
            sup.scope = scope
        token = current_scope.set(scope)
        try:
            outputs = await self._run_batch(input, config, runtime, tool_calls, input_type, scope)
        finally:
            current_scope.reset(token)
        return self._combine_tool_outputs(outputs, input_type)

    # ---------------------------------------------------------------- batch
    async def _run_batch(
        self,
        input: Any,
        config: RunnableConfig,
        runtime: Runtime[Any],
        tool_calls: list[ToolCall],
        input_type: Literal["list", "dict", "tool_calls"],
        scope: RunScope,
    ) -> list[Any]:
        tool_calls = [_as_tool_call(call) for call in tool_calls]
        config_list = get_config_list(config, len(tool_calls))
        outputs: list[Any] = [None] * len(tool_calls)
        reads: list[_Planned] = []
        effects: list[_Planned] = []
        runtimes: list[ToolRuntime[Any, Any]] = []
        for call, cfg in zip(tool_calls, config_list, strict=False):
            tool_runtime = ToolRuntime(
                state=self._extract_state(input, cfg),
                tool_call_id=call["id"],
                config=cfg,
                context=runtime.context,
                store=runtime.store,
                stream_writer=runtime.stream_writer,
                tools=list(self.tools_by_name.values()),
                execution_info=runtime.execution_info,
                server_info=runtime.server_info,
            )
            runtimes.append(tool_runtime)
        # A wrapper (wrap_tool_call) may re-run or rewrite a call: record per call then.
        batch = _Batch() if self._wrap_tool_call is None and self._awrap_tool_call is None else None
        # A sync graph's reads start in the pool while the ledger is asked about them.
        overlap = batch is not None and not _offload.get()

        def sort() -> list[_Planned]:
            """Classify the calls; the reads' records (one hop off the loop for both)."""
            for index, (call, tool_runtime) in enumerate(zip(tool_calls, runtimes, strict=True)):
                planned, error = self._classify(index, call, tool_runtime, scope)
                if error is not None:
                    outputs[index] = error
                elif planned is not None:
                    # A read that needs approval goes the side-effect way: it must be
                    # approved, and its record moves through dispatched like any effect.
                    fast_read = planned.spec.kind is EffectKind.READ_ONLY and not _needs_approval(
                        planned.spec, planned.call.get("args") or {}
                    )
                    (reads if fast_read else effects).append(planned)
            if batch is not None and reads and not overlap:
                return self._find_read_records(reads, batch, scope)
            return reads

        reads = await _db(sort)

        async def run_read(p: _Planned, req: ToolCallRequest, it: Any, sc: RunScope) -> Any:
            return await self._run_read(p, req, it, sc, batch)

        async def run_effect(p: _Planned, req: ToolCallRequest, it: Any, sc: RunScope) -> Any:
            return await self._run_effect(p, req, it, sc, batch)

        if reads:
            rest = reads
            try:
                if overlap:
                    # A sync graph: fresh reads run in a thread pool, as ToolNode runs
                    # its calls, without an asyncio task and wait per call.
                    assert batch is not None
                    answers, reads = call_outside_loop(
                        self._run_reads_pooled, reads, input_type, scope, batch
                    )
                    rest = []
                    for p, out in zip(reads, answers, strict=True):
                        if out is _NOT_POOLED:
                            rest.append(p)
                        else:
                            outputs[p.index] = out
                results = await asyncio.gather(
                    *(self._guarded(p, input_type, scope, run_read) for p in rest)
                )
            finally:
                if batch is not None and batch.reads:
                    await _db(self._record_reads, batch, scope)
            for p, out in zip(rest, results, strict=True):
                outputs[p.index] = out

        effects.sort(key=lambda p: (_KIND_ORDER[p.spec.kind], p.index))
        if batch is not None and effects:
            await _db(self._plan_effects, batch, effects, scope)
        if self.effect_concurrency == 1:
            try:
                for p in effects:
                    outputs[p.index] = await self._guarded(p, input_type, scope, run_effect)
            finally:
                if batch is not None and batch.outcome is not None:
                    await _db(self._flush_outcome, batch, scope)
        else:
            commits = _GroupCommit(scope.ledger) if batch is not None else None
            if batch is not None:
                batch.commits = commits
            limit = config.get("max_concurrency")
            sem = asyncio.Semaphore(min(self.effect_concurrency, limit or self.effect_concurrency))

            async def bounded(p: _Planned) -> Any:
                if commits is None:
                    async with sem:
                        return await self._guarded(p, input_type, scope, run_effect)
                with commits.queued():
                    await sem.acquire()
                try:
                    return await self._guarded(p, input_type, scope, run_effect)
                finally:
                    sem.release()

            # The same call twice in the batch (same id, tool and arguments) is one
            # step: run it once and give each copy its answer, instead of letting the
            # copy find its twin in flight.
            first: dict[tuple[str, str, str], _Planned] = {}
            copies: list[tuple[_Planned, _Planned]] = []
            for p in effects:
                twin = first.setdefault(_call_identity(p), p)
                if twin is not p:
                    copies.append((p, twin))
            unique = list(first.values())
            results = await asyncio.gather(*(bounded(p) for p in unique))
            for p, out in zip(unique, results, strict=True):
                outputs[p.index] = out
            for p, twin in copies:
                out = outputs[twin.index]
                outputs[p.index] = out.model_copy() if isinstance(out, ToolMessage) else out
        return outputs

    def _plan_effects(self, batch: _Batch, effects: list[_Planned], scope: RunScope) -> None:
        """Record every side-effecting call of the batch as planned, in one statement.

        A call whose key another effect holds is left out: its own planning
        (``_plan_effect``) records and explains the clash.
        """
        todo = list(range(len(effects)))
        while todo:
            entries = scope.ledger.plan_many(
                thread_id=scope.thread_id,
                run_id=scope.run_id,
                items=[effects[i].new_effect() for i in todo],
                owner=scope.owner,
                actor=scope.owner,
            )
            moved: list[int] = []
            for i, entry in zip(todo, entries, strict=True):
                if not isinstance(entry, tuple):
                    continue
                rec, created = entry
                if not created and effects[i].needs_own_id(rec):
                    # The id names another call's record: this call goes under its own,
                    # found (an earlier pass, an approval) or planned in the next round.
                    own, found = moved_record(scope.ledger, scope.thread_id, effects[i].call)
                    effects[i] = effects[i].under_own_id(scope.thread_id, own)
                    if found is None:
                        moved.append(i)
                        continue
                    rec = found
                batch.records[effects[i].ledger_id] = rec
            todo = moved

    def _find_read_records(
        self, reads: list[_Planned], batch: _Batch, scope: RunScope
    ) -> list[_Planned]:
        """What the ledger holds for the batch's reads (one read); the reads, each under
        the id of its own record (another read only when an id names another call's)."""
        ledger = scope.ledger
        batch.records = ledger.find_effects(scope.thread_id, [p.ledger_id for p in reads])
        out = list(reads)
        moved = [
            i
            for i, p in enumerate(reads)
            if (rec := batch.records.get(p.ledger_id)) is not None and p.needs_own_id(rec)
        ]
        for i in moved:
            own, found = moved_record(ledger, scope.thread_id, reads[i].call)
            out[i] = reads[i].under_own_id(scope.thread_id, own)
            if found is not None:
                batch.records[own] = found
        return out

    def _record_reads(self, batch: _Batch, scope: RunScope) -> None:
        """Record the batch's read-only outcomes together (one statement)."""
        # Reads finish in any order; call order decides which one keeps a shared key.
        items = [batch.reads[i] for i in sorted(batch.reads)]
        batch.reads = {}
        entries = scope.ledger.record_many(
            thread_id=scope.thread_id,
            run_id=scope.run_id,
            items=items,
            owner=scope.owner,
            actor=scope.owner,
        )
        # A read whose declared key another call holds: keep its outcome under the
        # key derived from this call, so no row is lost.
        clashed = [
            replace(
                item,
                idempotency_key=(
                    f"{item.idempotency_key}#duplicate:{scope.thread_id}:{item.tool_call_id}"
                ),
                detail={**(item.detail or {}), "duplicate_key": item.idempotency_key},
            )
            for item, entry in zip(items, entries, strict=True)
            if isinstance(entry, DuplicateIdempotencyKeyError)
        ]
        if clashed:
            scope.ledger.record_many(
                thread_id=scope.thread_id,
                run_id=scope.run_id,
                items=clashed,
                owner=scope.owner,
                actor=scope.owner,
            )

    def _classify(
        self, index: int, call: ToolCall, tool_runtime: ToolRuntime[Any, Any], scope: RunScope
    ) -> tuple[_Planned | None, ToolMessage | None]:
        """Validate a call; record and answer it at once when it is malformed."""
        name = call.get("name") or ""
        call_id = call.get("id") or ""
        if not call_id:
            return None, ToolMessage(
                content="Error: tool call without an id cannot be tracked; not run.",
                name=name,
                tool_call_id="",
                status="error",
            )
        tool = self.tools_by_name.get(name)
        if tool is None:
            content = INVALID_TOOL_NAME_ERROR_TEMPLATE.format(
                requested_tool=name, available_tools=", ".join(self.tools_by_name)
            )
            self._record_malformed(scope, call, name, EffectKind.IRREVERSIBLE, content)
            return None, ToolMessage(content, name=name, tool_call_id=call_id, status="error")
        spec = self.specs[name]
        args = call.get("args")
        problem = _validate_args(tool, args)
        if problem is not None:
            content = (
                f"Error invoking tool '{name}' with kwargs {args!r} with error:\n {problem}\n"
                " Please fix the error and try again."
            )
            self._record_malformed(scope, call, name, spec.kind, content)
            return None, ToolMessage(content, name=name, tool_call_id=call_id, status="error")
        assert isinstance(args, dict)
        try:
            key = (
                str(spec.idempotency_key(args))
                if spec.idempotency_key is not None
                else derive_idempotency_key(scope.thread_id, call_id)
            )
        except Exception as exc:
            content = f"Error: cannot derive the idempotency key of {name!r}: {exc!r}"
            self._record_malformed(scope, call, name, spec.kind, content)
            return None, ToolMessage(content, name=name, tool_call_id=call_id, status="error")
        return _Planned(index, call, tool, spec, key, tool_runtime), None

    def _record_malformed(
        self, scope: RunScope, call: ToolCall, name: str, kind: EffectKind, content: str
    ) -> None:
        # The call as recorded: the same call again finds this record as its own.
        recorded = recorded_call({**call, "name": name})
        for call_id in (str(recorded["id"]), reused_call_id(recorded)):
            rec, created = scope.ledger.plan(
                thread_id=scope.thread_id,
                run_id=scope.run_id,
                tool_call_id=call_id,
                tool=recorded["name"],
                kind=kind,
                args=recorded["args"],
                status=EffectStatus.FAILED,
                error=content,
                owner=scope.owner,
                actor=scope.owner,
                detail={"malformed": True},
            )
            if created or is_same_call(rec, recorded):
                return  # recorded now, or by an earlier run of this same call

    async def _guarded(
        self,
        p: _Planned,
        input_type: Literal["list", "dict", "tool_calls"],
        scope: RunScope,
        runner: Callable[
            [_Planned, ToolCallRequest, Literal["list", "dict", "tool_calls"], RunScope], Any
        ],
    ) -> Any:
        request = ToolCallRequest(
            tool_call=p.call, tool=p.tool, state=p.runtime.state, runtime=p.runtime
        )
        wrapper = self._awrap_tool_call
        if wrapper is None and self._wrap_tool_call is None:
            return await runner(p, request, input_type, scope)

        if wrapper is not None:

            async def aexecute(req: ToolCallRequest) -> Any:
                return await runner(_replace_call(p, req), req, input_type, scope)

            return await wrapper(request, aexecute)

        loop = asyncio.get_running_loop()

        def execute(req: ToolCallRequest) -> Any:
            fut = asyncio.run_coroutine_threadsafe(
                runner(_replace_call(p, req), req, input_type, scope), loop
            )
            return fut.result()

        sync_wrapper = self._wrap_tool_call
        assert sync_wrapper is not None
        return await asyncio.to_thread(sync_wrapper, request, execute)

    # ---------------------------------------------------------------- reads
    async def _run_read(
        self,
        p: _Planned,
        request: ToolCallRequest,
        input_type: Literal["list", "dict", "tool_calls"],
        scope: RunScope,
        batch: _Batch | None = None,
    ) -> Any:
        ledger = scope.ledger
        if batch is not None:
            existing = batch.records.get(p.ledger_id)
        else:
            own_id, existing = await _db(find_own_record, ledger, scope.thread_id, p.call)
            if own_id != p.ledger_id:
                p = p.under_own_id(scope.thread_id, own_id)
        if existing is not None and (conflict := _conflict(p, existing)) is not None:
            return conflict
        if existing is not None and existing.settled:
            return replay_message(existing, p.call)
        if existing is not None:  # approved or in flight: the full lifecycle applies
            return await self._run_effect(p, request, input_type, scope)
        if await scope.signal.acancel_called():
            await _db(scope.signal.observe)
            await _db(self._drop, scope, p, existing)
            return _not_run(p)
        try:
            msg = await _await_read(
                asyncio.ensure_future(self._invoke(p, input_type, retry=True)), scope, p.spec
            )
        except GraphBubbleUp:
            raise
        except _Abandoned:
            await self._record_read(
                batch,
                p,
                scope,
                status=EffectStatus.FAILED,
                error=ABANDONED_READ,
                owner=scope.owner,
                actor=scope.owner,
                detail={"abandoned": True},
            )
            return ToolMessage(
                ABANDONED_READ, name=p.tool.name, tool_call_id=p.call_id, status="error"
            )
        except Exception as exc:
            content = self._error_content(exc)
            await self._record_read(
                batch,
                p,
                scope,
                status=EffectStatus.FAILED,
                error=content,
                owner=scope.owner,
                actor=scope.owner,
            )
            return ToolMessage(content, name=p.tool.name, tool_call_id=p.call_id, status="error")
        if isinstance(msg, ToolMessage):
            await self._record_read(
                batch,
                p,
                scope,
                status=EffectStatus.COMMITTED,
                result=message_payload(msg),
                owner=scope.owner,
                actor=scope.owner,
            )
        return msg

    def _run_reads_pooled(
        self,
        reads: list[_Planned],
        input_type: Literal["list", "dict", "tool_calls"],
        scope: RunScope,
        batch: _Batch,
    ) -> tuple[list[Any], list[_Planned]]:
        """A sync graph's reads: the same steps as ``_run_read``, the calls in a pool.

        The calls with a sync body are handed to the pool at once, each held until
        the ledger has said what it holds for the batch (``_find_read_records``, one
        read meanwhile): a fresh call then runs, a recorded one is left to
        ``_run_read`` (replayed, or run under its own id).

        The wait checks the cancel signal between timeouts; on cancel, reads that may
        be abandoned are (their threads finish on their own, their results unused),
        the others are waited for.

        Returns:
            Per read, its answer or ``_NOT_POOLED`` (``_run_read``'s to give); and the
            reads, each under the id of its own record.
        """
        if scope.cancel_called():
            looked_up = self._find_read_records(reads, batch, scope)
            fresh = [p for p in looked_up if p.ledger_id not in batch.records]
            scope.signal.observe()
            for p in fresh:
                self._drop(scope, p, None)
            dropped = {p.index for p in fresh}
            return [
                _not_run(p) if p.index in dropped else _NOT_POOLED for p in looked_up
            ], looked_up
        gate = threading.Event()
        run_these: set[int] = set()

        def held(p: _Planned) -> Any:
            gate.wait()
            if p.index not in run_these:
                return _NOT_POOLED
            return self._invoke_blocking(p, input_type)

        candidates = [p for p in reads if _has_sync_body(p.tool)]
        # The run's max_concurrency bounds the calls running at once, as it bounds
        # ToolNode's (a pool of that size for the batch).
        limit = reads[0].runtime.config.get("max_concurrency") if reads else None
        pool = (
            _tool_pool()
            if limit is None
            else concurrent.futures.ThreadPoolExecutor(
                limit, thread_name_prefix="langgraph-cancel-tool"
            )
        )
        try:
            submitted = [pool.submit(contextvars.copy_context().run, held, p) for p in candidates]
            try:
                looked_up = self._find_read_records(reads, batch, scope)
                held_ids = {p.index for p in candidates}
                run_these.update(
                    p.index
                    for p, before in zip(looked_up, reads, strict=True)
                    if p is before and p.index in held_ids and p.ledger_id not in batch.records
                )
            finally:
                gate.set()  # on a failed lookup nothing runs: every held call returns at once
            pooled = [p for p in looked_up if p.index in run_these]
            futures = [
                f for f, p in zip(submitted, candidates, strict=True) if p.index in run_these
            ]
            collected = self._collect_reads(pooled, futures, scope, batch)
        finally:
            if pool is not _pool:
                pool.shutdown(wait=False)  # an abandoned read's thread ends on its own
        answers = {p.index: out for p, out in zip(pooled, collected, strict=True)}
        return [answers.get(p.index, _NOT_POOLED) for p in looked_up], looked_up

    def _collect_reads(
        self,
        reads: list[_Planned],
        futures: list[concurrent.futures.Future[Any]],
        scope: RunScope,
        batch: _Batch,
    ) -> list[Any]:
        """Wait for the pooled reads (abandoning what may be on cancel); their answers."""
        pending = set(futures)
        abandoned: set[concurrent.futures.Future[Any]] = set()
        observed = False
        while pending:
            _done, pending = concurrent.futures.wait(pending, timeout=0.05)
            if pending and not observed and scope.cancel_called():
                observed = True
                scope.signal.observe()
                for fut, p in zip(futures, reads, strict=True):
                    if fut in pending and p.spec.cancel_policy is CancelPolicy.ABANDON:
                        fut.cancel()
                        abandoned.add(fut)
                pending -= abandoned
        out: list[Any] = []
        failure: BaseException | None = None  # raised once every other outcome is noted
        for fut, p in zip(futures, reads, strict=True):
            if fut in abandoned:
                self._note_read(
                    batch,
                    p,
                    status=EffectStatus.FAILED,
                    error=ABANDONED_READ,
                    detail={"abandoned": True},
                )
                out.append(
                    ToolMessage(
                        ABANDONED_READ, name=p.tool.name, tool_call_id=p.call_id, status="error"
                    )
                )
                continue
            exc = fut.exception()
            if isinstance(exc, GraphBubbleUp) or (
                exc is not None and not isinstance(exc, Exception)
            ):
                failure = failure or exc
                out.append(None)
                continue
            if exc is not None:
                try:
                    content = self._error_content(exc)
                except Exception as unhandled:  # handle_tool_errors does not cover it
                    failure = failure or unhandled
                    out.append(None)
                    continue
                self._note_read(batch, p, status=EffectStatus.FAILED, error=content)
                out.append(
                    ToolMessage(content, name=p.tool.name, tool_call_id=p.call_id, status="error")
                )
                continue
            msg = fut.result()
            if isinstance(msg, ToolMessage):
                self._note_read(
                    batch, p, status=EffectStatus.COMMITTED, result=message_payload(msg)
                )
            out.append(msg)
        if failure is not None:
            raise failure
        return out

    def _note_read(self, batch: _Batch, p: _Planned, **fields: Any) -> None:
        """A read's outcome, kept for the batch's one write."""
        batch.reads[p.index] = p.new_effect(
            status=fields["status"],
            result=fields.get("result"),
            error=fields.get("error"),
            detail=fields.get("detail"),
        )

    async def _record_read(
        self, batch: _Batch | None, p: _Planned, scope: RunScope, **fields: Any
    ) -> None:
        """A read's outcome: kept for the batch's one write, or written now."""
        if batch is None:
            await _db(self._plan_call, p, scope, **fields)
            return
        self._note_read(batch, p, **fields)

    # -------------------------------------------------------------- effects
    async def _run_effect(
        self,
        p: _Planned,
        request: ToolCallRequest,
        input_type: Literal["list", "dict", "tool_calls"],
        scope: RunScope,
        batch: _Batch | None = None,
    ) -> Any:
        # Planned with the batch (one statement), once: a repeated tool-call id plans again.
        known = batch.records.pop(p.ledger_id, None) if batch is not None else None
        if batch is not None and batch.outcome is not None and not _dispatchable(p, known):
            # Only a fresh dispatch carries the previous call's outcome along.
            await _db(self._flush_outcome, batch, scope)
        planned = known if known is not None else await _db(self._plan_effect, p, scope)
        if isinstance(planned, EffectRecord) and p.needs_own_id(planned):
            # The id names another call's record: this call goes under its own.
            own, found = await _db(moved_record, scope.ledger, scope.thread_id, p.call)
            p = p.under_own_id(scope.thread_id, own)
            planned = found if found is not None else await _db(self._plan_effect, p, scope)
        if isinstance(planned, ToolMessage):
            return planned  # the key belongs to another effect: not dispatched
        if (conflict := _conflict(p, planned)) is not None:
            return conflict
        rec = planned
        if rec.status is EffectStatus.DISPATCHED:
            # Left in flight by an earlier attempt (crash, cancelled task): settle it first.
            rec = await self._settle_in_flight(p, rec, scope)
            if rec.status is EffectStatus.DISPATCHED:
                return await self._dispatch(p, rec, input_type, scope, redispatch=True, batch=batch)
        if rec.status is EffectStatus.PENDING_APPROVAL:
            return await _db(self._refuse_unapproved, p, rec, scope)
        if rec.status in (EffectStatus.PLANNED, EffectStatus.APPROVED, EffectStatus.NOT_APPLIED):
            if rec.status is EffectStatus.PLANNED and _needs_approval(p.spec, rec.args):
                return await _db(self._refuse_unapproved, p, rec, scope)
            return await self._dispatch(p, rec, input_type, scope, batch=batch)
        return replay_message(rec, p.call)

    def _plan_call(self, p: _Planned, scope: RunScope, **fields: Any) -> tuple[EffectRecord, bool]:
        """Record this call in the ledger (or find its record): ``(record, created)``."""
        return scope.ledger.plan(
            thread_id=scope.thread_id,
            run_id=scope.run_id,
            tool_call_id=p.ledger_id,
            tool=p.tool.name,
            kind=p.spec.kind,
            args=p.call["args"],
            idempotency_key=fields.pop("idempotency_key", p.key),
            seq=p.index,
            **fields,
        )

    def _plan_effect(self, p: _Planned, scope: RunScope) -> EffectRecord | ToolMessage:
        """The call's record (new or from an earlier attempt), or why it cannot have one.

        An idempotency key already held by another effect (the same refund asked
        for again, maybe in another thread) means the external system would
        treat this call as that one: it is not dispatched, and the model is told.
        """
        ledger = scope.ledger
        try:
            rec, _created = self._plan_call(
                p,
                scope,
                owner=scope.owner,
                actor=scope.owner,
            )
        except DuplicateIdempotencyKeyError as exc:
            holder = ledger.effect_by_key(p.key)
            where = (
                f"effect {holder.effect_id} (thread {holder.thread_id}, {holder.status.value})"
                if holder is not None
                else "another effect"
            )
            text = (
                f"Not run: idempotency key {p.key!r} already belongs to {where}; the external "
                "system would treat this call as that one. "
                + (
                    f"Its recorded result: {replay_message(holder).content}"
                    if holder is not None and holder.status is EffectStatus.COMMITTED
                    else "Check that effect before asking again."
                )
            )
            self._plan_call(
                p,
                scope,
                idempotency_key=f"{p.key}#duplicate:{scope.thread_id}:{p.ledger_id}",
                status=EffectStatus.FAILED,
                error=text,
                owner=scope.owner,
                actor=scope.owner,
                detail={"duplicate_of": getattr(holder, "effect_id", None), "error": str(exc)},
            )
            return ToolMessage(text, name=p.tool.name, tool_call_id=p.call_id, status="error")
        return rec

    def _refuse_unapproved(self, p: _Planned, rec: EffectRecord, scope: RunScope) -> ToolMessage:
        text = (
            f"Not run: {p.tool.name!r} needs approval and has none. Put ApprovalGate "
            "between the model and this node."
        )
        try:
            rec = scope.ledger.transition(
                rec.effect_id,
                EffectStatus.DROPPED,
                actor=scope.owner,
                error=text,
                detail={"reason": "approval required"},
            )
        except IllegalTransitionError:
            rec = scope.ledger.get_effect(rec.effect_id)
            return replay_message(rec, p.call)
        return ToolMessage(text, name=p.tool.name, tool_call_id=p.call_id, status="error")

    def _drop(self, scope: RunScope, p: _Planned, existing: EffectRecord | None) -> None:
        if existing is None:
            self._plan_call(
                p,
                scope,
                status=EffectStatus.DROPPED,
                error=NOT_RUN_CANCELLED,
                owner=scope.owner,
                actor=scope.owner,
            )
        elif existing.status in (
            EffectStatus.PLANNED,
            EffectStatus.PENDING_APPROVAL,
            EffectStatus.APPROVED,
            EffectStatus.NOT_APPLIED,
        ):
            with contextlib.suppress(IllegalTransitionError):
                scope.ledger.transition(
                    existing.effect_id,
                    EffectStatus.DROPPED,
                    actor=scope.owner,
                    error=NOT_RUN_CANCELLED,
                )

    async def _dispatch(
        self,
        p: _Planned,
        rec: EffectRecord,
        input_type: Literal["list", "dict", "tool_calls"],
        scope: RunScope,
        *,
        redispatch: bool = False,
        batch: _Batch | None = None,
    ) -> Any:
        ledger = scope.ledger
        sup = current_supervisor.get() if batch is not None else None
        if sup is not None:
            sup.check()  # its caller took the batch over, or is gone: nothing more goes out
        plan = plan_checkpoint(p.runtime.config)
        if plan is not None and not plan.known_saved():
            # The step that asked for this call must be on disk before it goes out,
            # or a crash would lose the call and the resume ask for it anew.
            if _offload.get():
                await plan.await_saved(self.checkpoint_timeout)
            else:
                call_outside_loop(plan.wait, self.checkpoint_timeout)
        if batch is not None and batch.commits is not None and not redispatch:
            begun = await self._begin_grouped(p, rec, scope, batch.commits)
        else:
            begun = await _db(self._begin_dispatch, p, rec, scope, redispatch, batch)
        if isinstance(begun, ToolMessage):
            return begun
        rec = begun
        call = {**p.call, "args": rec.args}
        planned = replace(p, call=cast(ToolCall, call), key=rec.idempotency_key)
        task: asyncio.Future[Any] | concurrent.futures.Future[Any] | None = None
        _RUNNING.add(rec.effect_id)
        commits = batch.commits if batch is not None else None
        if commits is not None:
            commits.started()
        try:
            one_at_a_time = (
                batch is not None
                and self.effect_concurrency == 1
                and not _offload.get()
                and _has_sync_body(p.tool)
            )
            if one_at_a_time and sup is not None:
                # A supervised batch (a sync graph): the call runs in this worker thread.
                msg = call_outside_loop(
                    self._invoke_supervised, planned, rec, input_type, scope, sup
                )
            elif one_at_a_time:
                # The call in the pool, the wait here (nothing else runs on this
                # private loop meanwhile).
                task = _tool_pool().submit(
                    contextvars.copy_context().run,
                    self._invoke_blocking,
                    planned,
                    input_type,
                    retry=p.spec.retry_safe,
                )
                msg = call_outside_loop(_wait_in_flight, task, scope, self._grace(p.spec))
            else:
                task = asyncio.ensure_future(
                    self._invoke(planned, input_type, retry=p.spec.retry_safe)
                )
                msg = await _await_in_flight(task, scope, self._grace(p.spec))
        except _StoppedWaiting as stop:
            assert task is not None
            return await self._stop_waiting(planned, rec, task, scope, stop)
        except asyncio.CancelledError:
            # Our task was cancelled (runs.cancel, disconnect, Ctrl-C). The request has
            # left the process: wait for its outcome within the timeout, record it, then
            # let the cancellation propagate. Never drop the wait silently.
            if task is not None:
                waited = task if isinstance(task, asyncio.Future) else asyncio.wrap_future(task)
                await self._settle_after_task_cancel(planned, rec, waited, scope)
            raise
        except GraphInterrupt:
            # interrupt() inside the tool: the call paused before it finished, and
            # LangGraph re-runs it from its start on resume. Left "dispatched", the
            # re-run would declare it unknown and never deliver the answer.
            await _db(
                ledger.transition,
                rec.effect_id,
                EffectStatus.NOT_APPLIED,
                expected=[EffectStatus.DISPATCHED],
                actor=scope.owner,
                detail={"interrupted": True},
            )
            raise
        except GraphBubbleUp:
            raise
        except Exception as exc:
            return await self._record_failure(planned, rec, exc, scope)
        finally:
            if commits is not None:
                commits.finished()
            # Running until the call itself ends, even when the run stopped waiting.
            if task is None:
                _RUNNING.discard(rec.effect_id)
            else:
                effect_id = rec.effect_id

                def done_running(_: Any) -> None:
                    _RUNNING.discard(effect_id)

                task.add_done_callback(done_running)
        if batch is not None and self.effect_concurrency == 1:
            # Written with the next call's intent, or when the batch's loop ends.
            batch.outcome = self._success_request(planned, rec, msg, scope)
            return msg
        if batch is not None and batch.commits is not None:
            req = self._success_request(planned, rec, msg, scope)
            done = await batch.commits.write(req)
            if isinstance(done, LedgerError):
                _outcome_lost(req, done)
            return msg
        return await _db(self._record_success, planned, rec, msg, scope)

    def _grace(self, spec: EffectSpec) -> float:
        """How long a cancelled run still waits for this tool's in-flight call."""
        if spec.cancel_policy is CancelPolicy.RECONCILE:
            return 0.0
        return spec.cancel_timeout if spec.cancel_timeout is not None else self.cancel_timeout

    async def _stop_waiting(
        self,
        p: _Planned,
        rec: EffectRecord,
        task: asyncio.Future[Any] | concurrent.futures.Future[Any],
        scope: RunScope,
        stop: _StoppedWaiting,
    ) -> ToolMessage:
        """Record the still-running call as unknown; settle it if it finishes later."""
        unknown = await _db(mark_unknown, scope.ledger, rec, p.spec, str(stop))

        def settle_late(done: asyncio.Future[Any] | concurrent.futures.Future[Any]) -> None:
            if done.cancelled() or done.exception() is not None:
                return  # still unknown: reconciliation (or a person) settles it
            # Off the event loop: the callback runs on it.
            threading.Thread(
                target=record_late_outcome,
                args=(scope, rec, done.result()),
                name="langgraph-cancel-late",
                daemon=True,
            ).start()

        task.add_done_callback(settle_late)
        return replay_message(unknown, p.call)

    def _invoke_supervised(
        self,
        p: _Planned,
        rec: EffectRecord,
        input_type: Literal["list", "dict", "tool_calls"],
        scope: RunScope,
        sup: Supervisor,
    ) -> Any:
        """Run a dispatched call in this (worker) thread while the supervisor watches.

        Raises:
            BatchSuperseded: The supervisor gave up on the call while it ran (it recorded
                it unknown; its outcome is kept here) or had stopped before it began
                (the intent is durable: the call is settled as one left in flight).
        """
        grace = self._grace(p.spec)
        call = InFlight(
            scope=scope,
            grace=grace,
            give_up=lambda: mark_unknown(scope.ledger, rec, p.spec, str(_StoppedWaiting(grace))),
        )
        try:
            sup.begin(call)
        except BatchSuperseded:
            # Stopped between the intent and the call: it never left the process.
            with contextlib.suppress(LedgerError):
                scope.ledger.transition(
                    rec.effect_id,
                    EffectStatus.NOT_APPLIED,
                    expected=[EffectStatus.DISPATCHED],
                    actor=scope.owner,
                    detail={"never_sent": True, "reason": "the batch was stopped"},
                )
            raise
        try:
            msg = contextvars.copy_context().run(
                self._invoke_blocking,
                p,
                input_type,
                retry=p.spec.retry_safe,
            )
        except BaseException as exc:
            if sup.end(call):
                raise BatchSuperseded("gave up on the call in flight") from exc  # stays unknown
            raise
        if sup.end(call):
            record_late_outcome(scope, rec, msg)
            raise BatchSuperseded("gave up on the call in flight")
        return msg

    def _begin_dispatch(
        self,
        p: _Planned,
        rec: EffectRecord,
        scope: RunScope,
        redispatch: bool,
        batch: _Batch | None = None,
    ) -> EffectRecord | ToolMessage:
        """The check before acting: cancelled? then the durable intent, or why not.

        The previous call's deferred outcome, if any, goes in the same round trip.
        """
        ledger = scope.ledger
        outcome = batch.take_outcome() if batch is not None else None
        if scope.cancel_called() or redispatch:
            if outcome is not None:
                self._write_outcome(scope, outcome)
            if redispatch and not scope.cancel_called():
                return rec
            scope.signal.observe()
            self._drop(scope, p, rec)
            return replay_message(ledger.get_effect(rec.effect_id), p.call)
        intent = _intent(rec, scope)
        begun: EffectRecord | LedgerError
        try:
            if outcome is None:
                begun = ledger.transition(
                    intent.effect_id,
                    intent.to,
                    actor=intent.actor,
                    owner=intent.owner,
                    detail=intent.detail,
                )
            else:
                done, begun = ledger.transition_many([outcome, intent])
                if isinstance(done, LedgerError):
                    _outcome_lost(outcome, done)
        except (DispatchRefusedError, IllegalTransitionError) as exc:
            begun = exc
        return self._after_intent(p, rec, scope, begun)

    async def _begin_grouped(
        self, p: _Planned, rec: EffectRecord, scope: RunScope, commits: _GroupCommit
    ) -> EffectRecord | ToolMessage:
        """``_begin_dispatch`` of a concurrent call: its intent goes with its siblings'."""
        if await scope.signal.acancel_called():
            return await _db(self._begin_dispatch, p, rec, scope, False)  # drops it
        begun = await commits.write(_intent(rec, scope))
        if isinstance(begun, EffectRecord):
            return begun
        return await _db(self._after_intent, p, rec, scope, begun)

    def _after_intent(
        self, p: _Planned, rec: EffectRecord, scope: RunScope, begun: EffectRecord | LedgerError
    ) -> EffectRecord | ToolMessage:
        """The dispatched record, or the answer for a call whose intent was refused."""
        ledger = scope.ledger
        if isinstance(begun, EffectRecord):
            return begun
        if isinstance(begun, DispatchRefusedError):
            scope.signal.set()
            scope.signal.observe()
            self._drop(scope, p, rec)
            return replay_message(ledger.get_effect(rec.effect_id), p.call)
        if isinstance(begun, IllegalTransitionError):
            # Moved since it was read (a cancel node dropped it, a racing worker took
            # it; TransitionConflictError included): not ours to dispatch.
            return replay_message(ledger.get_effect(rec.effect_id), p.call)
        raise begun

    def _success_request(
        self, p: _Planned, rec: EffectRecord, msg: Any, scope: RunScope
    ) -> TransitionRequest:
        return TransitionRequest(
            effect_id=rec.effect_id,
            to=EffectStatus.COMMITTED,
            expected=frozenset({EffectStatus.DISPATCHED}),
            actor=scope.owner,
            result=outcome_payload(msg),
        )

    def _record_success(self, p: _Planned, rec: EffectRecord, msg: Any, scope: RunScope) -> Any:
        req = self._success_request(p, rec, msg, scope)
        scope.ledger.transition(
            req.effect_id, req.to, expected=req.expected, actor=req.actor, result=req.result
        )
        return msg

    def _write_outcome(self, scope: RunScope, req: TransitionRequest) -> None:
        (done,) = scope.ledger.transition_many([req])
        if isinstance(done, LedgerError):
            _outcome_lost(req, done)

    def _flush_outcome(self, batch: _Batch, scope: RunScope) -> None:
        """Write the deferred outcome now (the loop ended, or the next step is no dispatch)."""
        outcome = batch.take_outcome()
        if outcome is not None:
            self._write_outcome(scope, outcome)

    async def _record_failure(
        self, p: _Planned, rec: EffectRecord, exc: Exception, scope: RunScope
    ) -> Any:
        ledger = scope.ledger
        if isinstance(exc, p.spec.retryable):
            # A transient fault on a side effect: the request may have been applied.
            outcome = await call_reconcile(p.spec, rec.idempotency_key, rec.args)
            if outcome.status == "committed":
                result = {"content": _result_text(outcome.result), "status": "success"}
                await _db(
                    ledger.transition,
                    rec.effect_id,
                    EffectStatus.COMMITTED,
                    actor="reconciler",
                    result=result,
                    detail={"after_error": repr(exc)},
                )
                return ToolMessage(result["content"], name=p.tool.name, tool_call_id=p.call_id)
            if outcome.status == "not_applied":
                await _db(
                    ledger.transition,
                    rec.effect_id,
                    EffectStatus.NOT_APPLIED,
                    actor="reconciler",
                    error=repr(exc),
                    detail={"after_error": repr(exc)},
                )
                content = self._error_content(exc)
                return ToolMessage(
                    content, name=p.tool.name, tool_call_id=p.call_id, status="error"
                )
            rec = await _db(mark_unknown, ledger, rec, p.spec, f"{exc!r}; {outcome.reason}")
            return replay_message(rec, p.call)
        try:
            content = self._failure_content(exc)
        except Exception:
            # Propagating (handle_tool_errors does not cover it): the call raised, so it
            # did not apply. Say so before the error leaves, or the record stays
            # "dispatched" and a re-run (RetryPolicy, resume) declares it unknown.
            await _db(
                ledger.transition,
                rec.effect_id,
                EffectStatus.NOT_APPLIED,
                actor=scope.owner,
                error=repr(exc),
                detail={"propagated": True},
            )
            raise
        await _db(
            ledger.transition, rec.effect_id, EffectStatus.FAILED, actor=scope.owner, error=content
        )
        return ToolMessage(content, name=p.tool.name, tool_call_id=p.call_id, status="error")

    async def _settle_after_task_cancel(
        self, p: _Planned, rec: EffectRecord, task: asyncio.Future[Any], scope: RunScope
    ) -> None:
        timeout = p.spec.cancel_timeout or self.cancel_timeout
        try:
            await _db(
                scope.ledger.request_cancel,
                scope.thread_id,
                reason="run task cancelled",
                requested_by="asyncio",
            )
        except Exception:  # the outcome record below matters more than the flag
            logger.warning("could not flag run %s as cancel_requested", scope.run_id, exc_info=True)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if done:
            exc = task.exception()
            try:
                if exc is None:
                    await _db(self._record_success, p, rec, task.result(), scope)
                elif isinstance(exc, Exception):
                    await self._record_failure(p, rec, exc, scope)
            except Exception:
                logger.exception("could not record the outcome of %s", rec.effect_id)
            return
        task.cancel()
        await _db(
            mark_unknown,
            scope.ledger,
            rec,
            p.spec,
            f"still in flight {timeout:.0f}s after the run was cancelled",
        )

    async def _settle_in_flight(
        self, p: _Planned, rec: EffectRecord, scope: RunScope
    ) -> EffectRecord:
        """A record left ``dispatched`` by an earlier attempt: find out what happened."""
        ledger = scope.ledger
        if p.spec.reconcile is None:
            if p.spec.retry_safe:
                return await _db(
                    ledger.transition,
                    rec.effect_id,
                    EffectStatus.DISPATCHED,
                    expected=[EffectStatus.DISPATCHED],
                    actor=scope.owner,
                    owner=scope.owner,
                    detail={"retry_same_key": True, "idempotency_key": rec.idempotency_key},
                )
            return await _db(
                mark_unknown, ledger, rec, p.spec, "left in flight by an earlier attempt"
            )
        outcome = await call_reconcile(p.spec, rec.idempotency_key, rec.args)
        return await _db(apply_outcome, ledger, rec, p.spec, outcome, actor="reconciler")

    # ---------------------------------------------------------------- calls
    async def _invoke(
        self, p: _Planned, input_type: Literal["list", "dict", "tool_calls"], *, retry: bool
    ) -> Any:
        injected = self._inject_tool_args(p.call, p.runtime, p.tool)
        call_args = {**injected, "type": "tool_call"}
        sync = not _offload.get() and _has_sync_body(p.tool)

        async def once() -> Any:
            with bound_idempotency_key(p.key):
                try:
                    if sync:
                        # As ToolNode does in a sync graph: tool.invoke in a worker
                        # thread (ainvoke would add an async callback pass around it).
                        ctx = contextvars.copy_context()
                        response = await asyncio.get_running_loop().run_in_executor(
                            None, ctx.run, p.tool.invoke, call_args, p.runtime.config
                        )
                    else:
                        response = await p.tool.ainvoke(call_args, p.runtime.config)
                except ValidationError as exc:
                    raise ValueError(f"invalid arguments for {p.tool.name!r}: {exc}") from exc
            return self._normalize_tool_response(response, p.call, input_type)

        if not retry or p.spec.max_attempts <= 1:
            return await once()
        # A plain first attempt: building tenacity's retrier costs more than many
        # tools take, and most calls never fail.
        try:
            return await once()
        except p.spec.retryable:
            pass
        await asyncio.sleep(_FIRST_RETRY_WAIT)
        async for attempt in AsyncRetrying(**_later_attempts(p.spec)):
            with attempt:
                return await once()
        raise AssertionError("unreachable")  # pragma: no cover

    def _invoke_blocking(
        self, p: _Planned, input_type: Literal["list", "dict", "tool_calls"], *, retry: bool = True
    ) -> Any:
        """``_invoke`` of a sync tool, in the calling (worker) thread."""
        injected = self._inject_tool_args(p.call, p.runtime, p.tool)
        call_args = {**injected, "type": "tool_call"}

        def once() -> Any:
            with bound_idempotency_key(p.key):
                try:
                    response = p.tool.invoke(call_args, p.runtime.config)
                except ValidationError as exc:
                    raise ValueError(f"invalid arguments for {p.tool.name!r}: {exc}") from exc
            return self._normalize_tool_response(response, p.call, input_type)

        if not retry or p.spec.max_attempts <= 1:
            return once()
        try:
            return once()
        except p.spec.retryable:
            pass
        time.sleep(_FIRST_RETRY_WAIT)
        for attempt in Retrying(**_later_attempts(p.spec)):
            with attempt:
                return once()
        raise AssertionError("unreachable")  # pragma: no cover

    def _failure_content(self, exc: Exception) -> str:
        """The ToolMessage text for a side-effecting call that failed for sure."""
        return self._error_content(exc)

    def _error_content(self, exc: Exception) -> str:
        flag = self._handle_tool_errors
        if isinstance(flag, type) and issubclass(flag, Exception):
            handled: tuple[type[Exception], ...] = (flag,)
        elif isinstance(flag, tuple):
            handled = flag
        elif callable(flag) and not isinstance(flag, type):
            handled = _infer_handled_types(flag)
        else:
            handled = (Exception,)
        if not flag or not isinstance(exc, handled):
            raise exc
        return _handle_tool_error(exc, flag=flag)


# Backoff before a tool's second attempt; it doubles for each attempt after that.
_FIRST_RETRY_WAIT = 0.05


def _later_attempts(spec: EffectSpec) -> dict[str, Any]:
    """Tenacity's arguments for the attempts after a failed first one."""
    return {
        "retry": retry_if_exception_type(spec.retryable),
        "stop": stop_after_attempt(spec.max_attempts - 1),
        "wait": wait_exponential(multiplier=2 * _FIRST_RETRY_WAIT, max=2.0),
        "reraise": True,
    }


_pool_lock = threading.Lock()
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _tool_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process's pool for the read-only calls of sync graphs (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                thread_name_prefix="langgraph-cancel-tool"
            )
        return _pool


_offload: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "langgraph_cancel_offload", default=False
)


async def _db(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking ledger call: in a worker thread when on the graph's event loop.

    Async graphs (a LangGraph server's included) must not block their loop; sync
    graphs run this code on a private loop where a thread hop only costs time.
    """
    if _offload.get():
        return await asyncio.to_thread(fn, *args, **kwargs)
    # Blocking, on a private loop that nothing else uses meanwhile: a checker of
    # blocking calls (a LangGraph server's) must not take this thread for its loop's.
    return call_outside_loop(fn, *args, **kwargs)


def _conflict(p: _Planned, rec: EffectRecord) -> ToolMessage | None:
    """The answer for a call whose id names another call's record; None when it is its own."""
    try:
        ensure_same_call(rec, p.tool.name, p.call.get("args"))
    except EffectConflictError as exc:
        logger.warning("%s", exc)
        return ToolMessage(str(exc), name=p.tool.name, tool_call_id=p.call_id, status="error")
    return None


def _has_sync_body(tool: BaseTool) -> bool:
    """Whether ``tool.invoke`` works: not a ``Tool`` / ``StructuredTool`` made from a
    coroutine only."""
    return not (getattr(tool, "func", True) is None and getattr(tool, "coroutine", None))


class _Abandoned(Exception):
    """A read-only call given up on because the run was cancelled."""


async def _await_read(task: asyncio.Future[Any], scope: RunScope, spec: EffectSpec) -> Any:
    """Wait for a read; abandon it (cancel the wait) when the run is cancelled.

    Abandoning is only allowed for read-only tools (``cancel_policy='abandon'``,
    their default): nothing outside changes, so there is nothing to wait for.
    """
    if spec.cancel_policy is not CancelPolicy.ABANDON:
        return await _await_in_flight(task, scope)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.05)  # checks the flag; polls are throttled
            if not task.done() and await _db(scope.cancel_called):
                task.cancel()
                await _db(scope.signal.observe)
                raise _Abandoned
    except asyncio.CancelledError:
        task.cancel()
        raise
    return await task


class _StoppedWaiting(Exception):
    """A cancelled run stopped waiting for an in-flight side effect (it still runs)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"still in flight {seconds:g}s after the run was cancelled")


async def _await_in_flight(
    task: asyncio.Future[Any], scope: RunScope, grace: float | None = None
) -> Any:
    """Wait for a dispatched call, noting the cancel signal the moment it arrives.

    The request has left the process and the external system will process it,
    so the wait goes on after a cancel, for ``grace`` more seconds (``None``:
    until the end). Past that, ``_StoppedWaiting`` is raised; the call keeps
    running and its record becomes ``unknown`` with an owner, never dropped.
    """
    deadline: float | None = None
    while not task.done():
        await asyncio.wait({task}, timeout=0.05)  # checks the flag; polls are throttled
        if task.done():
            break
        if deadline is None and await _db(scope.cancel_called):
            await _db(scope.signal.observe)
            deadline = time.monotonic() + (grace if grace is not None else float("inf"))
        if deadline is not None and time.monotonic() >= deadline:
            raise _StoppedWaiting(grace or 0.0)
    return await task


def _wait_in_flight(
    fut: concurrent.futures.Future[Any], scope: RunScope, grace: float | None
) -> Any:
    """``_await_in_flight`` for a call in the pool, waited for by a blocked private loop."""
    deadline: float | None = None
    while True:
        # wait(), not result(timeout): a tool may raise TimeoutError itself.
        concurrent.futures.wait((fut,), timeout=0.05)
        if fut.done():
            return fut.result()
        if deadline is None and scope.cancel_called():
            scope.signal.observe()
            deadline = time.monotonic() + (grace if grace is not None else float("inf"))
        if deadline is not None and time.monotonic() >= deadline:
            raise _StoppedWaiting(grace or 0.0)


def _as_tool_call(call: Any) -> ToolCall:
    """A call whose name is a string and whose id is a string or ``None``.

    ``Send`` payloads reach the node unvalidated: a missing id, or a name or id
    of another type, must be answered as a malformed call, not crash the batch.
    """
    if not isinstance(call, Mapping):
        return cast(ToolCall, {"name": "", "args": call, "id": None})
    name, call_id = call.get("name"), call.get("id")
    if isinstance(name, str) and "id" in call and (call_id is None or isinstance(call_id, str)):
        return cast(ToolCall, call)
    return cast(
        ToolCall,
        {
            **call,
            "name": name if isinstance(name, str) else "" if name is None else str(name),
            "id": call_id if call_id is None or isinstance(call_id, str) else str(call_id),
        },
    )


def _dispatchable(p: _Planned, rec: EffectRecord | None) -> bool:
    """True when the call's next step is a fresh dispatch (a durable intent write)."""
    if rec is None:
        return False
    if rec.status is EffectStatus.PLANNED:
        return not _needs_approval(p.spec, rec.args)
    return rec.status in (EffectStatus.APPROVED, EffectStatus.NOT_APPLIED)


def _intent(rec: EffectRecord, scope: RunScope) -> TransitionRequest:
    """The durable intent written before a dispatch (the run guard applies)."""
    return TransitionRequest(
        effect_id=rec.effect_id,
        to=EffectStatus.DISPATCHED,
        actor=scope.owner,
        owner=scope.owner,
        detail={"idempotency_key": rec.idempotency_key},
    )


def _outcome_lost(req: TransitionRequest, error: LedgerError) -> None:
    """A recorded success another writer overtook: its record stands, say so loudly."""
    logger.warning(
        "could not record the outcome of %s as %s: %s", req.effect_id, req.to.value, error
    )


def _needs_approval(spec: EffectSpec, args: dict[str, Any]) -> bool:
    try:
        return spec.needs_approval(args)
    except Exception:  # a predicate that fails cannot waive approval
        return True


def _validate_args(tool: BaseTool, args: Any) -> str | None:
    if not isinstance(args, dict):
        return f"arguments must be an object, got {type(args).__name__}"
    if tool.args_schema is None:
        # A single-input ``Tool``: its schema is inferred from ``_run(*args, config, ...)``
        # and would refuse every call; the tool parses its own input when invoked.
        return None
    schema = tool.tool_call_schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            schema.model_validate(args)
        except ValidationError as exc:
            return "; ".join(
                f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}"
                for e in exc.errors()
            )
    return None


def _replace_call(p: _Planned, req: ToolCallRequest) -> _Planned:
    if req.tool_call is p.call:
        return p
    return replace(p, call=req.tool_call)


def _result_text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, default=str)


def unknown_owner(spec: EffectSpec) -> tuple[str, str]:
    """Who must act on an unknown outcome, and what they must do."""
    if spec.reconcile is not None:
        return (
            "reconciler",
            "run `langgraph-cancel reconcile THREAD` (asks the external system by idempotency "
            "key); if it still cannot tell, a person decides",
        )
    return (
        "operator",
        "check the external system for this idempotency key, then settle the effect as "
        "committed or not_applied (langgraph-cancel reconcile THREAD)",
    )


def _not_run(p: _Planned) -> ToolMessage:
    """The answer for a call the cancel stopped before it was dispatched."""
    return ToolMessage(NOT_RUN_CANCELLED, name=p.tool.name, tool_call_id=p.call_id, status="error")


def outcome_payload(msg: Any) -> dict[str, Any]:
    """What the ledger keeps of a successful call's answer (``replay_message`` reads it)."""
    if isinstance(msg, ToolMessage):
        return message_payload(msg)
    return {"content": f"(tool returned {type(msg).__name__})", "status": "success"}


def record_late_outcome(scope: RunScope, rec: EffectRecord, msg: Any) -> None:
    """A call recorded unknown when the run stopped waiting for it came back: keep its
    outcome (a failure stays unknown: only reconciliation, or a person, can settle it)."""
    with contextlib.suppress(Exception):
        scope.ledger.transition(
            rec.effect_id,
            EffectStatus.COMMITTED,
            expected=[EffectStatus.UNKNOWN],
            actor=scope.owner,
            result=outcome_payload(msg),
            detail={"settled_late": True},
        )


def mark_unknown(ledger: Ledger, rec: EffectRecord, spec: EffectSpec, why: str) -> EffectRecord:
    """Record an unknown outcome with an owner and a next action (invariant I3)."""
    owner, next_action = unknown_owner(spec)
    try:
        return ledger.transition(
            rec.effect_id,
            EffectStatus.UNKNOWN,
            actor="langgraph-cancel",
            owner=owner,
            next_action=next_action,
            error=why,
        )
    except IllegalTransitionError:
        return ledger.get_effect(rec.effect_id)


def apply_outcome(
    ledger: Ledger, rec: EffectRecord, spec: EffectSpec, outcome: Outcome, *, actor: str
) -> EffectRecord:
    """Settle an in-flight or unknown effect with what reconciliation found.

    A provider with no record of a call whose request this process is still making
    has not seen it *yet*: the call stays unknown (its outcome is recorded when it
    returns), never ``not_applied``, which would free its key for another effect.
    """
    if outcome.status == "not_applied" and running_here(rec.effect_id):
        why = f"the request is still in flight in this process; {outcome.reason or ''}"
        return mark_unknown(ledger, rec, spec, why.rstrip("; "))
    try:
        if outcome.status == "committed":
            result = {"content": _result_text(outcome.result), "status": "success"}
            return ledger.transition(
                rec.effect_id,
                EffectStatus.COMMITTED,
                actor=actor,
                result=result,
                detail={"reconciled": True},
            )
        if outcome.status == "not_applied":
            return ledger.transition(
                rec.effect_id,
                EffectStatus.NOT_APPLIED,
                actor=actor,
                detail={"reconciled": True, "reason": outcome.reason},
            )
    except IllegalTransitionError:
        return ledger.get_effect(rec.effect_id)
    return mark_unknown(ledger, rec, spec, outcome.reason or "reconcile could not tell")


#: The effects whose call is running in this process (a set's add, discard and ``in``
#: are atomic: no lock needed across threads).
_RUNNING: set[str] = set()


def running_here(effect_id: str) -> bool:
    """Whether this process is still making the call of ``effect_id`` (a stopped wait
    does not stop the request)."""
    return effect_id in _RUNNING


def dangling_tool_calls(messages: Sequence[Any]) -> list[ToolCall]:
    """Tool calls in a history that have no ToolMessage answering them.

    A ToolMessage answers the earliest unanswered call with its id before it: a
    provider that repeats ids across turns (``call_0`` each turn) leaves a later
    turn's call unanswered even though an earlier ``call_0`` was answered.
    """
    pending: list[ToolCall] = []
    for m in messages:
        if isinstance(m, AIMessage):
            pending.extend(c for c in m.tool_calls if c.get("id"))
        elif isinstance(m, ToolMessage):
            for n, call in enumerate(pending):
                if call["id"] == m.tool_call_id:
                    del pending[n]
                    break
    return pending


__all__ = [
    "NOT_RUN_CANCELLED",
    "TOOL_REGISTRY",
    "EffectToolNode",
    "apply_outcome",
    "dangling_tool_calls",
    "ensure_same_call",
    "find_own_record",
    "is_same_call",
    "mark_unknown",
    "message_payload",
    "moved_record",
    "recorded_call",
    "replay_message",
    "reused_call_id",
    "unknown_owner",
]

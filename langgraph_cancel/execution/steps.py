"""The I/O a tool call's protocol asks for, as values: one protocol body, two drivers.

The per-call protocol (``protocol.py``) is a generator. Every time it needs the
outside world (a ledger read or write, the cancel signal, the tool itself, a
reconcile hook, a pause) it yields a ``Step`` and receives the answer. A sync
driver answers with blocking calls, an async driver with awaits on the graph's
own event loop; the decisions (cancelled? already recorded? same step? approved?)
are written once. ``ask(step)`` and ``ledger_call(...)`` give the answer its type.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_cancel.effects import EffectSpec, Outcome
from langgraph_cancel.errors import IllegalTransitionError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import EffectRecord, EffectStatus, TransitionRequest

if TYPE_CHECKING:
    from langgraph_cancel.execution.group import GroupCommit

logger = logging.getLogger("langgraph_cancel.tools")

T = TypeVar("T")
P = ParamSpec("P")


class Step(Generic[T]):
    """A request from the protocol to its driver, answered with a ``T``."""

    __slots__ = ()


Protocol = Generator[Step[Any], Any, T]
"""A piece of protocol: yields steps, returns a ``T``."""


@dataclass(frozen=True, slots=True)
class LedgerCall(Step[T]):
    """Call a ``Ledger`` method: the sync driver calls it, the async one its ``a*`` twin.

    Attributes:
        method: The sync method, unbound (``Ledger.transition``); its name names the twin.
        args: Positional arguments after the ledger.
        kwargs: Keyword arguments.
        before_flush: The write may commit before its WAL is on disk (see
            ``langgraph_cancel.ledger.flush``): a record whose loss on a database
            crash reconciliation settles, never an intent.
    """

    method: Callable[..., T]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    before_flush: bool = False


@dataclass(frozen=True, slots=True)
class CancelCheck(Step[bool]):
    """Has the run been asked to stop? (Level-triggered: once true, always true.)"""


@dataclass(frozen=True, slots=True)
class Observe(Step[None]):
    """Record, once, that the run saw its cancel signal."""


@dataclass(frozen=True, slots=True)
class Reconcile(Step[Outcome]):
    """Ask the tool's reconcile hook what became of a key (never raises)."""

    spec: EffectSpec
    key: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AwaitPlanSaved(Step[None]):
    """Wait until the checkpoint of the step that asked for this call is saved."""

    config: RunnableConfig
    timeout: float


@dataclass(frozen=True, slots=True)
class Pause(Step[None]):
    """Sleep before a retry."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Dispatch(Step[Any]):
    """Run the call: the handler (``ToolNode``'s own execution) on ``request``.

    Attributes:
        request: What the handler gets.
        grace: Once the run is cancelled, seconds the call may still take before
            the wait is given up (``None``: wait until it returns). The call keeps
            running; the protocol records it unknown (``StoppedWaiting``).
        abandon: A read-only call that may be abandoned on cancel (``Abandoned``).
        record: The call's dispatched record, for a supervisor that gives up on it.
        spec: The tool's declaration (the owner of an unknown outcome).
        key: The call's idempotency key (what ``idempotency_key()`` returns in the tool).
    """

    request: ToolCallRequest
    grace: float | None = None
    abandon: bool = False
    record: EffectRecord | None = None
    spec: EffectSpec | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class SettleWhenReturned(Step[None]):
    """A call the run stopped waiting for: record its outcome when it comes back."""

    pending: Any
    record: EffectRecord
    actor: str


@dataclass(frozen=True, slots=True)
class GroupWrite(Step["EffectRecord | Exception"]):
    """A compare-and-set that shares its round trip with concurrent calls' writes."""

    group: GroupCommit
    request: TransitionRequest


@dataclass(frozen=True, slots=True)
class IntentWrite(Step[T]):
    """A call's intent write (``write``, a ledger call or a group write), seen through.

    The async driver lets the write finish even when the run's task is cancelled
    meanwhile (a server's ``runs.cancel``), then raises ``IntentWriteCancelled`` with
    its answer: the intent may be durable while the call never left, and the protocol
    must record that before the cancellation goes on. The sync driver answers
    ``write`` as it is.
    """

    write: Step[T]


class StoppedWaiting(Exception):
    """A cancelled run stopped waiting for an in-flight side effect (it still runs).

    Attributes:
        seconds: The grace that ran out.
        pending: The running call (a future or task) whose outcome comes later.
    """

    def __init__(self, seconds: float, pending: Any) -> None:
        self.seconds = seconds
        self.pending = pending
        super().__init__(f"still in flight {seconds:g}s after the run was cancelled")


class Abandoned(Exception):
    """A read-only call given up on because the run was cancelled."""


class PlanWaitCancelled(asyncio.CancelledError):
    """The run's asyncio task was cancelled while a call waited for its step's
    checkpoint, before it left the process.

    The driver raised it in the cancelled task's place, with the stop noted and
    every later step shielded, so that a call whose intent went with its batch's
    plan can record that it was never sent before the cancellation goes on.
    """


class IntentWriteCancelled(asyncio.CancelledError):
    """The run's asyncio task was cancelled while a call's intent was being written.

    The driver let the write finish (shielded), noted the stop and shields every
    later step; the call does not go.

    Attributes:
        answer: What the write returned (None when it raised ``error``).
        error: What the write raised, if it did.
        intent: The call's record when the write moved it to ``dispatched`` (set by
            the protocol that understands ``answer``): it is to be recorded never sent.
    """

    def __init__(self, answer: Any = None, error: BaseException | None = None) -> None:
        super().__init__("run task cancelled while a call's intent was being written")
        self.answer = answer
        self.error = error
        self.intent: EffectRecord | None = None


class DispatchCancelled(asyncio.CancelledError):
    """The run's asyncio task was cancelled while a call was in flight.

    The driver waited for the call within its grace (shielded); this carries what
    it found, for the protocol to record before the cancellation goes on.

    Attributes:
        finished: The call returned (or raised) within the grace.
        output: What it returned.
        error: What it raised.
        pending: The still-running call, when it did not finish.
    """

    def __init__(
        self,
        *,
        finished: bool,
        output: Any = None,
        error: BaseException | None = None,
        pending: Any = None,
    ) -> None:
        super().__init__("run task cancelled while a call was in flight")
        self.finished = finished
        self.output = output
        self.error = error
        self.pending = pending
        #: The exception ToolNode answered with ``output``, if it caught one.
        self.raised: BaseException | None = None


def ask(step: Step[T]) -> Protocol[T]:
    """Yield ``step`` and return its answer, typed."""
    answer = yield step
    return cast(T, answer)


def intent_write(step: Step[T]) -> Protocol[T]:
    """``ask`` for a call's intent write, which a task cancel does not cut short
    (``IntentWrite``)."""
    answer = yield IntentWrite(step)
    return cast(T, answer)


def ledger_call(
    method: Callable[Concatenate[Ledger, P], T], *args: P.args, **kwargs: P.kwargs
) -> Protocol[T]:
    """A ledger method's answer, typed as the sync method's return (see ``LedgerCall``)."""
    answer = yield LedgerCall(method, args, kwargs)
    return cast(T, answer)


def ledger_write_before_flush(
    method: Callable[Concatenate[Ledger, P], T], *args: P.args, **kwargs: P.kwargs
) -> Protocol[T]:
    """``ledger_call`` for a write that may commit before its WAL is on disk.

    Only for records whose loss on a database crash the protocol survives (planned
    rows, an outcome with no intent after it); never for an intent.
    """
    answer = yield LedgerCall(method, args, kwargs, before_flush=True)
    return cast(T, answer)


def from_dispatched(
    rec: EffectRecord, to: EffectStatus, actor: str, **fields: Any
) -> TransitionRequest:
    """The request that records a dispatched call's outcome: ``rec`` moves to ``to``.

    Args:
        rec: The call's record, ``dispatched``.
        to: Its outcome's status.
        actor: Who records it.
        **fields: The rest of ``TransitionRequest`` (``error``, ``result``, ``detail``, ...).
    """
    return TransitionRequest(
        effect_id=rec.effect_id,
        to=to,
        expected=frozenset({EffectStatus.DISPATCHED}),
        actor=actor,
        **fields,
    )


def transition_steps(
    request: TransitionRequest, *, lost_ok: bool = False
) -> Protocol[EffectRecord]:
    """One compare-and-set; ``lost_ok``: another writer moved it first, its record stands."""
    try:
        return (
            yield from ledger_call(
                Ledger.transition,
                request.effect_id,
                request.to,
                expected=request.expected,
                actor=request.actor,
                detail=request.detail,
                **_optional_fields(request),
            )
        )
    except IllegalTransitionError as exc:
        if not lost_ok:
            raise
        logger.warning("could not record %s as %s: %s", request.effect_id, request.to.value, exc)
        return (yield from ledger_call(Ledger.get_effect, request.effect_id))


def _optional_fields(request: TransitionRequest) -> dict[str, Any]:
    """The fields of ``request`` that ``Ledger.transition`` takes only when given."""
    fields: dict[str, Any] = {}
    for name in ("result", "error", "next_action"):
        value = getattr(request, name)
        if value is not ...:
            fields[name] = value
    for name in ("owner", "approval", "args"):
        value = getattr(request, name)
        if value is not None:
            fields[name] = value
    return fields


__all__ = [
    "Abandoned",
    "AwaitPlanSaved",
    "CancelCheck",
    "Dispatch",
    "DispatchCancelled",
    "GroupWrite",
    "IntentWrite",
    "IntentWriteCancelled",
    "LedgerCall",
    "Observe",
    "Pause",
    "PlanWaitCancelled",
    "Protocol",
    "Reconcile",
    "SettleWhenReturned",
    "Step",
    "StoppedWaiting",
    "ask",
    "from_dispatched",
    "intent_write",
    "ledger_call",
    "ledger_write_before_flush",
    "transition_steps",
]

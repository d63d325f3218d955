"""Budgets and deadlines: a run that outgrows its limits is stopped like any other.

``add_cancellation(builder, limits=Limits(...))`` (and ``EffectMiddleware(limits=...)``)
bound a run by wall-clock time, model tokens, tool calls, side-effecting calls, cost
and repeats of the same call. A breach is not an error raised in the middle of a
step: it *requests cancel* through the same protocol as a person pressing stop
(``requested_by="limits"``, the first reason wins), so queued calls are dropped,
calls in flight are awaited or reconciled, and the report names the limit and the
figure, e.g. ``limit: tool_calls 12 > 10``.

Limits are checked wherever the cancel signal is (before each node, before each
dispatch, between the chunks of a model stream), and a deadline also has a timer
that raises the signal while a tool runs. Every figure is read from durable
records: tool calls from the run's effects in the ledger, tokens from the run row,
time from the run's start. A resumed run therefore picks up its budget where the
crashed process left it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from langgraph_cancel.errors import InvalidLimitsError
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.types import EffectKind, EffectRecord, EffectStatus, RunRecord, utcnow

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

logger = logging.getLogger("langgraph_cancel.limits")

#: ``requested_by`` of a cancel request made because a limit was breached.
LIMITS_REQUESTER = "limits"
#: Every breach reason starts so (``limit: tool_calls 12 > 10``).
LIMIT_REASON_PREFIX = "limit: "

#: Calls that never went out and never will: they use no budget.
_NOT_RUN: frozenset[EffectStatus] = frozenset({EffectStatus.DROPPED, EffectStatus.REJECTED})


class LimitName(str, Enum):
    """Which limit a run breached."""

    DEADLINE = "deadline"
    TOKENS = "tokens"
    TOOL_CALLS = "tool_calls"
    SIDE_EFFECTS = "side_effects"
    COST = "cost"
    REPEATS = "repeats"


LimitNameLiteral = Literal["deadline", "tokens", "tool_calls", "side_effects", "cost", "repeats"]


@dataclass(frozen=True, slots=True)
class Prices:
    """What a run's calls and tokens cost, in any one currency.

    Attributes:
        per_tool: Price of one call of a tool, by tool name.
        default_tool: Price of one call of a tool not in ``per_tool``.
        per_token: Price of one model token.
    """

    per_tool: Mapping[str, float] = field(default_factory=dict)
    default_tool: float = 0.0
    per_token: float = 0.0

    def __post_init__(self) -> None:
        prices = [self.default_tool, self.per_token, *self.per_tool.values()]
        if any(price < 0 for price in prices):
            raise InvalidLimitsError("prices cannot be negative")

    def of_call(self, tool: str) -> float:
        """The price of one call of ``tool``."""
        return float(self.per_tool.get(tool, self.default_tool))


@dataclass(frozen=True, slots=True)
class Limits:
    """How far one run may go before it is stopped. ``None`` leaves a figure unbounded.

    Attributes:
        deadline: Wall-clock time from the run's start (a ``timedelta`` or seconds).
        max_tokens: Model tokens (a message's ``usage_metadata.total_tokens``, else
            the words of its text).
        max_tool_calls: Tool calls of any kind.
        max_side_effects: Calls of reversible and irreversible tools.
        max_cost: Cost of the calls and tokens, priced by ``prices``.
        prices: The price table ``max_cost`` is computed with.
        max_repeats: Repeats of one call (same tool, same arguments) after its
            first; 2 lets a call run three times. Loop detection.

    Raises:
        InvalidLimitsError: A negative or zero figure, or ``max_cost`` without prices.
    """

    deadline: timedelta | float | None = None
    max_tokens: int | None = None
    max_tool_calls: int | None = None
    max_side_effects: int | None = None
    max_cost: float | None = None
    prices: Prices = field(default_factory=Prices)
    max_repeats: int | None = None

    def __post_init__(self) -> None:
        seconds = self.deadline_seconds
        if seconds is not None and seconds <= 0:
            raise InvalidLimitsError("a deadline must be a positive duration")
        for name in ("max_tokens", "max_tool_calls", "max_side_effects", "max_repeats"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 0):
                raise InvalidLimitsError(f"{name} must be a whole number >= 0, not {value!r}")
        if self.max_cost is not None:
            if self.max_cost < 0:
                raise InvalidLimitsError("max_cost cannot be negative")
            prices = self.prices
            if not (prices.per_tool or prices.default_tool or prices.per_token):
                raise InvalidLimitsError("max_cost needs a price table: Limits(prices=Prices(...))")

    @property
    def deadline_seconds(self) -> float | None:
        """The deadline in seconds, if any."""
        if self.deadline is None:
            return None
        if isinstance(self.deadline, timedelta):
            return self.deadline.total_seconds()
        return float(self.deadline)

    @property
    def counts_tokens(self) -> bool:
        """Whether the run's model tokens must be counted."""
        return self.max_tokens is not None or (
            self.max_cost is not None and self.prices.per_token > 0
        )

    def breach(self, usage: Usage) -> Breach | None:
        """The first limit ``usage`` goes past, in a fixed order; None within every limit."""
        deadline = self.deadline_seconds
        if deadline is not None and usage.elapsed_s > deadline:
            return Breach(LimitName.DEADLINE, f"{usage.elapsed_s:.1f}s", f"{deadline:g}s")
        if self.max_tokens is not None and usage.tokens > self.max_tokens:
            return Breach(LimitName.TOKENS, str(usage.tokens), str(self.max_tokens))
        if self.max_tool_calls is not None and usage.tool_calls > self.max_tool_calls:
            return Breach(LimitName.TOOL_CALLS, str(usage.tool_calls), str(self.max_tool_calls))
        if self.max_side_effects is not None and usage.side_effects > self.max_side_effects:
            return Breach(
                LimitName.SIDE_EFFECTS, str(usage.side_effects), str(self.max_side_effects)
            )
        if self.max_repeats is not None and usage.repeats > self.max_repeats:
            return Breach(
                LimitName.REPEATS, str(usage.repeats), str(self.max_repeats), usage.repeated_call
            )
        if self.max_cost is not None:
            cost = usage.cost(self.prices)
            if cost > self.max_cost:
                return Breach(LimitName.COST, f"{cost:.4g}", f"{self.max_cost:.4g}")
        return None


@dataclass(frozen=True, slots=True)
class Usage:
    """What a run has used so far, read from the ledger.

    Attributes:
        elapsed_s: Seconds since the run started.
        tokens: Model tokens counted for the run.
        tool_calls: Calls that went out or are about to (not dropped, not rejected).
        side_effects: Of those, calls of reversible and irreversible tools.
        repeats: The most repeats of one call (same tool, same arguments).
        repeated_call: That call's tool name, when it was repeated.
        calls_by_tool: ``tool_calls`` by tool name.
    """

    elapsed_s: float = 0.0
    tokens: int = 0
    tool_calls: int = 0
    side_effects: int = 0
    repeats: int = 0
    repeated_call: str | None = None
    calls_by_tool: Mapping[str, int] = field(default_factory=dict)

    def cost(self, prices: Prices) -> float:
        """The run's cost so far under ``prices``."""
        calls = sum(prices.of_call(tool) * n for tool, n in self.calls_by_tool.items())
        return calls + prices.per_token * self.tokens


def usage_of(run: RunRecord, effects: Iterable[EffectRecord]) -> Usage:
    """The usage of ``run`` whose effects in the ledger are ``effects``."""
    counted = [e for e in effects if e.status not in _NOT_RUN]
    same_calls = Counter((e.tool, _canonical(e.args)) for e in counted)
    (tool, _args), most = same_calls.most_common(1)[0] if same_calls else (("", ""), 0)
    return Usage(
        elapsed_s=max(0.0, (utcnow() - run.created_at).total_seconds()),
        tokens=run.tokens_used,
        tool_calls=len(counted),
        side_effects=sum(1 for e in counted if e.kind is not EffectKind.READ_ONLY),
        repeats=max(0, most - 1),
        repeated_call=tool if most > 1 else None,
        calls_by_tool=dict(Counter(e.tool for e in counted)),
    )


def _canonical(args: Mapping[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class Breach:
    """A limit a run went past.

    Attributes:
        limit: Which limit.
        used: The run's figure, as written in the reason.
        allowed: The limit's figure.
        detail: What was repeated, for ``repeats``.
    """

    limit: LimitName
    used: str
    allowed: str
    detail: str | None = None

    @property
    def reason(self) -> str:
        """The cancel reason: ``limit: tool_calls 12 > 10``."""
        tail = f" ({self.detail})" if self.detail else ""
        return f"{LIMIT_REASON_PREFIX}{self.limit.value} {self.used} > {self.allowed}{tail}"


def limit_of_reason(reason: str | None) -> LimitName | None:
    """The limit a cancel reason names, if the run was stopped by one."""
    if not reason or not reason.startswith(LIMIT_REASON_PREFIX):
        return None
    name = reason[len(LIMIT_REASON_PREFIX) :].split(" ", 1)[0]
    try:
        return LimitName(name)
    except ValueError:
        return None


def tokens_of(messages: Sequence[BaseMessage]) -> int:
    """Model tokens of the model's messages among ``messages``.

    ``usage_metadata.total_tokens`` when the provider reports it, else the words
    of the message's text (a floor, for models that report nothing).
    """
    # Imported here: the command line's quick commands read reports without LangChain.
    from langchain_core.messages import AIMessage

    total = 0
    for message in messages:
        if not isinstance(message, AIMessage):
            continue
        usage = message.usage_metadata
        if usage and usage.get("total_tokens"):
            total += int(usage["total_tokens"])
        else:
            total += len(message.text.split())
    return total


class LimitGuard:
    """Enforces a run's limits: checked with the cancel signal, and a deadline timer.

    Args:
        limits: The limits.
        ledger: The run's ledger.
        run: The run (its start time is the deadline's origin).
    """

    def __init__(self, limits: Limits, ledger: Ledger, run: RunRecord) -> None:
        self.limits = limits
        self.ledger = ledger
        self.run_id = run.run_id
        self.thread_id = run.thread_id
        self.started_at = run.created_at
        self._breached: Breach | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    @property
    def breached(self) -> Breach | None:
        """The breach this guard requested a cancel for, if any."""
        return self._breached

    def check(self) -> bool:
        """Read the run's usage; on a breach, request cancel. True once the run is asked
        to stop (by this breach, or by anyone: the row was read anyway).

        Blocking (ledger reads): call it off the event loop.
        """
        if self._breached is not None:
            return True
        try:
            run = self.ledger.get_run(self.run_id)
            if run.cancel_requested:
                return True
            if run.terminal:
                return False
            breach = self.limits.breach(usage_of(run, self.ledger.run_effects(self.run_id)))
        except Exception:  # a lost database must not crash a check; the DB guard holds
            logger.warning("limit check failed for run %s", self.run_id, exc_info=True)
            return False
        return breach is not None and self._request(breach)

    def add_tokens(self, tokens: int) -> None:
        """Count ``tokens`` model tokens for the run (durably)."""
        if tokens > 0 and self.limits.counts_tokens:
            self.ledger.add_tokens_used(self.run_id, tokens)

    def _request(self, breach: Breach) -> bool:
        active = self.ledger.active_run(self.thread_id)
        if active is None or active.run_id != self.run_id:
            return False  # the run ended meanwhile: nothing left to stop
        with self._lock:
            if self._breached is not None:
                return True
            self._breached = breach
        self.ledger.request_cancel(
            self.thread_id, reason=breach.reason, requested_by=LIMITS_REQUESTER
        )
        logger.info("run %s stopped: %s", self.run_id, breach.reason)
        return True

    def start(self) -> None:
        """Arm the deadline timer (if the limits have a deadline) for the time left."""
        deadline = self.limits.deadline_seconds
        if deadline is None:
            return
        left = deadline - (utcnow() - self.started_at).total_seconds()
        # A hair past the deadline, so that the check sees it breached.
        timer = threading.Timer(max(0.0, left) + 0.01, self._on_deadline)
        timer.name = "langgraph-cancel-deadline"
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _on_deadline(self) -> None:
        try:
            self.check()
        except Exception:
            logger.warning("deadline of run %s could not stop it", self.run_id, exc_info=True)

    def stop(self) -> None:
        """Disarm the deadline timer (the invocation ended or paused)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


__all__ = [
    "LIMITS_REQUESTER",
    "LIMIT_REASON_PREFIX",
    "Breach",
    "LimitGuard",
    "LimitName",
    "LimitNameLiteral",
    "Limits",
    "Prices",
    "Usage",
    "limit_of_reason",
    "tokens_of",
    "usage_of",
]

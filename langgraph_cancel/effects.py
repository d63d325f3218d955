"""Effect classification of LangChain tools: ``effect(...)``, ``Outcome``, ``idempotency_key()``.

A tool's author says what the tool does to the world; everything else (the
order of a batch, the intent record, approval, what cancel does with an
in-flight call, reconciliation) follows from that declaration.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypeVar, overload

from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool
from typing_extensions import TypedDict

from langgraph_cancel.errors import EffectDeclarationError
from langgraph_cancel.process import CLASSIFIED_TOOLS, WARNED_UNCLASSIFIED, current_idempotency_key
from langgraph_cancel.types import CancelPolicy, EffectKind, effect_kind

OutcomeStatusLiteral = Literal["committed", "not_applied", "unknown"]

ReconcileHook = Callable[[str, dict[str, Any]], "Awaitable[Outcome] | Outcome"]
CompensateHook = Callable[[str, dict[str, Any], Any], "Awaitable[None] | None"]
#: ``revoke(key, args, handle) -> bool``: True when the provider withdrew the scheduled
#: call, False when it answers that the call is already final (delivered, captured).
RevokeHook = Callable[[str, dict[str, Any], Any], "Awaitable[bool] | bool"]
KeyFunction = Callable[[dict[str, Any]], str]
ApprovalRule = bool | Callable[[dict[str, Any]], bool]

_SPEC_ATTR = "_langgraph_cancel_spec"

DEFAULT_RETRYABLE: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a reconcile hook found out about a dispatched call.

    Build one with ``Outcome.committed(result)``, ``Outcome.not_applied()`` or
    ``Outcome.unknown(reason)``.
    """

    status: OutcomeStatusLiteral
    result: Any = None
    reason: str | None = None

    @classmethod
    def committed(cls, result: Any = None) -> Outcome:
        """The external system did apply the call; ``result`` is what it returned."""
        return cls("committed", result=result)

    @classmethod
    def not_applied(cls, reason: str | None = None) -> Outcome:
        """The external system has no trace of the call: it did not happen."""
        return cls("not_applied", reason=reason)

    @classmethod
    def unknown(cls, reason: str) -> Outcome:
        """Nobody can tell yet; a person or a later reconciliation must decide."""
        return cls("unknown", reason=reason)


class DelayWindow(TypedDict):
    """The delay window as a reviewer sees it in an approval request.

    Attributes:
        seconds: How long the effect stays revocable after it is made.
        held_by: ``provider`` (the tool's provider holds the call, a revoke hook
            withdraws it) or ``outbox`` (the package holds it and sends it after).
        text: The same in one sentence.
    """

    seconds: float
    held_by: Literal["provider", "outbox"]
    text: str


#: The key of a classified tool's ``metadata`` that names its kind (``effect(...)`` sets it).
EFFECT_KIND_METADATA = "effect_kind"


@dataclass(frozen=True, slots=True)
class EffectSpec:
    """The declaration ``effect(...)`` attaches to a tool.

    Attributes:
        kind: What the tool does to the world.
        idempotency_key: Derives the key from the call's arguments; when absent
            the key is derived from the thread and the tool-call id.
        reconcile: Asks the external system what became of a dispatched call.
        compensate: Undoes a committed call (required for ``reversible``).
        requires_approval: ``True``/``False`` or a predicate on the arguments;
            ``None`` means "irreversible tools need approval".
        cancel_policy: What cancel does with an in-flight call.
        retry_safe: A retry with the same key cannot double the effect (the
            provider honours idempotency keys).
        retryable: Exception types worth retrying (transient faults).
        max_attempts: Attempts in all, including the first.
        permanence: Why the effect cannot be undone, shown to approvers.
        hook_timeout: Seconds a reconcile or compensate hook may take.
        cancel_timeout: Seconds cancel waits for an in-flight call of this tool.
        delay: The delay window: how long the effect stays revocable after it is
            made. With ``revoke`` the provider holds the call (a send-at email);
            without it the package holds it in its outbox until the window passes.
        revoke: Withdraws a call the provider holds (``revoke(key, args, handle)``).
        classified: False for the fail-safe spec of a tool nobody classified.
    """

    kind: EffectKind
    idempotency_key: KeyFunction | None = None
    reconcile: ReconcileHook | None = None
    compensate: CompensateHook | None = None
    requires_approval: ApprovalRule | None = None
    cancel_policy: CancelPolicy = CancelPolicy.WAIT
    retry_safe: bool = False
    retryable: tuple[type[BaseException], ...] = DEFAULT_RETRYABLE
    max_attempts: int = 3
    permanence: str | None = None
    hook_timeout: float = 30.0
    cancel_timeout: float | None = None
    delay: timedelta | None = None
    revoke: RevokeHook | None = None
    classified: bool = field(default=True)

    @property
    def deferred(self) -> bool:
        """True for a tool with a delay window (provider-held or package-held)."""
        return self.delay is not None

    @property
    def held(self) -> bool:
        """True when the package holds the call in its outbox until the window passes."""
        return self.delay is not None and self.revoke is None

    def window(self) -> DelayWindow | None:
        """The delay window for a reviewer's payload, or ``None`` without one."""
        if self.delay is None:
            return None
        return {
            "seconds": self.delay.total_seconds(),
            "held_by": "provider" if self.revoke is not None else "outbox",
            "text": self.window_text() or "",
        }

    def window_text(self) -> str | None:
        """A sentence for approvers on the delay window, or ``None`` without one."""
        if self.delay is None:
            return None
        seconds = self.delay.total_seconds()
        span = f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"
        holder = "the provider holds it" if self.revoke is not None else "it waits in the outbox"
        return (
            f"Revocable for {span} after it is made ({holder}); a stop inside the window undoes it."
        )

    @property
    def side_effecting(self) -> bool:
        """True for reversible and irreversible tools."""
        return self.kind is not EffectKind.READ_ONLY

    def needs_approval(self, args: dict[str, Any]) -> bool:
        """Whether a call with these arguments must be approved before dispatch."""
        rule = self.requires_approval
        if rule is None:
            return self.kind is EffectKind.IRREVERSIBLE
        if isinstance(rule, bool):
            return rule
        return bool(rule(args))

    def why_permanent(self) -> str:
        """A sentence for approvers on what cancelling can and cannot undo."""
        if self.permanence:
            return self.permanence
        if self.kind is EffectKind.IRREVERSIBLE and self.delay is not None:
            return "Irreversible once its delay window has passed: " + (self.window_text() or "")
        if self.kind is EffectKind.IRREVERSIBLE:
            return "Irreversible: once dispatched, cancelling the run cannot undo it."
        if self.kind is EffectKind.REVERSIBLE:
            return "Reversible: a compensating action can undo it."
        return "Read-only: no side effect."


T = TypeVar("T", bound=BaseTool)


@overload
def effect(
    kind: EffectKind | str,
    tool: None = None,
    /,
    *,
    idempotency_key: KeyFunction | None = ...,
    reconcile: ReconcileHook | None = ...,
    compensate: CompensateHook | None = ...,
    requires_approval: ApprovalRule | None = ...,
    cancel_policy: CancelPolicy | str | None = ...,
    retry_safe: bool = ...,
    retryable: tuple[type[BaseException], ...] = ...,
    max_attempts: int = ...,
    permanence: str | None = ...,
    hook_timeout: float = ...,
    cancel_timeout: float | None = ...,
    delay: timedelta | None = ...,
    revoke: RevokeHook | None = ...,
) -> Callable[[BaseTool | Callable[..., Any]], BaseTool]: ...


@overload
def effect(
    kind: EffectKind | str,
    tool: T,
    /,
    *,
    idempotency_key: KeyFunction | None = ...,
    reconcile: ReconcileHook | None = ...,
    compensate: CompensateHook | None = ...,
    requires_approval: ApprovalRule | None = ...,
    cancel_policy: CancelPolicy | str | None = ...,
    retry_safe: bool = ...,
    retryable: tuple[type[BaseException], ...] = ...,
    max_attempts: int = ...,
    permanence: str | None = ...,
    hook_timeout: float = ...,
    cancel_timeout: float | None = ...,
    delay: timedelta | None = ...,
    revoke: RevokeHook | None = ...,
) -> T: ...


def effect(
    kind: EffectKind | str,
    tool: BaseTool | None = None,
    /,
    *,
    idempotency_key: KeyFunction | None = None,
    reconcile: ReconcileHook | None = None,
    compensate: CompensateHook | None = None,
    requires_approval: ApprovalRule | None = None,
    cancel_policy: CancelPolicy | str | None = None,
    retry_safe: bool = False,
    retryable: tuple[type[BaseException], ...] = DEFAULT_RETRYABLE,
    max_attempts: int = 3,
    permanence: str | None = None,
    hook_timeout: float = 30.0,
    cancel_timeout: float | None = None,
    delay: timedelta | None = None,
    revoke: RevokeHook | None = None,
) -> Any:
    """Classify a LangChain tool by what it does to the world.

    Use it as a decorator above ``@tool`` or call it on any ``BaseTool``::

        @effect(EffectKind.IRREVERSIBLE, idempotency_key=lambda a: f"refund:{a['order_id']}",
                reconcile=ask_provider)
        @tool
        def issue_refund(order_id: str, amount: float) -> str: ...

    The result is still a LangChain tool; LangGraph calls it as before.

    Args:
        kind: ``read_only``, ``reversible`` or ``irreversible``.
        tool: The tool, when called directly instead of as a decorator.
        idempotency_key: ``f(args) -> str``; default: thread id + tool-call id.
        reconcile: ``f(key, args) -> Outcome`` (sync or async).
        compensate: ``f(key, args, result) -> None`` (sync or async); raises on failure.
        requires_approval: bool or ``f(args) -> bool``; default: irreversible only.
        cancel_policy: ``wait`` (default for side effects), ``reconcile``, or
            ``abandon`` (default and only choice allowed for read-only tools).
        retry_safe: A retry with the same key cannot double the effect.
        retryable: Exception types retried with backoff.
        max_attempts: Attempts in all for retryable failures.
        permanence: Text for approvers on why the effect is permanent.
        hook_timeout: Seconds a reconcile/compensate hook may run.
        cancel_timeout: Seconds cancel waits for an in-flight call of this tool.
        delay: A delay window that makes the effect revocable for that long. With
            ``revoke`` the tool hands the call to a provider that holds it (a
            send-at email) and returns a handle; without it the package holds the
            call in its durable outbox and sends it once the window has passed.
        revoke: ``f(key, args, handle) -> bool`` (sync or async): withdraws a call
            the provider holds; ``False`` when the provider says it is already final.

    Returns:
        A decorator, or the classified tool when ``tool`` is given.

    Raises:
        EffectDeclarationError: For a reversible tool without ``compensate``,
            ``abandon`` on a side-effecting tool, or other inconsistent settings.
    """
    parsed_kind = effect_kind(kind)
    spec = EffectSpec(
        kind=parsed_kind,
        idempotency_key=idempotency_key,
        reconcile=reconcile,
        compensate=compensate,
        requires_approval=requires_approval,
        cancel_policy=_cancel_policy(parsed_kind, cancel_policy),
        retry_safe=retry_safe or parsed_kind is EffectKind.READ_ONLY,
        retryable=retryable,
        max_attempts=max_attempts,
        permanence=permanence,
        hook_timeout=hook_timeout,
        cancel_timeout=cancel_timeout,
        delay=delay,
        revoke=revoke,
    )
    _check_declaration(spec)

    def apply(target: BaseTool | Callable[..., Any]) -> BaseTool:
        return _classified(target, spec)

    if tool is not None:
        return apply(tool)
    return apply


def _cancel_policy(kind: EffectKind, declared: CancelPolicy | str | None) -> CancelPolicy:
    """The cancel policy a declaration asks for; by default ``abandon`` for reads, else
    ``wait``.

    Raises:
        EffectDeclarationError: For a policy that does not exist.
    """
    if declared is None:
        return CancelPolicy.ABANDON if kind is EffectKind.READ_ONLY else CancelPolicy.WAIT
    try:
        return CancelPolicy(declared)
    except ValueError:
        raise EffectDeclarationError(
            f"unknown cancel_policy {declared!r}; expected wait, reconcile or abandon"
        ) from None


def _check_declaration(spec: EffectSpec) -> None:
    """Refuse a declaration whose settings contradict each other.

    Raises:
        EffectDeclarationError: Naming the contradiction and what to declare instead.
    """
    kind = spec.kind
    if kind is EffectKind.REVERSIBLE and spec.compensate is None:
        raise EffectDeclarationError(
            "a reversible tool needs a compensate hook: effect(EffectKind.REVERSIBLE, "
            "compensate=undo) where undo(key, args, result) reverses the call"
        )
    if kind is not EffectKind.READ_ONLY and spec.cancel_policy is CancelPolicy.ABANDON:
        raise EffectDeclarationError(
            "cancel_policy='abandon' is only allowed for read_only tools: abandoning the wait "
            "on a side-effecting call leaves its outcome unknown with no record"
        )
    if kind is EffectKind.READ_ONLY and spec.compensate is not None:
        raise EffectDeclarationError("a read_only tool has nothing to compensate")
    if spec.max_attempts < 1:
        raise EffectDeclarationError("max_attempts must be at least 1")
    if spec.hook_timeout <= 0:
        raise EffectDeclarationError("hook_timeout must be positive")
    if spec.revoke is not None and spec.delay is None:
        raise EffectDeclarationError("a revoke hook needs a delay window: effect(..., delay=...)")
    if spec.delay is not None:
        if not isinstance(spec.delay, timedelta) or spec.delay <= timedelta(0):
            raise EffectDeclarationError("delay must be a positive datetime.timedelta")
        if kind is EffectKind.READ_ONLY:
            raise EffectDeclarationError("a read_only tool has no effect to delay")
    rule = spec.requires_approval
    if rule is not None and not (isinstance(rule, bool) or callable(rule)):
        raise EffectDeclarationError("requires_approval must be a bool or a callable on the args")


def _classified(target: BaseTool | Callable[..., Any], spec: EffectSpec) -> BaseTool:
    """A copy of the tool (made a tool first, if a function) carrying ``spec``, registered
    by name for whoever must find its hooks later (``process.CLASSIFIED_TOOLS``)."""
    base = target if isinstance(target, BaseTool) else as_tool(target)
    if not isinstance(base, BaseTool):  # pragma: no cover - as_tool overloads
        raise EffectDeclarationError(f"cannot make a tool of {target!r}")
    classified = base.model_copy()
    classified.metadata = {**(base.metadata or {}), EFFECT_KIND_METADATA: spec.kind.value}
    object.__setattr__(classified, _SPEC_ATTR, spec)
    CLASSIFIED_TOOLS[classified.name] = classified
    return classified


def spec_of(tool: BaseTool) -> EffectSpec:
    """The effect declaration of ``tool``; unclassified tools count as irreversible.

    The first time an unclassified tool is seen, one warning names it.
    """
    spec = getattr(tool, _SPEC_ATTR, None)
    if isinstance(spec, EffectSpec):
        return spec
    if tool.name not in WARNED_UNCLASSIFIED:
        WARNED_UNCLASSIFIED.add(tool.name)
        warnings.warn(
            f"tool {tool.name!r} has no effect(...) classification; treating it as "
            "irreversible (approval required, reported as permanent)",
            UnclassifiedToolWarning,
            stacklevel=2,
        )
    return _UNCLASSIFIED


class UnclassifiedToolWarning(UserWarning):
    """A tool without ``effect(...)`` was given to an effect-aware node."""


_UNCLASSIFIED = EffectSpec(kind=EffectKind.IRREVERSIBLE, classified=False)


def idempotency_key() -> str:
    """This call's idempotency key, inside a tool dispatched by ``EffectToolNode``.

    Forward it to the external system (a header, a request field) so that a
    retry by anyone can never double the effect.

    Raises:
        RuntimeError: When called outside a dispatched tool call.
    """
    key = current_idempotency_key.get()
    if key is None:
        raise RuntimeError(
            "idempotency_key() is only available inside a tool call dispatched by EffectToolNode"
        )
    return key


@contextmanager
def bound_idempotency_key(key: str) -> Iterator[None]:
    """Make ``key`` what ``idempotency_key()`` returns for the duration of the block."""
    token = current_idempotency_key.set(key)
    try:
        yield
    finally:
        current_idempotency_key.reset(token)


__all__ = [
    "CLASSIFIED_TOOLS",
    "DEFAULT_RETRYABLE",
    "EFFECT_KIND_METADATA",
    "DelayWindow",
    "EffectSpec",
    "Outcome",
    "OutcomeStatusLiteral",
    "RevokeHook",
    "UnclassifiedToolWarning",
    "bound_idempotency_key",
    "effect",
    "idempotency_key",
    "spec_of",
]

"""Every exception langgraph-cancel raises, in one place.

Each error carries a ``non_retryable`` flag (after Temporal's
``ApplicationError``): retry helpers consult it instead of guessing from the
type name.
"""

from __future__ import annotations

from typing import Any


class LangGraphCancelError(Exception):
    """Base class of every error raised by langgraph-cancel."""

    non_retryable: bool = True


class ConfigurationError(LangGraphCancelError):
    """The package is set up in a way that cannot keep its promises."""


class EffectDeclarationError(ConfigurationError):
    """An ``effect(...)`` declaration is inconsistent (raised at declaration time)."""


class DurabilityError(ConfigurationError):
    """The graph was started with a durability mode that loses tool batches."""


class InvalidLimitsError(ConfigurationError):
    """A ``Limits`` record that cannot be enforced (a negative maximum, a cost cap
    without prices)."""


class InvalidURLError(ConfigurationError):
    """A database URL is not one of ``sqlite:///...``, ``postgresql://...`` or ``memory://``."""


class CommandLineError(LangGraphCancelError):
    """A ``langgraph-cancel`` command that cannot be carried out as given.

    The command line prints it as one line (JSON under ``--json``) and exits 1.
    """


class LedgerError(LangGraphCancelError):
    """Base class of ledger failures."""


class UnknownStatusError(LedgerError, ValueError):
    """A status string is not a member of the lifecycle it was given for."""


class IllegalTransitionError(LedgerError):
    """A lifecycle transition that the state machine forbids.

    Attributes:
        record_id: The effect or run whose transition was refused.
        current: The status the record actually has.
        requested: The status the caller asked for.
    """

    def __init__(self, record_id: str, current: str, requested: str, detail: str = "") -> None:
        self.record_id = record_id
        self.current = current
        self.requested = requested
        msg = f"illegal transition {current!r} -> {requested!r} for {record_id}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class TransitionConflictError(IllegalTransitionError):
    """A compare-and-set lost: another writer moved the record first."""


class DispatchRefusedError(LedgerError):
    """The ledger refused to mark an effect dispatched (run cancelled, or not approved)."""

    def __init__(self, effect_id: str, reason: str) -> None:
        self.effect_id = effect_id
        self.reason = reason
        super().__init__(f"dispatch of {effect_id} refused: {reason}")


class DuplicateIdempotencyKeyError(LedgerError):
    """Two different effects claimed the same idempotency key."""

    def __init__(self, key: str, existing_effect_id: str | None = None) -> None:
        self.key = key
        self.existing_effect_id = existing_effect_id
        super().__init__(
            f"idempotency key {key!r} already belongs to effect {existing_effect_id}"
            if existing_effect_id
            else f"idempotency key {key!r} is already used"
        )


class EffectConflictError(LedgerError):
    """A tool-call id already names a different call in the thread's ledger.

    The ledger knows a call by its thread and tool-call id. Some model providers
    number tool-call ids per message and so repeat them across turns; the record
    found under an id may then be another call's (another tool, other arguments).
    Replaying it, or dispatching under it, would answer or skip the wrong call.
    """

    def __init__(self, effect_id: str, tool_call_id: str, recorded: str, asked: str) -> None:
        self.effect_id = effect_id
        self.tool_call_id = tool_call_id
        super().__init__(
            f"Not run: tool-call id {tool_call_id!r} already names another call in this "
            f"thread ({recorded}); this one is {asked}. The model provider reused a "
            "tool-call id: ask again so the call gets an id of its own."
        )


class UnknownEffectError(LedgerError, KeyError):
    """No effect with that id or key is in the ledger."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "unknown effect"


class UnknownThreadError(LedgerError, KeyError):
    """The ledger knows nothing of that thread."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(thread_id)

    def __str__(self) -> str:
        return f"unknown thread {self.thread_id!r}: the ledger has no run for it"


class UnknownRunError(LedgerError, KeyError):
    """The ledger knows nothing of that run."""

    def __str__(self) -> str:
        return f"unknown run {self.args[0]!r}" if self.args else "unknown run"


class TransientDatabaseError(LedgerError):
    """A database fault that outlived its retries (connection lost, serialization failure)."""

    non_retryable = False


class CheckpointNotSavedError(LangGraphCancelError):
    """The checkpoint of the step that asked for a side effect was never saved.

    Under ``durability="async"`` a side-effecting dispatch waits for it: a crash
    before it is saved would lose the tool calls, and the resumed run would ask
    the model again. Nothing was dispatched.

    Attributes:
        checkpoint_id: The checkpoint the task was prepared from.
    """

    non_retryable = False

    def __init__(
        self, checkpoint_id: str, timeout: float, *, failed: BaseException | None = None
    ) -> None:
        self.checkpoint_id = checkpoint_id
        why = f"its save failed ({failed!r})" if failed is not None else f"not within {timeout:g} s"
        super().__init__(
            f"checkpoint {checkpoint_id} (the step that planned these tool calls) was not "
            f"saved: {why}; nothing was dispatched. Check the checkpointer's database, or "
            'run with durability="sync".'
        )


class ThreadBusyError(LangGraphCancelError):
    """Another live worker holds the lease on this thread.

    Attributes:
        thread_id: The thread that is busy.
        owner: The worker that holds the lease.
        expires_at: When that lease lapses unless it is renewed (ISO-8601).
    """

    def __init__(self, thread_id: str, owner: str, expires_at: str) -> None:
        self.thread_id = thread_id
        self.owner = owner
        self.expires_at = expires_at
        super().__init__(f"thread {thread_id!r} is being run by {owner} (lease until {expires_at})")


ThreadBusy = ThreadBusyError


class FollowTimeoutError(LangGraphCancelError, TimeoutError):
    """A run followed from the ledger did not end within the time given.

    The stop request stays in place: the run may still end on its own.

    Attributes:
        run_id: The run that was followed.
        timeout: The seconds waited.
    """

    def __init__(self, run_id: str, timeout: float) -> None:
        self.run_id = run_id
        self.timeout = timeout
        super().__init__(f"run {run_id} did not end within {timeout:g}s")


class MalformedToolCallError(LangGraphCancelError):
    """A tool call that cannot be dispatched: unknown tool or arguments off schema."""

    def __init__(self, tool: str, reason: str, args: Any = None) -> None:
        self.tool = tool
        self.reason = reason
        self.tool_args = args
        super().__init__(f"tool call {tool!r} rejected: {reason}")


class ApprovalRequiredError(LangGraphCancelError):
    """``EffectToolNode`` was asked to dispatch a call that needs approval and has none."""


class InvalidDecisionError(LangGraphCancelError, ValueError):
    """A resume value for an approval or reconciliation interrupt is malformed."""


class RunCancelledError(LangGraphCancelError):
    """Raised to stop work inside the current run because cancellation was requested."""

    def __init__(self, run_id: str, reason: str | None) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"run {run_id} was cancelled: {reason or 'no reason given'}")


class HookError(LangGraphCancelError):
    """A reconcile or compensate hook raised, hung or returned something unusable."""


class BatchSuperseded(BaseException):
    """A sync graph's tool batch was taken over by the thread supervising it, or that
    thread is gone: the worker running the batch stops before anything else goes out.

    A ``BaseException``, like ``GeneratorExit``: the tool node's ``except Exception``
    handlers (a tool's failure) must not take it for the tool's. It never reaches
    the caller of the graph.
    """


__all__ = [
    "ApprovalRequiredError",
    "BatchSuperseded",
    "CheckpointNotSavedError",
    "CommandLineError",
    "ConfigurationError",
    "DispatchRefusedError",
    "DuplicateIdempotencyKeyError",
    "DurabilityError",
    "EffectConflictError",
    "EffectDeclarationError",
    "FollowTimeoutError",
    "HookError",
    "IllegalTransitionError",
    "InvalidDecisionError",
    "InvalidLimitsError",
    "InvalidURLError",
    "LangGraphCancelError",
    "LedgerError",
    "MalformedToolCallError",
    "RunCancelledError",
    "ThreadBusy",
    "ThreadBusyError",
    "TransientDatabaseError",
    "TransitionConflictError",
    "UnknownEffectError",
    "UnknownRunError",
    "UnknownStatusError",
    "UnknownThreadError",
]

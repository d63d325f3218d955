"""Running the handler: once, or again for a transient fault when a retry cannot double it.

A call is retried only when its tool says a retry is safe (``retry_safe``: the
provider honours idempotency keys; every read-only tool): then a transient
fault (``retryable``) gets another attempt after a doubling pause. The grace a
cancelled run still gives an in-flight call is decided here too, from the
tool's cancel policy.
"""

from __future__ import annotations

from typing import Any

from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_cancel.effects import EffectSpec
from langgraph_cancel.execution.context import CallContext
from langgraph_cancel.execution.observed import Capture
from langgraph_cancel.execution.plan import CallPlan
from langgraph_cancel.execution.steps import Dispatch, DispatchCancelled, Pause, Protocol
from langgraph_cancel.types import CancelPolicy, EffectKind, EffectRecord

# Backoff before a tool's second attempt; it doubles for each attempt after that.
FIRST_RETRY_WAIT = 0.05
# The longest pause between two attempts.
LONGEST_RETRY_WAIT = 2.0


def attempts(
    request: ToolCallRequest,
    ctx: CallContext,
    plan: CallPlan,
    *,
    abandon: bool = False,
    record: EffectRecord | None = None,
) -> Protocol[tuple[Any, BaseException | None]]:
    """Run the handler, again for a transient fault when a retry cannot double the effect.

    Returns:
        The handler's answer, and the exception ``ToolNode`` turned into it (if any).
    """
    spec = plan.spec
    allowed = spec.max_attempts if spec.retry_safe else 1
    wait = FIRST_RETRY_WAIT
    for attempt in range(1, allowed + 1):
        capture = Capture() if ctx.capture else None
        step = Dispatch(
            capture.around(request) if capture is not None else request,
            grace=grace_of(ctx, spec),
            abandon=abandon,
            record=record,
            spec=spec,
            key=plan.key,
        )
        last = attempt == allowed
        try:
            answer = yield step
        except DispatchCancelled as cancelled:
            cancelled.raised = capture.error if capture is not None else None
            raise
        except spec.retryable:
            if last:
                raise
        else:
            raised = capture.error if capture is not None else None
            if raised is None or last or not isinstance(raised, spec.retryable):
                return answer, raised
        yield Pause(wait)
        wait = min(wait * 2, LONGEST_RETRY_WAIT)
    raise AssertionError("unreachable")  # pragma: no cover


def grace_of(ctx: CallContext, spec: EffectSpec) -> float | None:
    """How long a cancelled run still waits for this tool's in-flight call."""
    if spec.kind is EffectKind.READ_ONLY and spec.cancel_policy is CancelPolicy.ABANDON:
        return None
    if spec.cancel_policy is CancelPolicy.RECONCILE:
        return 0.0
    return spec.cancel_timeout if spec.cancel_timeout is not None else ctx.cancel_timeout


__all__ = ["FIRST_RETRY_WAIT", "LONGEST_RETRY_WAIT", "attempts", "grace_of"]

"""The cancel protocol: request, observe, drain, settle, compensate, one terminal transition.

A stop is a row in the ledger (``request_cancel``); the run's signal observes it
(``cancel_requested`` -> ``cancelling``). ``finalize_cancel`` then takes the run
to its one ``cancelled`` transition, in numbered steps:

1. drain what never ran (everything not yet dispatched, and the calls the state
   leaves unanswered): recorded ``dropped``, never dispatched again;
2. settle what is in flight: wait for it within the tool's timeout, then ask
   its reconcile hook, else record it ``unknown`` with an owner;
3. revoke what waits in a delay window;
4. wait, bounded, for the run's children (sub-agents) to stop;
5. compensate committed reversible effects, when asked for;
6. the terminal transition, with the report stored in the same write.

The ``cancel`` node runs it inside the graph; the run's lifecycle runs it when a
stop arrived after the last check; the sweeper runs it for a dead worker's run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, cast

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph._internal._runnable import RunnableCallable
from langgraph.runtime import Runtime

from langgraph_cancel.compensation import compensate_run
from langgraph_cancel.errors import DuplicateIdempotencyKeyError, IllegalTransitionError
from langgraph_cancel.execution.answers import NOT_RUN_CANCELLED, replay_message
from langgraph_cancel.execution.identity import (
    dangling_tool_calls,
    find_own_record,
    is_same_call,
    recorded_call,
)
from langgraph_cancel.execution.settlement import apply_outcome, mark_unknown
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.nodes.names import CANCEL_NODE
from langgraph_cancel.nodes.reconcile import reconcile_now, spec_of_unknown
from langgraph_cancel.nodes.settings import CancellationSettings
from langgraph_cancel.progress import ProgressKind, announce_cancelled, announce_effect
from langgraph_cancel.report import CancellationReport, build_report
from langgraph_cancel.runtime import RunScope, scope_for
from langgraph_cancel.types import (
    UNDISPATCHED_STATUSES,
    CancelPolicy,
    EffectKind,
    EffectRecord,
    EffectStatus,
    RunRecord,
    RunStatus,
    utcnow,
)
from langgraph_cancel.window import revoke_window

#: The reason the cancel node drains the run with (``RunControl.request_drain``): the
#: run's lifecycle tells a drain of ours from anyone else's by it.
DRAIN_REASON = "langgraph-cancel: run cancelled"
#: Statuses of an effect that never left the process: the drain drops them.
DRAINABLE: frozenset[EffectStatus] = UNDISPATCHED_STATUSES | {EffectStatus.NOT_APPLIED}


# ------------------------------------------------------------------- drain
def plan_dropped(scope: RunScope, settings: CancellationSettings, call: ToolCall) -> None:
    """Record ``call`` (in its ``recorded_call`` form) as dropped: it never runs."""
    name = call["name"]
    spec = settings.spec(name)
    args = call.get("args")
    key: str | None = None
    if spec is not None and spec.idempotency_key is not None and isinstance(args, dict):
        # The call never runs: a key function rejecting its arguments must not fail the cancel.
        with contextlib.suppress(Exception):
            key = str(spec.idempotency_key(args))
    fields: dict[str, Any] = {
        "thread_id": scope.thread_id,
        "run_id": scope.run_id,
        "tool_call_id": str(call["id"]),
        "tool": name,
        "kind": spec.kind if spec is not None else EffectKind.IRREVERSIBLE,
        "args": args,
        "status": EffectStatus.DROPPED,
        "error": NOT_RUN_CANCELLED,
        "owner": scope.owner,
        "actor": "cancel",
    }
    try:
        planned, _created = scope.ledger.plan(**fields, idempotency_key=key)
    except DuplicateIdempotencyKeyError:
        # A repeated call (same tool, same arguments) holds the tool's key: this one is
        # recorded, never run, under the key derived from its own id.
        planned, _created = scope.ledger.plan(**fields, idempotency_key=None)
    announce_effect(ProgressKind.DROPPED, planned)


def record_dangling_dropped(
    scope: RunScope, settings: CancellationSettings, call: ToolCall
) -> EffectRecord | None:
    """Record a dangling call that will never run; its own record, if it has one.

    A call whose id names another call's record (ids reused across turns) is
    known under ``reused_call_id`` (``find_own_record``), so the report counts it
    as not run; the other call's record stays as it is.
    """
    call = recorded_call(call)
    own_id, rec = find_own_record(scope.ledger, scope.thread_id, call)
    if rec is None:
        plan_dropped(scope, settings, cast(ToolCall, {**call, "id": own_id}))
    return rec


def drop_effect(scope: RunScope, rec: EffectRecord) -> None:
    """Move an effect that never left the process to ``dropped``."""
    try:
        dropped = scope.ledger.transition(
            rec.effect_id, EffectStatus.DROPPED, actor="cancel", error=NOT_RUN_CANCELLED
        )
    except IllegalTransitionError:
        return  # it moved on (dispatched by a sibling): the in-flight pass handles it
    announce_effect(ProgressKind.DROPPED, dropped)


def drop_dangling(scope: RunScope, settings: CancellationSettings, call: ToolCall) -> None:
    """Record a call nobody will answer as never run, dropping its own record if queued."""
    rec = record_dangling_dropped(scope, settings, call)
    if rec is not None and rec.status in DRAINABLE:
        drop_effect(scope, rec)


def drop_send_payload(state: Any, scope: RunScope, settings: CancellationSettings) -> None:
    """A queued ``Send`` to a tool node: record its call as never run."""
    if isinstance(state, dict) and state.get("__type") == "tool_call_with_context":
        call = state.get("tool_call")
        if isinstance(call, dict) and call.get("id"):
            drop_dangling(scope, settings, cast(ToolCall, call))


def _drain(scope: RunScope, settings: CancellationSettings, dangling: list[ToolCall]) -> None:
    for rec in scope.ledger.run_effects(scope.run_id):
        if rec.status in DRAINABLE:
            drop_effect(scope, rec)
    for call in dangling:
        record_dangling_dropped(scope, settings, call)


# ------------------------------------------------------------------ settle
def _await_in_flight(
    scope: RunScope, settings: CancellationSettings, in_flight: list[EffectRecord]
) -> list[EffectRecord]:
    """Wait for calls in flight, each per its tool's policy, bounded; them as they are now."""
    deadline = time.monotonic()
    for rec in in_flight:
        spec = settings.spec(rec.tool)
        grace = 0.0
        if spec is None or spec.cancel_policy is CancelPolicy.WAIT:
            grace = (spec.cancel_timeout if spec else None) or settings.cancel_timeout
            deadline = max(deadline, time.monotonic() + grace)
        scope.await_effect(rec, grace)
    pending = in_flight
    while time.monotonic() < deadline:
        pending = [scope.ledger.get_effect(rec.effect_id) for rec in in_flight]
        if all(rec.status is not EffectStatus.DISPATCHED for rec in pending):
            break
        time.sleep(0.02)
    return pending


def settle_dispatched(
    scope: RunScope, settings: CancellationSettings, effects: list[EffectRecord]
) -> None:
    """Wait for in-flight calls (per tool policy, bounded), then reconcile what is left."""
    ledger = scope.ledger
    in_flight = [rec for rec in effects if rec.status is EffectStatus.DISPATCHED]
    if not in_flight:
        return
    for rec in _await_in_flight(scope, settings, in_flight):
        if rec.status is EffectStatus.DISPATCHED:
            rec = ledger.get_effect(rec.effect_id)
        if rec.status is EffectStatus.DISPATCHED:
            spec = settings.spec(rec.tool) or spec_of_unknown()
            outcome = reconcile_now(spec, rec.idempotency_key, rec.args)
            if outcome.status == "unknown":
                rec = mark_unknown(
                    ledger, rec, spec, f"in flight when the run was cancelled; {outcome.reason}"
                )
            else:
                rec = apply_outcome(ledger, rec, spec, outcome, actor="cancel")
        scope.awaited.discard(rec.effect_id)
        announce_effect(ProgressKind.SETTLED, rec)


def wait_for_children(scope: RunScope, seconds: float) -> None:
    """Wait, at most ``seconds``, for every child run (a sub-agent) to end."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        children = scope.ledger.child_runs(scope.run_id)
        if all(child.terminal for child in children):
            return
        time.sleep(0.02)


def _compensate(scope: RunScope, settings: CancellationSettings) -> None:
    ledger = scope.ledger
    for undone in compensate_run(ledger, ledger.run_effects(scope.run_id), settings.all_tools()):
        compensated = undone.status is EffectStatus.COMPENSATED
        kind = ProgressKind.COMPENSATED if compensated else ProgressKind.COMPENSATION_FAILED
        announce_effect(kind, undone)


# ------------------------------------------------- observe, and the transition
def observe_stop(scope: RunScope) -> RunRecord:
    """Make sure the run's stop is requested and observed; the run as it is now.

    A run that reaches the cancel node while ``running`` (a limit, a node's own
    ``Command``) is asked to stop here first.
    """
    run = scope.refresh()
    if run.status is RunStatus.RUNNING:
        scope.ledger.request_cancel(
            scope.thread_id, reason="cancel node reached", requested_by="graph"
        )
        run = scope.refresh()
    if run.status is RunStatus.CANCEL_REQUESTED:
        # The signal's own observation streams the request, once per run.
        run = scope.signal.observe() or scope.ledger.mark_observed(run.run_id)
    return run


def _close_cancelled(scope: RunScope) -> CancellationReport | None:
    """The run's one ``cancelled`` transition, its report stored in the same write.

    Returns the report when this call made the transition, None when another
    (a racing worker, a second call) made it first.
    """
    ledger = scope.ledger
    quiesced = utcnow()
    current = ledger.get_run(scope.run_id)
    report = build_report(
        ledger,
        current.model_copy(update={"quiesced_at": quiesced}),
        status=RunStatus.CANCELLED.value,
    )
    won = ledger.finish_run(
        scope.run_id,
        RunStatus.CANCELLED,
        report=report.model_dump(mode="json"),
        quiesced_at=quiesced,
    )
    scope.refresh()
    return report if won else None


def finalize_cancel(
    scope: RunScope, settings: CancellationSettings, dangling: list[ToolCall]
) -> CancellationReport:
    """Drain, settle, compensate and make the run's one ``cancelled`` transition.

    Blocking (database I/O, bounded waits): call it from a worker thread in
    async code. Idempotent: a second call (or a racing worker) returns the
    stored report.
    """
    ledger = scope.ledger
    run = observe_stop(scope)
    if not run.terminal:
        # 1. The queue you can actually drain: everything not yet dispatched.
        _drain(scope, settings, dangling)
        # 2. In flight: wait within the timeout, then reconcile or record unknown.
        settle_dispatched(scope, settings, ledger.run_effects(run.run_id))
        # 3. Delay windows: a scheduled effect is revoked while its window is open.
        revoke_window(ledger, ledger.run_effects(run.run_id), settings.all_tools())
        # 4. Children (sub-agents) stop too: wait, bounded, for each to end.
        wait_for_children(scope, settings.cancel_timeout)
        # 5. Compensation, when asked for.
        if settings.compensate_on_cancel:
            _compensate(scope, settings)
        # 6. The one terminal transition.
        report = _close_cancelled(scope)
        if report is not None:
            return report
    stored = ledger.get_run(run.run_id)
    if stored.report:
        return CancellationReport.model_validate(stored.report)
    return build_report(ledger, stored)


def answer_dangling(scope: RunScope, dangling: list[ToolCall]) -> list[ToolMessage]:
    """One answer per call nobody answered: its recorded outcome, else "not run"."""
    return answers_from_ledger(scope.ledger, scope.thread_id, dangling)


def answers_from_ledger(
    ledger: Ledger, thread_id: str, dangling: list[ToolCall]
) -> list[ToolMessage]:
    """``answer_dangling`` outside a run: each call's outcome as ``ledger`` recorded it
    on ``thread_id``, else "not run"."""
    out: list[ToolMessage] = []
    for call in dangling:
        recorded = recorded_call(call)
        _own_id, rec = find_own_record(ledger, thread_id, recorded)
        if rec is None or not is_same_call(rec, recorded):
            out.append(
                ToolMessage(
                    NOT_RUN_CANCELLED,
                    name=call.get("name"),
                    tool_call_id=call["id"],
                    status="error",
                )
            )
        else:
            out.append(replay_message(rec, call))
    return out


# ----------------------------------------------------------- the cancel node
def make_cancel_node(settings: CancellationSettings) -> RunnableCallable:
    """The ``cancel`` node: finish the cancel, answer every call, store and stream the
    report, and drain what the graph still has queued."""

    def settle(state: Any, config: RunnableConfig) -> tuple[CancellationReport, list[ToolMessage]]:
        scope = scope_for(config, ledger=settings.ledger, new_run=False)
        scope.signal.set()
        dangling = dangling_tool_calls(settings.messages(state))
        report = finalize_cancel(scope, settings, dangling)
        return report, answer_dangling(scope, dangling)

    def conclude(
        report: CancellationReport, answers: list[ToolMessage], runtime: Runtime[Any]
    ) -> dict[str, Any]:
        payload = report.model_dump(mode="json")
        announce_cancelled(report.run_id, report.thread_id, payload)
        if runtime.control is not None:
            runtime.control.request_drain(DRAIN_REASON)
        return {settings.messages_key: answers, settings.report_key: payload}

    async def acancel(state: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        # The ledger work (and waiting for in-flight calls) runs off the event loop.
        report, answers = await asyncio.to_thread(settle, state, config)
        return conclude(report, answers, runtime)

    def cancel(state: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        report, answers = settle(state, config)
        return conclude(report, answers, runtime)

    return RunnableCallable(cancel, acancel, name=CANCEL_NODE)


__all__ = [
    "DRAINABLE",
    "DRAIN_REASON",
    "answer_dangling",
    "answers_from_ledger",
    "drop_dangling",
    "drop_effect",
    "drop_send_payload",
    "finalize_cancel",
    "make_cancel_node",
    "observe_stop",
    "plan_dropped",
    "record_dangling_dropped",
    "settle_dispatched",
    "wait_for_children",
]

"""``add_cancellation``: step-boundary checks, the cancel node and the reconcile entry.

``add_cancellation(builder)`` returns the same builder, now:

- every node is wrapped by a check that, once the run is cancel-requested,
  routes to the cancel node instead of running the node (a signal nobody
  reads is not cancellation);
- new input passes through the ``reconcile`` subgraph first whenever the
  thread has something to settle (in flight, unknown, compensating), a tool
  call nobody answered, or a stop to divert to, so that nothing is dispatched
  again before it is settled; otherwise START goes straight on;
- a ``cancel`` node drains what never ran, answers every dangling tool call,
  waits for (or reconciles) what is in flight, optionally compensates, makes
  the run's one ``cancelled`` transition, stores the report in the ledger and
  the graph state, and streams it;
- the compiled graph holds a lease on the thread for the duration of each
  invocation and closes the run (``completed`` / ``cancelled``) when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Self, TypedDict, cast

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config, merge_configs, var_child_runnable_config
from langchain_core.tools import BaseTool
from langgraph._internal._runnable import RunnableCallable
from langgraph.callbacks import GraphCallbackHandler, GraphInterruptEvent
from langgraph.errors import EmptyInputError, GraphDrained
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl, Runtime
from langgraph.types import Command

from langgraph_cancel.compensation import compensate_run
from langgraph_cancel.effects import CLASSIFIED_TOOLS, EffectSpec, Outcome, spec_of
from langgraph_cancel.errors import (
    ConfigurationError,
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
)
from langgraph_cancel.execution.answers import NOT_RUN_CANCELLED, replay_message
from langgraph_cancel.execution.identity import (
    dangling_tool_calls,
    find_own_record,
    is_same_call,
    recorded_call,
)
from langgraph_cancel.execution.settlement import apply_outcome, mark_unknown
from langgraph_cancel.hooks import call_reconcile
from langgraph_cancel.hooks import run_sync as _run_sync
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import async_twin_of
from langgraph_cancel.limits import LimitGuard, Limits, tokens_of
from langgraph_cancel.nodes.names import CANCEL_NODE, RECONCILE_NODE
from langgraph_cancel.nodes.tool_node import EffectToolNode
from langgraph_cancel.progress import ProgressKind, announce_cancelled, announce_effect
from langgraph_cancel.report import CancellationReport, build_report
from langgraph_cancel.runtime import (
    CONFIG_KEY_LEDGER,
    INTERRUPTED_REASON,
    LEASES,
    RunScope,
    ascope_for,
    check_durability,
    current_scope,
    drop_scope,
    invocation_scope,
    resolve_ledger,
    scope_for,
    thread_id_of,
    worker_id,
)
from langgraph_cancel.types import (
    UNDISPATCHED_STATUSES,
    CancelPolicy,
    EffectKind,
    EffectRecord,
    EffectStatus,
    RunStatus,
    utcnow,
)
from langgraph_cancel.window import revoke_window

logger = logging.getLogger("langgraph_cancel.graph")

REPORT_KEY = "cancellation_report"
DRAIN_REASON = "langgraph-cancel: run cancelled"
CONFIG_KEY_WORKER = "langgraph_cancel_worker"
LEASE_TTL = 30.0


@dataclass
class CancellationSettings:
    """How ``add_cancellation`` was configured."""

    ledger: Ledger | str | None = None
    compensate_on_cancel: bool = False
    cancel_timeout: float = 30.0
    messages_key: str = "messages"
    report_key: str = REPORT_KEY
    reconcile_interactive: bool = True
    tools: dict[str, BaseTool] = field(default_factory=dict)
    limits: Limits | None = None

    def tool(self, name: str) -> BaseTool | None:
        """A tool by name: from this graph's tool nodes, else from any in the process."""
        return self.tools.get(name) or CLASSIFIED_TOOLS.get(name)

    def spec(self, name: str) -> EffectSpec | None:
        """The effect declaration of a tool, if the tool is known."""
        found = self.tool(name)
        return None if found is None else spec_of(found)

    def all_tools(self) -> Mapping[str, BaseTool]:
        """Every tool this graph knows by name."""
        return {**CLASSIFIED_TOOLS, **self.tools}


# ------------------------------------------------------------------ helpers
def _messages(state: Any, key: str) -> list[Any]:
    if isinstance(state, dict):
        return list(state.get(key) or [])
    if isinstance(state, list):
        return state
    return list(getattr(state, key, None) or [])


def _record_dangling_dropped(
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
        _plan_dropped(scope, settings, cast(ToolCall, {**call, "id": own_id}))
    return rec


def _plan_dropped(scope: RunScope, settings: CancellationSettings, call: ToolCall) -> None:
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


def _drop(scope: RunScope, rec: EffectRecord) -> None:
    try:
        dropped = scope.ledger.transition(
            rec.effect_id, EffectStatus.DROPPED, actor="cancel", error=NOT_RUN_CANCELLED
        )
    except IllegalTransitionError:
        return  # it moved on (dispatched by a sibling): the in-flight pass handles it
    announce_effect(ProgressKind.DROPPED, dropped)


def _drop_send_payload(state: Any, scope: RunScope, settings: CancellationSettings) -> None:
    """A queued ``Send`` to a tool node: record its call as never run."""
    if isinstance(state, dict) and state.get("__type") == "tool_call_with_context":
        call = state.get("tool_call")
        if isinstance(call, dict) and call.get("id"):
            call = recorded_call(call)
            own_id, existing = find_own_record(scope.ledger, scope.thread_id, call)
            if existing is None:
                _plan_dropped(scope, settings, cast(ToolCall, {**call, "id": own_id}))
            elif existing.status in UNDISPATCHED_STATUSES | {EffectStatus.NOT_APPLIED}:
                _drop(scope, existing)


# -------------------------------------------------------------- the guard
def _guard(name: str, inner: Any, settings: CancellationSettings) -> RunnableCallable:
    """Wrap a node: check the cancel signal before it runs; divert to the cancel node."""

    def diverted(state: Any, config: RunnableConfig) -> bool:
        scope = scope_for(config, ledger=settings.ledger, new_run=False)
        if scope.run.terminal or scope.cancel_called():
            scope.signal.observe()
            _drop_send_payload(state, scope, settings)
            return True
        return False

    def func(state: Any, config: RunnableConfig) -> Any:
        if diverted(state, config):
            return Command(goto=CANCEL_NODE)
        out = inner.invoke(state, config)
        if settings.limits is not None and (tokens := _model_tokens(out, settings)):
            scope_for(config, ledger=settings.ledger, new_run=False).count_tokens(tokens)
        return out

    async def afunc(state: Any, config: RunnableConfig) -> Any:
        scope = invocation_scope(config, settings.ledger)
        # Known to go on without ledger I/O, or decided off the loop.
        undecided = scope is None or scope.run.terminal or await scope.signal.acancel_called()
        if undecided and await asyncio.to_thread(diverted, state, config):
            return Command(goto=CANCEL_NODE)
        out = await inner.ainvoke(state, config)
        if settings.limits is not None and (tokens := _model_tokens(out, settings)):
            await asyncio.to_thread(_count_tokens, config, settings, tokens)
        return out

    return RunnableCallable(func, afunc, name=name, trace=False)


def _model_tokens(update: Any, settings: CancellationSettings) -> int:
    """Model tokens of the messages a node's update adds (for the token budget)."""
    if isinstance(update, Command):
        update = update.update
    if not isinstance(update, dict):
        return 0
    added = update.get(settings.messages_key)
    if added is None:
        return 0
    return tokens_of(added if isinstance(added, list) else [added])


def _count_tokens(config: RunnableConfig, settings: CancellationSettings, tokens: int) -> None:
    scope_for(config, ledger=settings.ledger, new_run=False).count_tokens(tokens)


# --------------------------------------------------------- the cancel node
def _settle_dispatched(
    scope: RunScope, settings: CancellationSettings, effects: list[EffectRecord]
) -> None:
    """Wait for in-flight calls (per tool policy, bounded), then reconcile what is left."""
    ledger = scope.ledger
    in_flight = [e for e in effects if e.status is EffectStatus.DISPATCHED]
    if not in_flight:
        return
    deadline = time.monotonic()
    for e in in_flight:
        spec = settings.spec(e.tool)
        grace = 0.0
        if spec is None or spec.cancel_policy is CancelPolicy.WAIT:
            grace = (spec.cancel_timeout if spec else None) or settings.cancel_timeout
            deadline = max(deadline, time.monotonic() + grace)
        scope.await_effect(e, grace)
    pending = in_flight
    while time.monotonic() < deadline:
        pending = [ledger.get_effect(e.effect_id) for e in in_flight]
        if all(p.status is not EffectStatus.DISPATCHED for p in pending):
            break
        time.sleep(0.02)
    for rec in pending:
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


def _wait_for_children(scope: RunScope, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        children = scope.ledger.child_runs(scope.run_id)
        if all(c.terminal for c in children):
            return
        time.sleep(0.02)


def reconcile_now(spec: EffectSpec, key: str, args: dict[str, Any]) -> Outcome:
    """Ask a reconcile hook, from sync code (the hook gets a private event loop)."""
    outcome: Outcome = _run_sync(call_reconcile(spec, key, args))
    return outcome


def spec_of_unknown() -> EffectSpec:
    """The fail-safe declaration for a tool this process does not know."""
    return EffectSpec(kind=EffectKind.IRREVERSIBLE, classified=False)


def finalize_cancel(
    scope: RunScope, settings: CancellationSettings, dangling: list[ToolCall]
) -> CancellationReport:
    """Drain, settle, compensate and make the run's one ``cancelled`` transition.

    Blocking (database I/O, bounded waits): call it from a worker thread in
    async code. Idempotent: a second call (or a racing worker) returns the
    stored report.
    """
    ledger = scope.ledger
    run = scope.refresh()
    if run.status is RunStatus.RUNNING:
        ledger.request_cancel(scope.thread_id, reason="cancel node reached", requested_by="graph")
        run = scope.refresh()
    if run.status is RunStatus.CANCEL_REQUESTED:
        # The signal's own observation streams the request, once per run.
        run = scope.signal.observe() or ledger.mark_observed(run.run_id)
    if not run.terminal:
        # 1. The queue you can actually drain: everything not yet dispatched.
        for e in ledger.run_effects(run.run_id):
            if e.status in UNDISPATCHED_STATUSES or e.status is EffectStatus.NOT_APPLIED:
                _drop(scope, e)
        for call in dangling:
            _record_dangling_dropped(scope, settings, call)
        # 2. In flight: wait within the timeout, then reconcile or record unknown.
        _settle_dispatched(scope, settings, ledger.run_effects(run.run_id))
        # 2b. Delay windows: a scheduled effect is revoked while its window is open.
        revoke_window(ledger, ledger.run_effects(run.run_id), settings.all_tools())
        # 3. Children (sub-agents) stop too: wait, bounded, for each to end.
        _wait_for_children(scope, settings.cancel_timeout)
        # 4. Compensation, when asked for.
        if settings.compensate_on_cancel:
            for undone in compensate_run(
                ledger, ledger.run_effects(run.run_id), settings.all_tools()
            ):
                compensated = undone.status is EffectStatus.COMPENSATED
                kind = ProgressKind.COMPENSATED if compensated else ProgressKind.COMPENSATION_FAILED
                announce_effect(kind, undone)
        quiesced = utcnow()
        current = ledger.get_run(run.run_id)
        report = build_report(
            ledger,
            current.model_copy(update={"quiesced_at": quiesced}),
            status=RunStatus.CANCELLED.value,
        )
        won = ledger.finish_run(
            run.run_id,
            RunStatus.CANCELLED,
            report=report.model_dump(mode="json"),
            quiesced_at=quiesced,
        )
        scope.refresh()
        if won:
            return report
    stored = ledger.get_run(run.run_id)
    if stored.report:
        return CancellationReport.model_validate(stored.report)
    return build_report(ledger, stored)


def answer_dangling(scope: RunScope, dangling: list[ToolCall]) -> list[ToolMessage]:
    out: list[ToolMessage] = []
    for call in dangling:
        recorded = recorded_call(call)
        _own_id, rec = find_own_record(scope.ledger, scope.thread_id, recorded)
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


def _make_cancel_node(settings: CancellationSettings) -> RunnableCallable:
    def settle(state: Any, config: RunnableConfig) -> tuple[CancellationReport, list[ToolMessage]]:
        scope = scope_for(config, ledger=settings.ledger, new_run=False)
        scope.signal.set()
        dangling = dangling_tool_calls(_messages(state, settings.messages_key))
        report = finalize_cancel(scope, settings, dangling)
        return report, answer_dangling(scope, dangling)

    async def acancel(state: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        # The ledger work (and waiting for in-flight calls) runs off the event loop.
        report, answers = await asyncio.to_thread(settle, state, config)
        payload = report.model_dump(mode="json")
        announce_cancelled(report.run_id, report.thread_id, payload)
        if runtime.control is not None:
            runtime.control.request_drain(DRAIN_REASON)
        return {settings.messages_key: answers, settings.report_key: payload}

    def cancel(state: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        report, answers = settle(state, config)
        payload = report.model_dump(mode="json")
        announce_cancelled(report.run_id, report.thread_id, payload)
        if runtime.control is not None:
            runtime.control.request_drain(DRAIN_REASON)
        return {settings.messages_key: answers, settings.report_key: payload}

    return RunnableCallable(cancel, acancel, name=CANCEL_NODE)


# ------------------------------------------------------ the reconcile node
def reconcile_thread(
    scope: RunScope, settings: CancellationSettings, *, interactive: bool
) -> list[EffectRecord]:
    """Settle a thread's unsettled effects through their hooks; return what stays unknown.

    Blocking: call it from a worker thread in async code.
    """
    from langgraph_cancel.compensation import compensate_effect

    ledger = scope.ledger
    left: list[EffectRecord] = []
    for rec in ledger.unsettled(scope.thread_id):
        spec = settings.spec(rec.tool) or spec_of_unknown()
        if rec.status is EffectStatus.COMPENSATING:
            if spec.compensate is not None:
                compensate_effect(ledger, rec, spec, actor="reconciler")
            continue
        if rec.status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN):
            outcome = reconcile_now(spec, rec.idempotency_key, rec.args)
            if outcome.status == "unknown" and rec.status is EffectStatus.UNKNOWN:
                left.append(rec)
                continue
            settled = apply_outcome(ledger, rec, spec, outcome, actor="reconciler")
            if settled.status is EffectStatus.UNKNOWN:
                left.append(settled)
    return left


def _make_reconcile_subgraph(settings: CancellationSettings, state_schema: Any) -> Any:
    """The reconciliation subgraph: settle -> [ask_human] -> [answer_dangling].

    ``settle`` goes on only when there is something to do: an unknown outcome to
    ask a person about, a dangling call to answer, or a stop to divert to.

    It runs on every new input, before anything of the thread is dispatched
    again, and shows in Studio as the ``reconcile`` node with its own steps.
    """
    from langgraph_cancel.nodes.reconcile import ask_human_about

    def settle(state: Any, config: RunnableConfig) -> Any:
        scope = scope_for(config, ledger=settings.ledger, new_run=False)
        left = reconcile_thread(scope, settings, interactive=False)
        # The common case, nothing to settle, answer or stop, ends here: one step.
        if left and settings.reconcile_interactive:
            return Command(goto="ask_human")
        if (
            scope.run.terminal
            or scope.cancel_called()
            or dangling_tool_calls(_messages(state, settings.messages_key))
        ):
            return Command(goto="answer_dangling")
        return Command(goto=END)

    async def asettle(state: Any, config: RunnableConfig) -> Any:
        return await asyncio.to_thread(settle, state, config)  # ledger I/O off the loop

    def ask_human(state: Any, config: RunnableConfig) -> Any:
        if not settings.reconcile_interactive:
            return None
        scope = scope_for(config, ledger=settings.ledger, new_run=False)
        left = [
            e for e in scope.ledger.unsettled(scope.thread_id) if e.status is EffectStatus.UNKNOWN
        ]
        if left:
            ask_human_about(scope, left)
        return None

    def answer_unanswered(state: Any, config: RunnableConfig) -> Any:
        scope = scope_for(config, ledger=settings.ledger, new_run=False)
        update: dict[str, Any] = {}
        dangling = dangling_tool_calls(_messages(state, settings.messages_key))
        if dangling:
            # New input: LangGraph drops whatever was still queued, so the calls an
            # earlier cancelled, interrupted or crashed run left unanswered will never
            # run. Record them so and answer each (invariant I5).
            for call in dangling:
                rec = _record_dangling_dropped(scope, settings, call)
                if rec is not None and (
                    rec.status in UNDISPATCHED_STATUSES or rec.status is EffectStatus.NOT_APPLIED
                ):
                    _drop(scope, rec)
            update[settings.messages_key] = answer_dangling(scope, dangling)
        if scope.run.terminal or scope.cancel_called():
            return Command(graph=Command.PARENT, goto=CANCEL_NODE, update=update or None)
        return update or None

    sub = StateGraph(state_schema)
    sub.add_node(
        "settle",
        RunnableCallable(settle, asettle, name="settle"),
        destinations=("ask_human", "answer_dangling", END),
    )
    sub.add_node("ask_human", ask_human)
    sub.add_node("answer_dangling", answer_unanswered)
    sub.add_edge(START, "settle")
    sub.add_edge("ask_human", "answer_dangling")
    sub.add_edge("answer_dangling", END)
    return sub.compile(name=RECONCILE_NODE)


_RECONCILABLE = frozenset(
    {EffectStatus.DISPATCHED, EffectStatus.UNKNOWN, EffectStatus.COMPENSATING}
)


def _needs_reconcile(state: Any, config: RunnableConfig, settings: CancellationSettings) -> bool:
    """Whether new input must pass through the reconcile subgraph before anything runs.

    It must when the run is stopping, when the state has tool calls nobody
    answered, or when the ledger holds an outcome to settle (in flight, unknown,
    compensating): exactly the cases the subgraph's steps act on.
    """
    scope = scope_for(config, ledger=settings.ledger, new_run=False)
    if scope.run.terminal or scope.cancel_called():
        return True
    if dangling_tool_calls(_messages(state, settings.messages_key)):
        return True
    unsettled = scope.take_unsettled_at_start()
    if unsettled is None:
        unsettled = scope.ledger.unsettled(scope.thread_id)
    return any(e.status in _RECONCILABLE for e in unsettled)


def _make_entry(settings: CancellationSettings, targets: list[str]) -> RunnableCallable:
    """START's router: the reconcile subgraph when needed, else where START led."""

    def route(state: Any, config: RunnableConfig) -> str | list[str]:
        return RECONCILE_NODE if _needs_reconcile(state, config, settings) else targets

    async def aroute(state: Any, config: RunnableConfig) -> str | list[str]:
        # Ledger I/O off the loop.
        needed = await asyncio.to_thread(_needs_reconcile, state, config, settings)
        return RECONCILE_NODE if needed else targets

    return RunnableCallable(route, aroute, name="reconcile_if_needed", trace=False)


# ---------------------------------------------------------- add_cancellation
def _with_cancel(ends: tuple[str, ...] | dict[str, str] | None) -> tuple[str, ...] | dict[str, str]:
    """A node's declared ``Command`` destinations plus the cancel node.

    Every guarded node may divert to the cancel node; declared, the graph view
    (Studio, ``get_graph()``) draws where a stop goes. Destinations only draw:
    what a node may go to at run time is unchanged.
    """
    if isinstance(ends, dict):
        return {**ends, CANCEL_NODE: CANCEL_NODE}
    return (*(ends or ()), CANCEL_NODE)


def _collect_tools(builder: StateGraph[Any, Any, Any, Any]) -> dict[str, BaseTool]:
    tools: dict[str, BaseTool] = {}
    for spec in builder.nodes.values():
        runnable = spec.runnable
        if isinstance(runnable, EffectToolNode):
            tools.update(runnable.tools_by_name)
    return tools


def add_cancellation(
    builder: StateGraph[Any, Any, Any, Any],
    *,
    ledger: Ledger | str | None = None,
    compensate_on_cancel: bool = False,
    cancel_timeout: float = 30.0,
    messages_key: str = "messages",
    report_key: str = REPORT_KEY,
    reconcile_interactive: bool = True,
    limits: Limits | None = None,
) -> CancellableStateGraph:
    """Make a graph builder safe to stop and safe to resume.

    Call it after adding your nodes and edges and before ``compile()``.

    Args:
        builder: A ``StateGraph`` whose state has a messages list.
        ledger: Where effects live when the graph is compiled without one of
            our savers (e.g. served by ``langgraph dev``): a ``Ledger`` or a URL.
            Default: the checkpointer's ledger, else ``$LANGGRAPH_CANCEL_DB``,
            else the embedded SQLite file.
        compensate_on_cancel: Undo committed reversible effects when cancelled.
        cancel_timeout: Seconds the cancel node waits for in-flight calls.
        messages_key: State key of the messages.
        report_key: State key the cancellation report is written to.
        reconcile_interactive: Ask a person (``interrupt()``) about outcomes
            reconciliation cannot settle.
        limits: A run's budget and deadline (``Limits``): a breach stops the run
            as a cancel request would, naming the limit in the report.

    Returns:
        The same builder (now a ``CancellableStateGraph``); compile it as usual.

    Raises:
        ConfigurationError: If the builder already has nodes with our names, or
            was already given to ``add_cancellation``.
    """
    if isinstance(builder, CancellableStateGraph):
        raise ConfigurationError("add_cancellation() was already applied to this builder")
    for reserved in (CANCEL_NODE, RECONCILE_NODE):
        if reserved in builder.nodes:
            raise ConfigurationError(f"the builder already has a node named {reserved!r}")
    settings = CancellationSettings(
        ledger=ledger,
        compensate_on_cancel=compensate_on_cancel,
        cancel_timeout=cancel_timeout,
        messages_key=messages_key,
        report_key=report_key,
        reconcile_interactive=reconcile_interactive,
        tools=_collect_tools(builder),
        limits=limits,
    )
    for name, spec in list(builder.nodes.items()):
        builder.nodes[name] = dataclasses.replace(
            spec, runnable=_guard(name, spec.runnable, settings), ends=_with_cancel(spec.ends)
        )
    if report_key not in builder.channels:
        make_typed_dict: Any = TypedDict  # a field name known only at run time
        report_schema = make_typed_dict(
            "CancellationReportState", {report_key: dict[str, Any] | None}
        )
        builder._add_schema(report_schema)
    output_channels = builder.schemas.get(builder.output_schema)
    if output_channels is not None and "__root__" not in output_channels:
        # The report is part of what invoke() returns, not only of the saved state.
        output_channels.setdefault(report_key, builder.channels[report_key])
    # The reconcile node takes START's place: START -> reconcile -> (what START led to).
    # With plain entry edges, new input whose thread has nothing to reconcile goes
    # straight on (one ledger read instead of a subgraph run).
    start_edges = {(s, e) for (s, e) in builder.edges if s == START}
    for s, e in start_edges:
        builder.edges.discard((s, e))
        builder.edges.add((RECONCILE_NODE, e))
    builder.add_node(
        RECONCILE_NODE,
        _make_reconcile_subgraph(settings, builder.state_schema),
        destinations=(CANCEL_NODE,),
    )
    builder.add_node(CANCEL_NODE, _make_cancel_node(settings))
    if START in builder.branches:
        builder.branches[RECONCILE_NODE] = builder.branches.pop(START)
        builder.add_edge(START, RECONCILE_NODE)
    elif start_edges:
        targets = sorted(e for _, e in start_edges)
        builder.add_conditional_edges(
            START, _make_entry(settings, targets), [RECONCILE_NODE, *targets]
        )
    else:
        builder.add_edge(START, RECONCILE_NODE)
    builder.add_edge(CANCEL_NODE, END)
    builder.__class__ = CancellableStateGraph
    cast(CancellableStateGraph, builder).cancellation = settings
    return cast(CancellableStateGraph, builder)


class CancellableStateGraph(StateGraph):  # type: ignore[type-arg]
    """A ``StateGraph`` that ``add_cancellation`` has prepared. Compile it as usual."""

    cancellation: CancellationSettings

    def compile(self, *args: Any, **kwargs: Any) -> CancellableGraph:
        """Compile, returning a graph that scopes each invocation to a run."""
        compiled = super().compile(*args, **kwargs)
        compiled.__class__ = CancellableGraph
        graph = cast(CancellableGraph, compiled)
        graph.cancellation = self.cancellation
        return graph


# -------------------------------------------------------- the compiled graph
class _PauseWatch(GraphCallbackHandler):
    """Notes that the invocation paused at an interrupt (LangGraph's lifecycle event).

    A run whose stream returned without one ran to its end: no ``get_state`` needed
    to tell a completed run from a paused one.
    """

    run_inline = True
    # Only the graph's lifecycle events matter here: skip every other callback.
    ignore_chain = ignore_llm = ignore_chat_model = ignore_retriever = True
    ignore_agent = ignore_retry = ignore_custom_event = True

    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.run_id: str | None = None

    def on_interrupt(self, event: GraphInterruptEvent) -> None:
        """The graph paused: its run goes on later.

        A graph invoked from inside one of this graph's nodes inherits the handler;
        its pauses are its own (``run_id`` tells them apart).
        """
        if str(event.run_id) == self.run_id:
            self.paused = True


@dataclass(frozen=True, slots=True)
class _RunStart:
    """What an invocation's run starts from: its ledger, owner and kind of input."""

    bound: Ledger | str | None
    owner: str
    new_run: bool
    run_id: str | None

    @classmethod
    def of(cls, graph: CancellableGraph, input: Any, config: RunnableConfig) -> _RunStart:
        conf = config.get("configurable", {})
        bound = graph.cancellation.ledger
        if bound is None and isinstance(getattr(graph.checkpointer, "ledger", None), Ledger):
            bound = graph.checkpointer.ledger  # type: ignore[union-attr]
        # A continuation (no input, or a Command) goes on with the thread's last run.
        continuation = input is None or isinstance(input, Command)
        return cls(
            bound=bound,
            owner=str(conf.get(CONFIG_KEY_WORKER) or worker_id()),
            new_run=not continuation,
            run_id=conf.get("run_id"),
        )


class _Invocation:
    """One invocation's run scope, lease and heartbeat."""

    def __init__(
        self,
        graph: CancellableGraph,
        input: Any,
        config: RunnableConfig,
        scope: RunScope | None = None,
    ) -> None:
        self.graph = graph
        self.config = config
        self.settings = graph.cancellation
        check_durability(config)
        start = _RunStart.of(graph, input, config)
        self.scope = scope or scope_for(
            config,
            ledger=start.bound,
            new_run=start.new_run,
            run_id=start.run_id,
            owner=start.owner,
            lease_ttl=LEASE_TTL,
            # New input passes START's router first: its ledger read rides along.
            prefetch_unsettled=start.new_run,
        )
        self.ledger = self.scope.ledger
        self.owner = start.owner
        self._released = False
        self._lease = LEASES.hold(self.ledger, self.scope.thread_id, self.owner, ttl=LEASE_TTL)
        self.token = current_scope.set(self.scope)
        self.watch = _PauseWatch()
        # An invocation nested in one of the run's nodes leaves the outer one's guard be.
        limits = self.settings.limits
        self._guarded = False
        if limits is not None and self.scope.limits is None and not self.scope.run.terminal:
            self.scope.enforce(LimitGuard(limits, self.ledger, self.scope.run))
            self._guarded = True
        self._shown_cancelling = False
        self.scope.on_task_cancel = self._ashow_cancelling

    @classmethod
    async def aopen(cls, graph: CancellableGraph, input: Any, config: RunnableConfig) -> Self:
        """The invocation of an async run: its start awaited on the loop when the ledger
        has an async twin here (an async saver's), else made in a thread."""
        check_durability(config)
        start = _RunStart.of(graph, input, config)
        twin = None
        if isinstance(start.bound, Ledger) and current_scope.get() is None:
            twin = async_twin_of(start.bound)
        if twin is None or not isinstance(start.bound, Ledger):
            return await asyncio.to_thread(cls, graph, input, config)
        scope = await ascope_for(
            config,
            twin,
            ledger=start.bound,
            new_run=start.new_run,
            run_id=start.run_id,
            owner=start.owner,
            lease_ttl=LEASE_TTL,
            prefetch_unsettled=start.new_run,
        )
        return cls(graph, input, config, scope)

    async def aend_completed(self) -> bool:
        """Close a run that ran to its end on the loop, through the ledger's async twin.

        True when this call closed it (and released the lease with it); False when
        the run needs the full ``end`` (no twin here, paused, asked to stop meanwhile).
        """
        twin = async_twin_of(self.ledger)
        if twin is None or self.graph.checkpointer is None or self.watch.paused:
            return False
        try:
            closed = await twin.afinish_run(
                self.scope.run_id, RunStatus.COMPLETED, release_lease=self.owner
            )
        except IllegalTransitionError:
            return False
        if not closed:
            return False
        self._released = True
        self._forget()
        return True

    def _forget(self) -> None:
        """Leave the run's scope: no more the current one, its lease no more renewed."""
        try:
            current_scope.reset(self.token)
        except ValueError:  # ended from another context (generator closed elsewhere)
            current_scope.set(None)
        self.scope.unsettled_at_start = None  # read for this invocation only
        self.scope.on_task_cancel = None
        if self._guarded:
            self.scope.enforce(None)  # a paused run's deadline is checked again on resume
        LEASES.let_go(self._lease)

    async def _ashow_cancelling(self) -> None:
        await asyncio.to_thread(self._show_cancelling)

    def watching(self, config: RunnableConfig | None) -> RunnableConfig:
        """``config`` with the handler that sees the graph pause.

        Added to the callbacks the graph would inherit (a parent graph's, when
        invoked from inside one of its nodes), not in place of them.
        """
        out: dict[str, Any] = dict(config or {})
        # LangGraph's run id for this invocation (the caller's, when given): the
        # lifecycle events of this graph carry it.
        if out.get("run_id") is None:
            out["run_id"] = uuid.uuid4()
        self.watch.run_id = str(out["run_id"])
        # Not merge_configs: inside another graph's node it would fold that graph's
        # configurable (thread, namespace) into this one's.
        callbacks = out.get("callbacks")
        if callbacks is None:
            ambient = var_child_runnable_config.get() or {}
            callbacks = ambient.get("callbacks")
        if callbacks is None:
            out["callbacks"] = [self.watch]
        elif isinstance(callbacks, list):
            out["callbacks"] = [*callbacks, self.watch]
        else:
            manager = callbacks.copy()
            manager.add_handler(self.watch, inherit=True)
            out["callbacks"] = manager
        return cast(RunnableConfig, out)

    def end(
        self, *, drained: bool, failed: bool, interrupted: bool = False, empty: bool = False
    ) -> None:
        """Close the run if it ended; clear drained work; release the lease.

        ``interrupted``: the run's task was cancelled (a server's ``runs.cancel``,
        a client disconnect, Ctrl-C). That is a stop request too: it is recorded
        as one and the cancel is finished from the ledger (the graph state of
        the interrupted step is gone; the next invocation answers its calls).

        ``empty``: LangGraph refused the invocation before its first step
        (``EmptyInputError``: no input and no checkpoint to resume). A failed
        invocation otherwise leaves its run live, to be resumed like a crash;
        a run with no checkpoint and no effect has nothing to resume, so it is
        closed ``failed`` instead of being left ``running`` forever.
        """
        self._forget()
        try:
            if drained:
                self._clear_queue()
            if interrupted:
                self._record_interruption()
                if not self._shown_cancelling:
                    self._show_cancelling()
            if not failed or interrupted:
                self._close_run(interrupted=interrupted)
            elif empty:
                self._close_empty_run()
        finally:
            try:
                if not self._released:
                    self.ledger.release_lease(self.scope.thread_id, self.owner)
            finally:
                drop_scope(self.scope)

    def _record_interruption(self) -> None:
        try:
            self.ledger.request_cancel(
                self.scope.thread_id,
                reason=INTERRUPTED_REASON,
                requested_by="runtime",
                cascade=True,
            )
        except Exception:
            logger.warning("could not record the interruption as a cancel", exc_info=True)

    def _show_cancelling(self) -> None:
        """Put a ``cancelling`` report, naming the calls in flight the stop waits for, in
        the thread state before waiting for them.

        A server's ``runs.cancel(wait=True)`` returns once the run is marked
        interrupted, which does not wait for the cancelled task to finish: whoever
        looks at the thread then sees that the stop is under way and what it waits
        for, and the final report replaces this one when the calls have settled.
        """
        self._shown_cancelling = True
        if self.graph.checkpointer is None:
            return
        try:
            run = self.ledger.get_run(self.scope.run_id)
            if run.terminal:
                return
            in_flight = [
                e.effect_id
                for e in self.ledger.run_effects(run.run_id)
                if e.status is EffectStatus.DISPATCHED
            ]
            if not in_flight:
                return  # nothing to wait for: the final report follows at once
            if run.status is RunStatus.CANCEL_REQUESTED:
                run = self.scope.signal.observe() or self.ledger.mark_observed(run.run_id)
            report = build_report(self.ledger, run, status=RunStatus.CANCELLING.value)
            report = report.model_copy(update={"awaiting": in_flight})
            config = self._state_config()
            self._keep_finished_writes(config)
            self.graph.update_state(
                config,
                {self.settings.report_key: report.model_dump(mode="json")},
                as_node=CANCEL_NODE,
            )
        except Exception:
            logger.warning("could not show the stop under way in the thread state", exc_info=True)

    def _clear_queue(self) -> None:
        if self.graph.checkpointer is None and not self.config.get("configurable", {}).get(
            "__pregel_checkpointer"
        ):
            return
        try:
            self.graph.update_state(self._state_config(), None, as_node=END)
        except Exception:
            logger.warning("could not clear queued tasks of a cancelled run", exc_info=True)

    def _state_config(self) -> RunnableConfig:
        conf = {
            k: v for k, v in self.config.get("configurable", {}).items() if not k.startswith("__")
        }
        conf.pop("checkpoint_id", None)
        return {"configurable": conf}

    def _settle_state(self, report: CancellationReport | None, dangling: list[ToolCall]) -> None:
        """Leave a cancelled run's state as the cancel node does: nothing queued, and,
        when the cancel was finished here, every call answered and the report stored.

        A diverted node's edges still fire, so a run can stop at an interrupt (e.g.
        ``interrupt_before``) after its cancel node ran; a cancel finished after the
        last check never reached the cancel node at all.
        """
        if self.graph.checkpointer is None:
            return
        config = self._state_config()
        try:
            if report is None:
                if self.graph.get_state(config).next:
                    self.graph.update_state(config, None, as_node=END)
                return
            update: dict[str, Any] = {self.settings.report_key: report.model_dump(mode="json")}
            if dangling:
                update[self.settings.messages_key] = answer_dangling(self.scope, dangling)
            self._keep_finished_writes(config)
            self.graph.update_state(config, update, as_node=CANCEL_NODE)
        except Exception:
            logger.warning("could not settle the state of a cancelled run", exc_info=True)

    def _keep_finished_writes(self, config: RunnableConfig) -> None:
        """Fold the writes of the saved step's finished tasks into the state.

        The run stopped inside a step (Ctrl-C, a server's ``runs.cancel``, a sibling
        that failed): a task that finished, a tool node with its answers, left its
        writes pending on the step's checkpoint. The live snapshot ``_dangling``
        reads shows them (and no longer lists the task as next), so their calls are
        not answered again; an update of the state as another node (the cancel's)
        starts from the saved step and would drop them. Updating as ``END`` first
        keeps them and clears the tasks that will not run. Done once the cancel is
        finished, or when a stopped task shows its stop under way: until then the
        saved step names what to resume.
        """
        if self.graph.get_state(config).tasks:
            self.graph.update_state(config, None, as_node=END)

    def _dangling(self) -> list[ToolCall]:
        """Tool calls the saved state leaves unanswered (none known without a checkpointer)."""
        if self.graph.checkpointer is None:
            return []
        try:
            snapshot = self.graph.get_state(self._state_config())
        except Exception:
            logger.debug("no state to inspect", exc_info=True)
            return []
        return dangling_tool_calls(_messages(snapshot.values, self.settings.messages_key))

    def _close_run(self, *, interrupted: bool = False) -> None:
        # A run whose task was cancelled is a stopped run, never a completed one, even
        # when the task cancel was swallowed and the graph ran on to its end.
        if not interrupted and self._complete():
            return
        run = self.ledger.get_run(self.scope.run_id)
        if run.terminal:
            if run.status is RunStatus.CANCELLED:
                self._settle_state(None, [])
            return
        if run.cancel_requested:
            # The signal arrived after the last check: finish the cancel here. Calls the
            # saved state leaves unanswered (e.g. paused at an approval interrupt) will
            # never run: the cancel records them as not run.
            dangling = self._dangling()
            report = finalize_cancel(self.scope, self.settings, dangling)
            self._settle_state(report, dangling)

    def _close_empty_run(self) -> None:
        """Close a run that nothing ran under (see ``end``); leave any other alone."""
        try:
            if self.ledger.run_effects(self.scope.run_id):
                return
            if (
                self.graph.checkpointer is not None
                and self.graph.get_state(self._state_config()).values
            ):
                return
            self._released = self.ledger.finish_run(
                self.scope.run_id, RunStatus.FAILED, release_lease=self.owner
            )
        except Exception:
            logger.warning("could not close the run of an empty invocation", exc_info=True)

    def _complete(self) -> bool:
        """Mark the run completed if the graph ran to its end; True if this call did.

        The compare-and-set only moves a ``running`` run: a run asked to stop
        meanwhile, or already finished, is left to ``_close_run``.
        """
        if self.graph.checkpointer is None or self.watch.paused:
            return False  # paused at an interrupt: the run goes on later
        try:
            # The lease goes back in the same round trip when this call ends the run.
            self._released = self.ledger.finish_run(
                self.scope.run_id, RunStatus.COMPLETED, release_lease=self.owner
            )
        except IllegalTransitionError:
            return False
        return self._released


class CancellableGraph(CompiledStateGraph):  # type: ignore[type-arg]
    """A compiled graph whose every invocation is one scoped, leased, closable run."""

    cancellation: CancellationSettings

    def _with_bound_ledger(self, config: RunnableConfig | None) -> RunnableConfig | None:
        """Hand ``add_cancellation(..., ledger=...)`` to every node through the config."""
        bound = self.cancellation.ledger
        if bound is None:
            return config
        out: dict[str, Any] = dict(config or {})
        out["configurable"] = {**(out.get("configurable") or {}), CONFIG_KEY_LEDGER: bound}
        return cast(RunnableConfig, out)

    def copy(self, update: dict[str, Any] | None = None) -> Self:
        """As ``Pregel.copy``, keeping the cancellation settings.

        ``Pregel.copy`` rebuilds the object from its constructor arguments, which
        drops attributes set after ``compile()``. The LangGraph API server copies
        every graph it runs (``copy(update={"checkpointer": ..., "store": ...})``),
        and ``with_config`` copies too.
        """
        clone = super().copy(update)
        clone.cancellation = self.cancellation
        return clone

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """As ``CompiledStateGraph.stream``, inside the run's scope."""
        config = self._with_bound_ledger(config)
        merged = ensure_config(merge_configs(self.config, config))
        check_durability(merged, kwargs.get("durability"))  # refuse before any node runs
        if not merged.get("configurable", {}).get("thread_id"):
            yield from super().stream(input, config, **kwargs)
            return
        inv = _Invocation(self, input, merged)
        kwargs.setdefault("control", RunControl())
        drained = failed = interrupted = empty = False
        try:
            yield from super().stream(input, inv.watching(config), **kwargs)
        except GraphDrained as exc:
            if exc.reason != DRAIN_REASON:
                failed = True
                raise
            drained = True
        except KeyboardInterrupt:
            failed = interrupted = True
            raise
        except EmptyInputError:
            failed = empty = True
            raise
        except BaseException:
            failed = True
            raise
        finally:
            inv.end(drained=drained, failed=failed, interrupted=interrupted, empty=empty)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """As ``CompiledStateGraph.astream``, inside the run's scope."""
        config = self._with_bound_ledger(config)
        merged = ensure_config(merge_configs(self.config, config))
        check_durability(merged, kwargs.get("durability"))  # refuse before any node runs
        if not merged.get("configurable", {}).get("thread_id"):
            async for chunk in super().astream(input, config, **kwargs):
                yield chunk
            return
        outer = current_scope.get()
        inv = await _Invocation.aopen(self, input, merged)
        current_scope.set(inv.scope)
        kwargs.setdefault("control", RunControl())
        drained = failed = interrupted = empty = False
        try:
            async for chunk in super().astream(input, inv.watching(config), **kwargs):
                yield chunk
            # A task cancel that something inside the run swallowed is still a stop
            # (the task asked now: a server steps the generator from a task per step).
            task = asyncio.current_task()
            interrupted = failed = task is not None and task.cancelling() > 0
        except GraphDrained as exc:
            if exc.reason != DRAIN_REASON:
                failed = True
                raise
            drained = True
        except (asyncio.CancelledError, KeyboardInterrupt):
            # The stop is raised in this process before anything else: nodes still
            # running (a tool waiting for its turn) see it at their next check.
            inv.scope.signal.set()
            failed = interrupted = True
            raise
        except EmptyInputError:
            failed = empty = True
            raise
        except BaseException:
            failed = True
            raise
        finally:
            # The caller's context gets its scope back here: the end runs in a task of
            # its own, whose context is a copy.
            current_scope.set(outer)
            closing = asyncio.ensure_future(
                self._aend(
                    inv, drained=drained, failed=failed, interrupted=interrupted, empty=empty
                )
            )
            await asyncio.shield(closing)

    @staticmethod
    async def _aend(
        inv: _Invocation, *, drained: bool, failed: bool, interrupted: bool, empty: bool
    ) -> None:
        """End an async run: a run that ran to its end is closed on the loop when it can
        be, anything else (a stop, a failure, a pause) in a thread."""
        if not (drained or failed or interrupted) and await inv.aend_completed():
            drop_scope(inv.scope)
            return
        await asyncio.to_thread(
            inv.end, drained=drained, failed=failed, interrupted=interrupted, empty=empty
        )


__all__ = [
    "CANCEL_NODE",
    "RECONCILE_NODE",
    "REPORT_KEY",
    "CancellableGraph",
    "CancellableStateGraph",
    "CancellationSettings",
    "add_cancellation",
    "answer_dangling",
    "finalize_cancel",
    "reconcile_thread",
    "resolve_ledger",
    "thread_id_of",
]

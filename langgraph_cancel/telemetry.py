"""OpenTelemetry export of stopped runs: spans of what happened, and the six numbers.

Needs the ``otel`` extra (``pip install 'langgraph-cancel[otel]'``): the
OpenTelemetry API and SDK. Configure the SDK's providers as usual (an OTLP
exporter, a Prometheus reader, ...) and hand them over, or let the global
ones be used::

    from langgraph_cancel.telemetry import CancellationTelemetry

    telemetry = CancellationTelemetry()  # the global tracer and meter providers
    telemetry.export(ledger, since=last_export)  # e.g. every minute, from a sidecar

For each run whose stop was requested and that has finished (each stop once:
a sub-agent stopped with its parent is exported within its parent's tree):

- a span per run, from its start to its quiescence (or its end), with a child
  span per sub-agent run, and under each run a span per effect transition of
  its calls (from the call's previous transition to this one), carrying the
  tool, the kind, the two statuses and the actor;
- the six numbers as instruments (:data:`INSTRUMENTS`), computed by
  :mod:`langgraph_cancel.metrics` exactly as ``langgraph-cancel stats`` does:
  ``stats`` over a window and the export of the same runs agree.

Everything is read from the ledger, with the ledger's own timestamps, so any
process can export what any worker did. A ``CancellationTelemetry`` exports
each run once; numbers that move after a run was exported (a compensation run
later from the command line) are counted by the next ``stats``, not re-exported.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from langgraph_cancel.errors import ConfigurationError
from langgraph_cancel.ledger.queries import RunTree, cancelled_trees
from langgraph_cancel.metrics import RunMetrics, run_metrics, stopped_roots
from langgraph_cancel.types import EffectRecord, RunRecord, TransitionRecord

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
except ImportError as exc:  # pragma: no cover - the extra is installed in the test suite
    raise ConfigurationError(
        "OpenTelemetry export needs the extra: pip install 'langgraph-cancel[otel]'"
    ) from exc

if TYPE_CHECKING:
    from langgraph_cancel.ledger import Ledger

#: The instrumentation scope's name.
SCOPE = "langgraph_cancel"

#: The instruments, by the number of the seed they carry.
CANCELLATIONS = "langgraph_cancel.cancellations"
QUIESCENCE = "langgraph_cancel.cancel.quiescence"
DISPATCHED_IN_WINDOW = "langgraph_cancel.cancel.dispatched_in_window"
UNKNOWN_OUTCOMES = "langgraph_cancel.cancel.unknown_outcomes"
ORPHANS = "langgraph_cancel.cancel.orphans"
PERMANENT_EFFECTS = "langgraph_cancel.cancel.permanent_effects"
COMPENSATIONS = "langgraph_cancel.compensations"
TOKENS_AFTER_SIGNAL = "langgraph_cancel.cancel.tokens_after_signal"

INSTRUMENTS: tuple[str, ...] = (
    CANCELLATIONS,
    QUIESCENCE,
    DISPATCHED_IN_WINDOW,
    UNKNOWN_OUTCOMES,
    ORPHANS,
    PERMANENT_EFFECTS,
    COMPENSATIONS,
    TOKENS_AFTER_SIGNAL,
)

#: The span names: one per run, one per effect transition.
RUN_SPAN = "langgraph_cancel.run"
TRANSITION_SPAN = "langgraph_cancel.effect"


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


class CancellationTelemetry:
    """Exports stopped runs from the ledger to OpenTelemetry traces and metrics.

    Args:
        tracer_provider: Where the spans go (default: the global provider).
        meter_provider: Where the measurements go (default: the global provider).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: otel_metrics.MeterProvider | None = None,
    ) -> None:
        from langgraph_cancel import __version__

        self._tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
        meter = otel_metrics.get_meter(SCOPE, __version__, meter_provider=meter_provider)
        self._cancellations = meter.create_counter(
            CANCELLATIONS, unit="{cancellation}", description="Runs whose stop was handled"
        )
        self._quiescence = meter.create_histogram(
            QUIESCENCE, unit="ms", description="Time from a stop's request to the run's quiescence"
        )
        self._dispatched = meter.create_counter(
            DISPATCHED_IN_WINDOW,
            unit="{call}",
            description="Calls dispatched between a stop's request and the run's quiescence",
        )
        self._unknown = meter.create_counter(
            UNKNOWN_OUTCOMES, unit="{call}", description="Calls a stop left with unknown outcome"
        )
        self._orphans = meter.create_counter(
            ORPHANS, unit="{run}", description="Child runs that never saw the stop"
        )
        self._permanent = meter.create_counter(
            PERMANENT_EFFECTS,
            unit="{call}",
            description="Irreversible calls committed in stopped runs (sub-agents included)",
        )
        self._compensations = meter.create_counter(
            COMPENSATIONS,
            unit="{compensation}",
            description="Compensations tried in stopped runs, by outcome (succeeded, failed)",
        )
        self._tokens = meter.create_counter(
            TOKENS_AFTER_SIGNAL,
            unit="{token}",
            description="Model tokens spent after a run saw its stop",
        )
        self._exported: set[str] = set()
        self._lock = threading.Lock()

    def export(self, ledger: Ledger, *, since: datetime) -> list[RunMetrics]:
        """Export every finished run whose stop was requested at or after ``since``.

        Runs this object exported before, and runs still stopping, are left
        out (call again later for those).

        Args:
            ledger: The ledger to read.
            since: The window's start (an aware datetime).

        Returns:
            The numbers of each run exported now, oldest request first.
        """
        return self.export_trees(cancelled_trees(ledger, since))

    def export_trees(self, trees: Sequence[RunTree]) -> list[RunMetrics]:
        """Export the finished stops among ``trees`` (as ``cancelled_trees`` reads them)."""
        exported: list[RunMetrics] = []
        for tree in stopped_roots(trees):
            if not tree.run.terminal:
                continue
            with self._lock:
                if tree.run.run_id in self._exported:
                    continue
                self._exported.add(tree.run.run_id)
            numbers = run_metrics(tree)
            self._trace(tree)
            self._measure(numbers)
            exported.append(numbers)
        return exported

    # ------------------------------------------------------------------ metrics
    def _measure(self, numbers: RunMetrics) -> None:
        self._cancellations.add(1, {"status": numbers.status})
        if numbers.quiescence_ms is not None:
            self._quiescence.record(numbers.quiescence_ms)
        for tool, count in numbers.dispatched_in_window.items():
            self._dispatched.add(count, {"tool": tool})
        for tool, count in numbers.unknown.items():
            self._unknown.add(count, {"tool": tool})
        self._orphans.add(numbers.orphans)
        for tool, count in numbers.permanent.items():
            self._permanent.add(count, {"tool": tool})
        for tool, count in numbers.compensations_succeeded.items():
            self._compensations.add(count, {"tool": tool, "outcome": "succeeded"})
        for tool, count in numbers.compensations_failed.items():
            self._compensations.add(count, {"tool": tool, "outcome": "failed"})
        self._tokens.add(numbers.tokens_after_signal)

    # ------------------------------------------------------------------- traces
    def _trace(self, tree: RunTree) -> None:
        runs = [tree.run, *tree.runs]
        by_run: dict[str, list[EffectRecord]] = {}
        for effect in tree.effects:
            by_run.setdefault(effect.run_id, []).append(effect)
        steps: dict[str, list[TransitionRecord]] = {}
        for step in tree.transitions:
            steps.setdefault(step.effect_id, []).append(step)
        spans: dict[str, Any] = {}
        # Parents before children: a child run's span hangs under its parent's.
        for run in sorted(runs, key=lambda r: (r.run_id != tree.run.run_id, r.created_at)):
            parent = spans.get(run.parent_run_id or "")
            context = trace.set_span_in_context(parent) if parent is not None else None
            span = self._tracer.start_span(
                RUN_SPAN,
                context=context,
                start_time=_ns(run.created_at),
                attributes=_run_attributes(run),
            )
            spans[run.run_id] = span
            for name, moment in (
                ("stop requested", run.requested_at),
                ("stop observed", run.observed_at),
                ("quiesced", run.quiesced_at),
            ):
                if moment is not None:
                    span.add_event(name, timestamp=_ns(moment))
            run_context = trace.set_span_in_context(span)
            for effect in by_run.get(run.run_id, []):
                self._trace_effect(effect, steps.get(effect.effect_id, []), run_context)
        for run in reversed(runs):
            spans[run.run_id].end(end_time=_ns(run.quiesced_at or run.updated_at))

    def _trace_effect(
        self, effect: EffectRecord, steps: list[TransitionRecord], context: Any
    ) -> None:
        previous = effect.created_at
        for step in steps:
            span = self._tracer.start_span(
                f"{TRANSITION_SPAN} {step.to_status.value}",
                context=context,
                start_time=_ns(min(previous, step.at)),
                attributes={
                    "langgraph_cancel.effect_id": effect.effect_id,
                    "langgraph_cancel.tool": effect.tool,
                    "langgraph_cancel.tool_call_id": effect.tool_call_id,
                    "langgraph_cancel.kind": effect.kind.value,
                    "langgraph_cancel.from_status": (
                        step.from_status.value if step.from_status is not None else ""
                    ),
                    "langgraph_cancel.to_status": step.to_status.value,
                    "langgraph_cancel.actor": step.actor,
                },
            )
            span.end(end_time=_ns(step.at))
            previous = step.at


def _run_attributes(run: RunRecord) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "langgraph_cancel.run_id": run.run_id,
        "langgraph_cancel.thread_id": run.thread_id,
        "langgraph_cancel.status": run.status.value,
    }
    if run.parent_run_id is not None:
        attributes["langgraph_cancel.parent_run_id"] = run.parent_run_id
    if run.reason is not None:
        attributes["langgraph_cancel.reason"] = run.reason
    if run.requested_by is not None:
        attributes["langgraph_cancel.requested_by"] = run.requested_by
    if run.tokens_after_cancel is not None:
        attributes["langgraph_cancel.tokens_after_cancel"] = run.tokens_after_cancel
    return attributes


__all__ = [
    "CANCELLATIONS",
    "COMPENSATIONS",
    "DISPATCHED_IN_WINDOW",
    "INSTRUMENTS",
    "ORPHANS",
    "PERMANENT_EFFECTS",
    "QUIESCENCE",
    "RUN_SPAN",
    "SCOPE",
    "TOKENS_AFTER_SIGNAL",
    "TRANSITION_SPAN",
    "UNKNOWN_OUTCOMES",
    "CancellationTelemetry",
]

"""A tool-node batch's schedule: its calls by phase, whether its side effects go out
at once, which of them may begin with the batch's plan, and the same call asked twice.

``EffectToolNode`` runs read-only calls first, concurrently, as ``ToolNode`` runs its
calls; then the side effects in plan order (reversible before irreversible, then
batch order), one at a time unless ``effect_concurrency`` says otherwise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool

from langgraph_cancel.effects import EffectSpec
from langgraph_cancel.execution.identity import CallTurns, canonical
from langgraph_cancel.execution.plan import CallPlan, classify
from langgraph_cancel.types import EffectKind

_KIND_ORDER = {EffectKind.READ_ONLY: 0, EffectKind.REVERSIBLE: 1, EffectKind.IRREVERSIBLE: 2}


@dataclass(frozen=True, slots=True)
class Phases:
    """A batch's calls by phase, as positions in the batch."""

    #: Read-only calls, and calls answered without running anything: they go first.
    reads: list[int]
    #: Side effects (and calls a wrapper of the user's may serve), in plan order.
    effects: list[int]
    #: By position: the calls this node's tools run.
    plans: dict[int, CallPlan]

    def planned(self) -> tuple[list[CallPlan], list[CallPlan]]:
        """The plans of the reads and of the side effects, in their phases' order."""
        reads = [self.plans[index] for index in self.reads if index in self.plans]
        effects = [self.plans[index] for index in self.effects if index in self.plans]
        return reads, effects


def sort_calls(
    calls: list[ToolCall],
    *,
    tools_by_name: Mapping[str, BaseTool],
    specs: Mapping[str, EffectSpec],
    wrapped: bool,
    thread_id: str,
    history: Sequence[Any],
) -> Phases:
    """The phases: read-only calls (and calls no tool of the node runs), then side
    effects in plan order (reversible before irreversible, then batch order).

    Args:
        calls: The batch.
        tools_by_name: The node's tools.
        specs: Their effect classifications, by tool name.
        wrapped: Whether a wrapper of the user's may serve a call no tool runs.
        thread_id: The run's thread.
        history: The messages of the node's input, to tell a call from the same id
            asked in an earlier turn.
    """
    reads: list[int] = []
    effects: list[tuple[int, int]] = []
    plans: dict[int, CallPlan] = {}
    turns = CallTurns(history)
    for index, call in enumerate(calls):
        name = call.get("name")
        tool = tools_by_name.get(name) if isinstance(name, str) else None
        if tool is None:
            # No tool of this node: a wrapper of the user's may serve it, so it counts
            # as a side effect (fail safe); without one, ToolNode answers it.
            if wrapped:
                effects.append((_KIND_ORDER[EffectKind.IRREVERSIBLE], index))
            else:
                reads.append(index)
            continue
        spec = specs[tool.name]
        turn = turns.of(str(call.get("id")))
        plan = classify(index, call, tool, spec, thread_id, turn=turn)
        if not isinstance(plan, CallPlan):
            reads.append(index)  # answered without running anything
            continue
        plans[index] = plan
        if plan.fast_read:
            reads.append(index)
        else:
            effects.append((_KIND_ORDER[spec.kind], index))
    effects.sort()
    return Phases(reads, [index for _, index in effects], plans)


def goes_at_once(phases: Phases, config: RunnableConfig, effect_concurrency: int) -> bool:
    """Whether the side effects go out at once: ``effect_concurrency`` above 1, and no
    call waits for a review (the questions must come one at a time, in plan order)."""
    if effect_concurrency == 1 or config.get("max_concurrency") == 1:
        return False
    return not any(
        (plan := phases.plans.get(index)) is None or plan.needs_review for index in phases.effects
    )


def concurrency_limit(config: RunnableConfig, effect_concurrency: int) -> int:
    """Side effects that may run at once: ``effect_concurrency``, or the run's
    ``max_concurrency`` when it is lower."""
    return min(effect_concurrency, config.get("max_concurrency") or effect_concurrency)


def to_begin(
    phases: Phases, config: RunnableConfig, effect_concurrency: int, *, limited: bool
) -> list[CallPlan]:
    """The side effects whose intents may go with the batch's plan.

    One at a time, the first side effect, when no read runs before it and it is
    neither reviewed nor held. At once, as many as may run together, when no read runs
    before them, none of them is held and no tool-call id repeats among them (so each
    intent is its own call's). None when the run has limits (``limited``): they count
    the batch's calls before any of them leaves.
    """
    if phases.reads or not phases.effects or limited:
        return []
    plans = [phases.plans.get(index) for index in phases.effects]
    if not goes_at_once(phases, config, effect_concurrency):
        first = plans[0]
        return [] if first is None or first.needs_review or first.spec.held else [first]
    ready = [plan for plan in plans[: concurrency_limit(config, effect_concurrency)] if plan]
    if any(plan.spec.held for plan in ready) or len({p.call_id for p in ready}) < len(ready):
        return []
    return ready


def twins(phases: Phases, calls: list[ToolCall]) -> tuple[list[int], list[tuple[int, int]]]:
    """The side effects to run, and the copies to answer from them.

    The same call twice in a batch (same id, tool and arguments) is one step: run it
    once and give each copy its answer, instead of letting the copy find its twin in
    flight, or act on the record as the batch found it before its twin moved it.

    Returns:
        The positions to run, in plan order, and ``(copy, twin)`` position pairs.
    """
    ids = Counter(str(calls[index].get("id")) for index in phases.effects)
    first: dict[tuple[str, str, str], int] = {}
    unique: list[int] = []
    copies: list[tuple[int, int]] = []
    for index in phases.effects:
        call = calls[index]
        call_id = str(call.get("id"))
        if ids[call_id] > 1:  # only a shared id can be a copy: compare the arguments
            identity = (call_id, str(call.get("name")), canonical(call.get("args")))
            twin = first.setdefault(identity, index)
            if twin != index:
                copies.append((index, twin))
                continue
        unique.append(index)
    return unique, copies


def answer_copies(outputs: list[Any], copies: list[tuple[int, int]]) -> None:
    """Each copy of a call gets its own copy of its twin's answer."""
    for index, twin in copies:
        answer = outputs[twin]
        outputs[index] = answer.model_copy() if isinstance(answer, ToolMessage) else answer


__all__ = [
    "Phases",
    "answer_copies",
    "concurrency_limit",
    "goes_at_once",
    "sort_calls",
    "to_begin",
    "twins",
]

"""A stop's progress read from the ledger, for a client in another process.

The run handling a stop streams its steps as custom events
(:mod:`langgraph_cancel.progress`) to whoever drives its graph. A client that
does not (``langgraph-cancel cancel --follow``, a dashboard) reads the same
steps from the ledger instead: each is a :class:`ProgressEvent` of the same
schema, derived from the run's row and its calls' audit trail:

- ``requested`` and ``observed``: the run row's request and observation;
- ``waiting``: a call in flight when the run saw the stop (``grace_s`` is not
  in the ledger: null);
- ``settled``: such a call's outcome, once recorded;
- ``dropped``, ``compensated``, ``compensation_failed``: a call that took that
  step after the request;
- ``cancelled``: the run's terminal transition, with the report it wrote.

Calls of sub-agents' runs (the task tree) are included. Events come in the
order of the ledger's timestamps; each once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING

from langgraph_cancel.errors import FollowTimeoutError, UnknownRunError
from langgraph_cancel.ledger.queries import RunTree, run_tree
from langgraph_cancel.progress import ProgressEffect, ProgressEvent, ProgressKind
from langgraph_cancel.types import (
    EffectRecord,
    EffectStatus,
    RunRecord,
    RunStatus,
    TransitionRecord,
)

if TYPE_CHECKING:
    from langgraph_cancel.ledger import Ledger

#: Seconds between two reads of the ledger while following.
FOLLOW_INTERVAL = 0.1

_ORDER = {kind: number for number, kind in enumerate(ProgressKind)}
_STEP_KINDS = {
    EffectStatus.DROPPED: ProgressKind.DROPPED,
    EffectStatus.COMPENSATED: ProgressKind.COMPENSATED,
    EffectStatus.COMPENSATION_FAILED: ProgressKind.COMPENSATION_FAILED,
}


def _view(effect: EffectRecord, status: EffectStatus) -> ProgressEffect:
    return ProgressEffect.of(effect).model_copy(update={"status": status})


#: A step found in the ledger: when it happened, the key naming it, its event.
_Step = tuple[datetime, str, ProgressEvent]


def _run_steps(run: RunRecord, requested: datetime) -> list[_Step]:
    """The run row's own steps: requested, observed, and cancelled once it is."""
    found: list[_Step] = [
        (
            requested,
            "requested",
            ProgressEvent(
                event=ProgressKind.REQUESTED,
                run_id=run.run_id,
                thread_id=run.thread_id,
                at=requested,
                reason=run.reason,
                requested_by=run.requested_by,
                requested_at=requested,
            ),
        )
    ]
    observed = run.observed_at
    if observed is not None:
        found.append(
            (
                observed,
                "observed",
                ProgressEvent(
                    event=ProgressKind.OBSERVED,
                    run_id=run.run_id,
                    thread_id=run.thread_id,
                    at=observed,
                    observed_at=observed,
                ),
            )
        )
    if run.status is RunStatus.CANCELLED:
        found.append(
            (
                run.updated_at,
                "cancelled",
                ProgressEvent(
                    event=ProgressKind.CANCELLED,
                    run_id=run.run_id,
                    thread_id=run.thread_id,
                    at=run.updated_at,
                    report=run.report,
                ),
            )
        )
    return found


def _call_steps(tree: RunTree, requested: datetime) -> list[_Step]:
    """The calls' steps since the request, sub-agents' runs included."""
    found: list[_Step] = []

    def add(moment: datetime, key: str, event: ProgressEvent) -> None:
        found.append((moment, key, event))

    trails: dict[str, list[TransitionRecord]] = {}
    for step in tree.transitions:
        trails.setdefault(step.effect_id, []).append(step)
    # A sub-agent's run sees the stop when it does: its calls wait from then.
    seen_at = {each.run_id: each.observed_at for each in (tree.run, *tree.runs)}
    for effect in tree.effects:
        trail = trails.get(effect.effect_id, [])
        run_saw_it = seen_at.get(effect.run_id)
        if run_saw_it is not None:
            _waiting_and_settled(effect, trail, run_saw_it, add)
        for step in trail:
            kind = _STEP_KINDS.get(step.to_status)
            if kind is not None and step.at >= requested:
                add(
                    step.at,
                    f"{kind.value}:{effect.effect_id}:{step.at.isoformat()}",
                    ProgressEvent(
                        event=kind,
                        run_id=effect.run_id,
                        thread_id=effect.thread_id,
                        at=step.at,
                        effect=_view(effect, step.to_status),
                    ),
                )
    return found


def progress_of(tree: RunTree) -> list[tuple[str, ProgressEvent]]:
    """Every step of the run's stop the ledger shows so far, oldest first.

    Args:
        tree: The run with its task tree (``langgraph_cancel.ledger.queries.run_tree``).

    Returns:
        ``(key, event)`` pairs: the key names the step, so that a follower
        reading the ledger again yields each step once.
    """
    requested = tree.run.requested_at
    if requested is None:
        return []
    found = _run_steps(tree.run, requested) + _call_steps(tree, requested)
    # The run's own steps are each the only one of their kind, so only calls' steps can
    # tie on (time, kind); the stable sort keeps those in the ledger's order.
    found.sort(key=lambda item: (item[0], _ORDER[item[2].event]))
    return [(key, event) for _moment, key, event in found]


def _waiting_and_settled(
    effect: EffectRecord,
    trail: list[TransitionRecord],
    observed: datetime,
    add: Callable[[datetime, str, ProgressEvent], None],
) -> None:
    """``waiting`` for a call in flight when its run saw the stop, ``settled`` once it is."""
    in_flight_since: datetime | None = None
    for step in trail:
        if step.at > observed:
            break
        in_flight_since = step.at if step.to_status is EffectStatus.DISPATCHED else None
    if in_flight_since is None:
        return
    waiting = _view(effect, EffectStatus.DISPATCHED).model_copy(
        update={"dispatched_at": in_flight_since}
    )
    add(
        observed,
        f"waiting:{effect.effect_id}",
        ProgressEvent(
            event=ProgressKind.WAITING,
            run_id=effect.run_id,
            thread_id=effect.thread_id,
            at=observed,
            effect=waiting,
        ),
    )
    outcome = next(
        (
            step
            for step in trail
            if step.at > observed
            and step.from_status is EffectStatus.DISPATCHED
            and step.to_status is not EffectStatus.DISPATCHED
        ),
        None,
    )
    if outcome is not None:
        add(
            outcome.at,
            f"settled:{effect.effect_id}",
            ProgressEvent(
                event=ProgressKind.SETTLED,
                run_id=effect.run_id,
                thread_id=effect.thread_id,
                at=outcome.at,
                effect=_view(effect, outcome.to_status),
            ),
        )


def follow(
    ledger: Ledger,
    run_id: str,
    *,
    interval: float = FOLLOW_INTERVAL,
    timeout: float | None = None,
) -> Iterator[ProgressEvent]:
    """Yield the steps of a run's stop as the ledger records them, until the run ends.

    Args:
        ledger: The run's ledger (any process's connection to its database).
        run_id: The run asked to stop.
        interval: Seconds between two reads.
        timeout: Stop following after this many seconds (``None``: until the run ends).

    Raises:
        UnknownRunError: The ledger has no such run.
        FollowTimeoutError: ``timeout`` passed before the run ended.
    """
    seen: set[str] = set()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        tree = run_tree(ledger, run_id)
        if tree is None:
            raise UnknownRunError(run_id)
        for key, event in progress_of(tree):
            if key not in seen:
                seen.add(key)
                yield event
        if tree.run.terminal:
            return
        if timeout is not None and deadline is not None and time.monotonic() > deadline:
            raise FollowTimeoutError(run_id, timeout)
        time.sleep(interval)


__all__ = ["FOLLOW_INTERVAL", "follow", "progress_of"]

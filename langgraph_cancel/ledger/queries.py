"""Read-only questions across many runs: what operators' tools (``stats``, telemetry) ask.

The ledger's own methods answer about one thread or one run. These answer
about every run a stop was requested for in a time window (or about one run),
each with the whole task tree under it (its sub-agents' runs, recursively), their calls and
the calls' audit trail, in one round trip of three statements on memory,
SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from langgraph_cancel.ledger.core import Ledger
from langgraph_cancel.ledger.records import effect_record, run_record, transition_record
from langgraph_cancel.ledger.retry import transient_retry
from langgraph_cancel.ledger.sql import EFFECT_COLUMNS, RUN_COLUMNS
from langgraph_cancel.types import EffectRecord, RunRecord, TransitionRecord


def _prefixed(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{column.strip()}" for column in columns.split(","))


# Runs asked to stop in the window, and every run below each of them. UNION (not
# UNION ALL) so that a malformed parent chain cannot loop.
_TREE = """
WITH RECURSIVE tree(run_id, root_id) AS (
    SELECT run_id, run_id FROM lgc_runs
    WHERE requested_at IS NOT NULL AND requested_at >= %(since)s
UNION
    SELECT r.run_id, tree.root_id FROM lgc_runs r JOIN tree ON r.parent_run_id = tree.run_id
)"""

SELECT_TREE_RUNS = f"""{_TREE}
SELECT tree.root_id AS root_id, {_prefixed(RUN_COLUMNS, "r")}
FROM tree JOIN lgc_runs r ON r.run_id = tree.run_id
ORDER BY r.created_at, r.run_id"""

SELECT_TREE_EFFECTS = f"""{_TREE}
SELECT tree.root_id AS root_id, {_prefixed(EFFECT_COLUMNS, "e")}
FROM tree JOIN lgc_effects e ON e.run_id = tree.run_id
ORDER BY e.created_at, e.seq, e.effect_id"""

SELECT_TREE_TRANSITIONS = f"""{_TREE}
SELECT tree.root_id AS root_id, t.effect_id, t.from_status, t.to_status, t.at, t.actor,
       t.detail
FROM tree JOIN lgc_effects e ON e.run_id = tree.run_id
JOIN lgc_transitions t ON t.effect_id = e.effect_id
ORDER BY t.id"""


# One run and every run below it (``run_tree``).
_TREE_OF_RUN = """
WITH RECURSIVE tree(run_id, root_id) AS (
    SELECT run_id, run_id FROM lgc_runs WHERE run_id = %(run_id)s
UNION
    SELECT r.run_id, tree.root_id FROM lgc_runs r JOIN tree ON r.parent_run_id = tree.run_id
)"""


def _of_one_run(statement: str) -> str:
    return statement.replace(_TREE, _TREE_OF_RUN, 1)


@dataclass(frozen=True, slots=True)
class RunTree:
    """A run a stop was requested for, with everything under it.

    Attributes:
        run: The run (a sub-agent's run too, when its stop was requested by itself).
        runs: Its child runs, recursively (not ``run`` itself).
        effects: The calls of ``run`` and of every run in ``runs``, in plan order.
        transitions: Those calls' audit trail, in the order it was written.
    """

    run: RunRecord
    runs: list[RunRecord] = field(default_factory=list)
    effects: list[EffectRecord] = field(default_factory=list)
    transitions: list[TransitionRecord] = field(default_factory=list)


@transient_retry()
def cancelled_trees(ledger: Ledger, since: datetime) -> list[RunTree]:
    """Every run whose stop was requested at or after ``since``, each with its task tree.

    A run stopped by its own request and also under a stopped parent appears
    in both trees; callers that count calls once per stop keep the roots only
    (:func:`langgraph_cancel.metrics.stopped_roots`).

    Args:
        ledger: The ledger to read.
        since: The window's start (an aware datetime).

    Returns:
        One ``RunTree`` per such run, oldest request first.
    """
    backend = ledger.backend
    params = {"since": backend.ts_in(since)}
    run_rows, effect_rows, transition_rows = backend.all_rows(
        [
            (SELECT_TREE_RUNS, params),
            (SELECT_TREE_EFFECTS, params),
            (SELECT_TREE_TRANSITIONS, params),
        ]
    )
    trees: dict[str, RunTree] = {}
    children: dict[str, list[RunRecord]] = {}
    for row in run_rows:
        run = run_record(row, backend)
        if row["root_id"] == run.run_id:
            trees[run.run_id] = RunTree(run)
        else:
            children.setdefault(row["root_id"], []).append(run)
    for root_id, runs in children.items():
        trees[root_id].runs.extend(runs)
    for row in effect_rows:
        trees[row["root_id"]].effects.append(effect_record(row, backend))
    for row in transition_rows:
        trees[row["root_id"]].transitions.append(transition_record(row, backend))
    return sorted(trees.values(), key=_requested_order)


@transient_retry()
def run_tree(ledger: Ledger, run_id: str) -> RunTree | None:
    """One run with its task tree (its sub-agents' runs, their calls, the audit trail).

    Args:
        ledger: The ledger to read.
        run_id: The run.

    Returns:
        The tree, or ``None`` when the ledger has no such run.
    """
    backend = ledger.backend
    params = {"run_id": run_id}
    run_rows, effect_rows, transition_rows = backend.all_rows(
        [
            (_of_one_run(SELECT_TREE_RUNS), params),
            (_of_one_run(SELECT_TREE_EFFECTS), params),
            (_of_one_run(SELECT_TREE_TRANSITIONS), params),
        ]
    )
    runs = [run_record(row, backend) for row in run_rows]
    top = next((run for run in runs if run.run_id == run_id), None)
    if top is None:
        return None
    return RunTree(
        top,
        runs=[run for run in runs if run.run_id != run_id],
        effects=[effect_record(row, backend) for row in effect_rows],
        transitions=[transition_record(row, backend) for row in transition_rows],
    )


def _requested_order(tree: RunTree) -> tuple[datetime, str]:
    assert tree.run.requested_at is not None  # selected for having one
    return tree.run.requested_at, tree.run.run_id


__all__ = [
    "SELECT_TREE_EFFECTS",
    "SELECT_TREE_RUNS",
    "SELECT_TREE_TRANSITIONS",
    "RunTree",
    "cancelled_trees",
    "run_tree",
]

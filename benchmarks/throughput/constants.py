"""The throughput section's shape: worker counts, runs, rounds and its target."""

from __future__ import annotations

from pathlib import Path

#: The repository's root: the workers run from it (``python -m benchmarks.throughput``).
ROOT = Path(__file__).resolve().parent.parent.parent
WORKER_COUNTS = (1, 2, 4)
CALLS = 3
#: Calls a turn in the third set of rows (none with ``--quick``).
ONE_CALL = 1
#: Runs of a cell, shared among its workers: every cell lasts a few seconds, so a
#: second of a busy machine weighs as much at one worker as at four.
RUNS_PER_CELL = 480
QUICK_RUNS_PER_WORKER = 10
#: Rounds of every cell (one with ``--quick``): a figure is the median of its rounds.
ROUNDS = 5
#: The tools' latency in the second set of rows (none with ``--quick``).
TOOL_LATENCY_MS = 10.0
WARMUP_RUNS = 2
TARGET_PCT = 15.0

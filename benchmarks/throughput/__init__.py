"""Throughput: runs and side-effecting calls per second with 1, 2 and 4 worker processes.

The same agent (one model turn with ``CALLS`` side-effecting calls, then a final
answer; tools take no time) runs in W worker processes on one PostgreSQL database,
each worker running its own threads one after the other:

- ``plain``: ``ToolNode`` on LangGraph's ``PostgresSaver``;
- ``effect``: ``EffectToolNode`` + ``add_cancellation`` on ``PostgresCancelSaver``
  (every call's intent written before it is dispatched, its outcome after; a lease
  per run);
- ``bound``: ``plain`` plus only the durable writes invariant I1 asks of any
  implementation (``benchmarks/bound.py``): a commit that waits for the flush before
  each call, and one that does not at the end. Its distance from ``plain`` is a floor
  under ours; it runs where the tools take no time.

Each worker imports, connects and warms up, then waits for a start file; runs/s is
the runs of all workers over the wall time from the start to the last worker's
end. While they run, the parent samples ``pg_stat_activity`` (backends waiting on a
lock, active connections); afterwards it reads the workers' CPU time and the
database's size. The ledger's rows per run are counted in its tables, and the
database size per 10^5 runs is extrapolated from the bytes the run added.

The section turns ``fsync`` and ``synchronous_commit`` on for its duration (``ALTER
SYSTEM`` + ``pg_reload_conf()``, put back afterwards): a commit then costs a disk
flush, as it does in production. Its target: ``effect`` within 15 % of ``plain`` at
every worker count, with tools that take no time (the package's whole cost shows).

Where the server preloads ``pg_stat_statements`` (``./scripts/bench`` does, when its
PostgreSQL has the module), each cell also reads the server's own time in statements,
the ledger's apart from LangGraph's checkpoint saver's, and the ledger's costliest
statements.

A shared machine's speed drifts by more than the difference measured, so the cells
run in rounds, the variants back to back at each worker count, and each figure is the
median over the rounds (the spread is kept beside it); a gap between two variants is
the median of the rounds' own gaps. A cell's runs are shared among its workers, so
every cell lasts a few seconds. A second set
of rows gives tools a latency (``TOOL_LATENCY_MS``, a fast internal API), where the
package's cost is a share of a run that also waits for its tools; there ours sends
a batch's calls at once (``effect_concurrency``), as ``ToolNode`` does, instead of
its default of one side effect at a time. A third set asks for one call a turn
(``ONE_CALL``), the shape of most agents' turns, where a batch's plan is one write
per call rather than one per three. The server's CPU
time is read from its processes (``/proc``) when the server runs on this machine.
"""

from benchmarks.throughput.constants import (
    CALLS,
    ONE_CALL,
    ROUNDS,
    RUNS_PER_CELL,
    TARGET_PCT,
    TOOL_LATENCY_MS,
    WORKER_COUNTS,
)
from benchmarks.throughput.readings import statement_family, statement_summary
from benchmarks.throughput.section import round_gaps, run
from benchmarks.throughput.table import table

__all__ = [
    "CALLS",
    "ONE_CALL",
    "ROUNDS",
    "RUNS_PER_CELL",
    "TARGET_PCT",
    "TOOL_LATENCY_MS",
    "WORKER_COUNTS",
    "round_gaps",
    "run",
    "statement_family",
    "statement_summary",
    "table",
]

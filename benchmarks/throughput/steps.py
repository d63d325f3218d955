"""What one ledger operation of a run costs, beside one plain single-row commit."""

from __future__ import annotations

import time
import uuid
from typing import Any

from benchmarks.common import fresh_pg_db, plan_work, rnd
from benchmarks.throughput.constants import CALLS
from benchmarks.throughput.readings import server_cpu_s


def step_costs(dsn: str, cycles: int) -> dict[str, Any]:
    """What one ledger operation of a run costs, beside one plain single-row commit.

    A cycle is the ledger's part of the throughput agent's run, called directly on a
    ``PostgresCancelSaver``'s ledger: the run's start, a plan of 3 effects, each
    effect's intent and outcome, the run's end (9 operations, each its own commit
    waiting for the disk). Client CPU from ``process_time``, the server's from its
    processes (None when it is not on this machine); per operation, against the
    same figures for a one-row ``INSERT`` in autocommit on a plain connection.
    """
    import psycopg

    from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
    from langgraph_cancel.types import EffectStatus

    operations_per_cycle = 9

    def per_operation(work: Any, operations: int) -> dict[str, Any]:
        server_before, cpu_before = server_cpu_s(), time.process_time()
        started = time.perf_counter()
        work()
        wall = time.perf_counter() - started
        cpu, server_after = time.process_time() - cpu_before, server_cpu_s()
        server = None
        if server_before is not None and server_after is not None:
            server = rnd((server_after - server_before) * 1e6 / operations, 0)
        return {
            "wall_us": rnd(wall * 1e6 / operations, 0),
            "client_cpu_us": rnd(cpu * 1e6 / operations, 0),
            "server_cpu_us": server,
        }

    with fresh_pg_db(dsn, "steps") as url, PostgresCancelSaver.from_conn_string(url) as saver:
        saver.setup()
        ledger = saver.ledger

        def cycle() -> None:
            thread_id = uuid.uuid4().hex
            started = ledger.start_run(thread_id)
            planned = plan_work(ledger, thread_id, started.run_id, CALLS, "call")
            for entry in planned:
                assert isinstance(entry, tuple), entry
                effect_id = entry[0].effect_id
                ledger.transition(effect_id, EffectStatus.DISPATCHED, actor="bench")
                ledger.transition(
                    effect_id, EffectStatus.COMMITTED, actor="bench", result=f"ok {effect_id}"
                )
            ledger.finish_run(started.run_id, "completed")

        for _ in range(5):
            cycle()

        def cycles_in_a_row() -> None:
            for _ in range(cycles):
                cycle()

        ledger_cost = per_operation(cycles_in_a_row, cycles * operations_per_cycle)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE floor (id bigint PRIMARY KEY, note text NOT NULL)")

            def commits() -> None:
                for row_id in range(cycles * operations_per_cycle):
                    conn.execute("INSERT INTO floor (id, note) VALUES (%s, %s)", (row_id, "x"))

            commit_cost = per_operation(commits, cycles * operations_per_cycle)
    return {
        "operations_per_cycle": operations_per_cycle,
        "cycles": cycles,
        "ledger_operation": ledger_cost,
        "single_row_commit": commit_cost,
    }

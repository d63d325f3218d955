"""The fleet test: four workers, a reviewer, a stopper and a sweeper on one PostgreSQL.

Each process is real (forked from a fork server with LangGraph preloaded, see
``tests/fleet_worker.py``) and shares one database; two of the workers run the graph
as a LangGraph server does (``ainvoke``, ``AsyncPostgresCancelSaver`` on a pool). N
threads of the refund agent (mixed effect kinds; every other refund needs a
reviewer's approval) are run while the test, for a while, SIGKILLs random workers,
terminates the database connections of every process (``pg_terminate_backend``) and
restarts PostgreSQL once; every process that dies is started again, as a supervisor
would. Then the fleet is left to finish, and the test checks, thread by thread and against the
providers' own truth (their SQLite file counts every application per key):

- every run is terminal, or cleanly resumable (not over, nobody holds it, a
  checkpoint to continue from); a terminal run's thread is closed: nothing
  pending, every tool call answered right after it (as chat APIs require);
- I3: every effect is settled, or ``unknown`` with an owner and a next action;
- I2: no key was applied twice, no order refunded twice;
- no effect lost: every key a provider applied is a ledger effect that says it may
  have been applied (committed, compensated, unknown ...), and every effect the
  ledger calls committed was applied;
- I6: a stopped run's report names as permanent only effects the providers applied,
  and every one of them as permanent or unknown (it says what was known at the stop);
  the report built now names exactly those applied and settled; nothing was
  dispatched after the stop.

N is ``LGC_FLEET_THREADS`` (default 200), the chaos lasts
``LGC_FLEET_CHAOS_S`` seconds (default 20).
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import random
import signal
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage

import fleet_worker as fw
from fork_server import ensure_fork_server
from graphs import answered_late, dangling_calls
from langgraph_cancel import EffectStatus, Ledger, get_report
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.demo.tools import compensation_key
from langgraph_cancel.types import (
    MAYBE_APPLIED_STATUSES,
    UNDISPATCHED_STATUSES,
    EffectKind,
    utcnow,
)
from langgraph_cancel.workers import lease_is_live
from ledger_util import terminate_other_connections
from recovery_worker import open_saver

CTX = multiprocessing.get_context("forkserver")
CTX.set_forkserver_preload(["fleet_worker"])
HERE = Path(__file__).resolve().parent

THREADS = int(os.environ.get("LGC_FLEET_THREADS", "200"))
CHAOS_S = float(os.environ.get("LGC_FLEET_CHAOS_S", "20"))
WORKERS = 4
SETTLE_TIMEOUT_S = 60.0 + THREADS * 0.6
SETTLED_OK = {
    EffectStatus.COMMITTED,
    EffectStatus.COMPENSATED,
    EffectStatus.COMPENSATION_FAILED,
    EffectStatus.FAILED,
    EffectStatus.NOT_APPLIED,
    EffectStatus.DROPPED,
    EffectStatus.REJECTED,
}

#: What the ledger may say of an effect whose key a provider applied.
APPLIED_OK = MAYBE_APPLIED_STATUSES | {EffectStatus.COMPENSATED}

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(600)]


@pytest.fixture(scope="module", autouse=True)
def _fork_server() -> Iterator[None]:
    """The fork server, with the tests and the repository on its path (``fork_server``)."""
    ensure_fork_server()
    yield


@dataclass
class Fleet:
    """The fleet's processes, started again whenever one dies."""

    tmp: Path
    db_url: str
    threads: list[str]
    stop_threads: list[str]
    procs: dict[str, Any] = field(default_factory=dict)
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    restarts: int = 0
    kills: int = 0

    def spec(
        self, name: str, role: str, threads: list[str], home: int = -1, *, run_async: bool = False
    ) -> None:
        self.specs[name] = {
            "async": run_async,
            "home": home,
            "workers": WORKERS,
            "name": name,
            "role": role,
            "db_url": self.db_url,
            "providers": str(self.tmp / "providers.db"),
            "workdir": str(self.tmp),
            "threads": threads,
            "all_threads": self.threads,
            "stop_threads": self.stop_threads,
            "seed": hash(name) & 0xFFFF,
        }

    def start(self, name: str) -> None:
        proc = CTX.Process(target=fw.main, args=(self.specs[name],), name=name, daemon=True)
        proc.start()
        self.procs[name] = proc

    def supervise(self) -> None:
        """Start again every process that exited (killed, or lost its database)."""
        for name, proc in list(self.procs.items()):
            if not proc.is_alive():
                proc.join()
                self.restarts += 1
                self.start(name)

    def kill_a_worker(self, rng: random.Random) -> None:
        name = rng.choice([n for n in self.procs if n.startswith("worker")])
        proc = self.procs[name]
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
            self.kills += 1

    def stop(self) -> None:
        (self.tmp / "stop").write_text("stop")
        for proc in self.procs.values():
            proc.join(30)
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
                proc.join(5)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("*.log"))
        )


def seed_orders(providers: Path, threads: list[str]) -> None:
    """One order per thread, big enough for its refund."""
    Providers(providers)
    with sqlite3.connect(providers) as conn:
        conn.executemany(
            "INSERT INTO orders (order_id, customer, email, total, currency, status, note,"
            " updated_at) VALUES (?, ?, ?, 500.0, 'USD', 'delivered', '', ?)",
            [
                (fw.order_of(t), f"customer {t}", f"{t}@example.com", utcnow().isoformat())
                for t in threads
            ],
        )


def thread_done(graph: Any, ledger: Ledger, thread_id: str) -> bool:
    run = ledger.latest_run(thread_id)
    if run is None or not run.terminal:
        return False
    snapshot = graph.get_state({"configurable": {"thread_id": thread_id}})
    return not snapshot.interrupts and not snapshot.next


def describe(ledger: Ledger, thread_id: str) -> str:
    """A thread's runs and effects, for a failed check's message."""
    runs = [f"{r.run_id[:8]} {r.status.value} owner={r.owner}" for r in ledger.runs(thread_id)]
    effects = [
        f"{e.tool} {e.tool_call_id} {e.status.value} run={e.run_id[:8]} "
        + " > ".join(f"{h.to_status.value}@{h.actor}" for h in ledger.history(e.effect_id))
        for e in ledger.effects(thread_id)
    ]
    return "\n".join([thread_id, *runs, *effects])


def not_closed(
    ledger: Ledger, thread_id: str, status: str, next_nodes: Any, messages: list[BaseMessage]
) -> str:
    """The message of a terminal run whose thread was left open."""
    lines = [
        f"  {type(m).__name__} {m.id}: "
        + (
            f"answers {m.tool_call_id} {str(m.content)[:60]!r}"
            if isinstance(m, ToolMessage)
            else f"calls {[c.get('id') for c in getattr(m, 'tool_calls', None) or []]}"
        )
        for m in messages
    ]
    return (
        f"{thread_id}: run {status}, thread not closed: next {next_nodes}, dangling "
        f"{dangling_calls(messages)}, answered late {answered_late(messages)}\n"
        f"{describe(ledger, thread_id)}\n" + "\n".join(lines)
    )


def report_mismatch(
    ledger: Ledger,
    thread_id: str,
    which: str,
    reported: set[str],
    applied: set[str],
    unknown: set[str],
) -> str:
    """The message of a report (``which``: "stop" or "now") whose permanent effects are
    not the providers'."""
    return (
        f"{thread_id}: the {which} report's permanent effects are not the providers': reported "
        f"{sorted(reported)}, applied {sorted(applied)}, reported unknown {sorted(unknown)}\n"
        f"{describe(ledger, thread_id)}"
    )


class Checks:
    """Counts every invariant checked."""

    def __init__(self) -> None:
        self.count = 0

    def that(self, condition: bool, message: Any) -> None:
        """Count the check and assert it; ``message`` may be a function that builds the
        message, called only when the check fails (``describe`` reads the database)."""
        self.count += 1
        if not condition:
            raise AssertionError(message() if callable(message) else message)


def test_a_fleet_survives_kills_terminated_connections_and_a_restart(
    tmp_path: Path, pg_url: str, pg_server: Any
) -> None:
    rng = random.Random(2207)
    threads = [f"fleet-{i:03d}" for i in range(THREADS)]
    stop_threads = [t for t in threads if rng.random() < 0.25]
    seed_orders(tmp_path / "providers.db", threads)
    with open_saver(pg_url):
        pass  # the schema, before the fleet races to create it

    fleet = Fleet(tmp_path, pg_url, threads, stop_threads)
    for worker_index in range(WORKERS):
        # Half the workers run the graph as a LangGraph server does (async, on a pool).
        fleet.spec(
            f"worker-{worker_index}",
            "worker",
            threads,
            home=worker_index,
            run_async=worker_index % 2 == 1,
        )
    fleet.spec("reviewer", "reviewer", threads)
    fleet.spec("stopper", "stopper", threads)
    fleet.spec("sweeper", "sweeper", threads)
    for name in fleet.specs:
        fleet.start(name)

    terminated = 0
    restarted_server = 0
    try:
        chaos_end = time.monotonic() + CHAOS_S
        restart_at = time.monotonic() + CHAOS_S / 2
        while time.monotonic() < chaos_end:
            time.sleep(rng.uniform(0.8, 2.0))
            roll = rng.random()
            if restarted_server == 0 and time.monotonic() >= restart_at:
                pg_server.restart()
                restarted_server += 1
            elif roll < 0.6:
                fleet.kill_a_worker(rng)
            else:
                terminated += terminate_other_connections(pg_url)
            fleet.supervise()

        with open_saver(pg_url) as saver:
            graph = fw.build_builder().compile(checkpointer=saver)
            ledger = saver.ledger
            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while time.monotonic() < deadline:
                fleet.supervise()
                if all(thread_done(graph, ledger, t) for t in threads):
                    break
                time.sleep(1.0)
            fleet.stop()
            left = [t for t in threads if not thread_done(graph, ledger, t)]
            check_fleet(graph, ledger, tmp_path, threads, left, fleet)
    except BaseException:
        fleet.stop()
        print(fleet.logs())
        raise
    print(
        f"fleet: {THREADS} threads, {len(stop_threads)} stops asked, {fleet.kills} workers "
        f"killed, {fleet.restarts} processes restarted, {terminated} connections terminated, "
        f"{restarted_server} PostgreSQL restart"
    )


def check_fleet(
    graph: Any, ledger: Ledger, tmp: Path, threads: list[str], left: list[str], fleet: Fleet
) -> None:
    checks = Checks()
    truth = Providers(tmp / "providers.db").truth()
    applied = {k for k, v in truth["keys"].items() if v["executions"] >= 1}
    checks.that(
        not {k: v for k, v in truth["keys"].items() if v["executions"] > 1},
        "a key was applied twice",
    )
    refunded = [r["order_id"] for r in truth["refunds"]]
    checks.that(len(refunded) == len(set(refunded)), f"an order refunded twice: {refunded}")
    ledger_keys: set[str] = set()
    # Effects a stop's report left unknown that settled afterwards.
    settled_after_stop = 0
    for thread_id in threads:
        run = ledger.require_latest_run(thread_id)
        snapshot = graph.get_state({"configurable": {"thread_id": thread_id}})
        if not run.terminal:
            checks.that(
                not lease_is_live(ledger.lease(thread_id)) and snapshot.created_at is not None,
                f"{thread_id}: run {run.status.value}, neither over nor cleanly resumable",
            )
        else:
            messages = snapshot.values.get("messages", [])
            checks.that(
                not snapshot.next and not dangling_calls(messages) and not answered_late(messages),
                functools.partial(
                    not_closed, ledger, thread_id, run.status.value, snapshot.next, messages
                ),
            )
        effects = ledger.effects(thread_id)
        keys = [e.idempotency_key for e in effects]
        checks.that(len(keys) == len(set(keys)), f"{thread_id}: a key twice in the ledger")
        for record in effects:
            ledger_keys.add(record.idempotency_key)
            if record.status is EffectStatus.UNKNOWN:
                checks.that(
                    bool(record.owner and record.next_action), f"unknown without an owner: {record}"
                )
            else:
                ok = SETTLED_OK if run.terminal else SETTLED_OK | UNDISPATCHED_STATUSES
                checks.that(record.status in ok, functools.partial(describe, ledger, thread_id))
            if record.kind is EffectKind.READ_ONLY:
                continue
            if record.status is EffectStatus.COMMITTED:
                checks.that(
                    record.idempotency_key in applied, f"committed, never applied: {record}"
                )
            if record.idempotency_key in applied:
                checks.that(record.status in APPLIED_OK, f"applied, ledger says: {record}")
        if run.status.value == "cancelled":
            # I6, at the stop and now. The report stored at the stop says what was known
            # then: a call still in flight past its grace is unknown there, with an owner,
            # and settles later (its late outcome, or the sweeper). Nothing it calls
            # permanent was not applied, and nothing applied is missing from it; the
            # report built now names exactly what was applied, less what is still unknown.
            mine = {e.idempotency_key for e in effects} & applied
            permanent = {
                e.idempotency_key
                for e in effects
                if e.kind is EffectKind.IRREVERSIBLE and e.idempotency_key in mine
            }
            report = get_report(ledger, thread_id)
            reported = {e.idempotency_key for e in report.permanent}
            reported_unknown = {e.idempotency_key for e in report.unknown}
            checks.that(
                reported <= permanent <= reported | reported_unknown,
                functools.partial(
                    report_mismatch,
                    ledger,
                    thread_id,
                    "stop",
                    reported,
                    permanent,
                    reported_unknown,
                ),
            )
            checks.that(
                all(e.owner and e.next_action for e in report.unknown),
                f"{thread_id}: unknown without an owner in the report: {report.unknown}",
            )
            now = get_report(ledger, thread_id, now=True)
            still_unknown = {e.idempotency_key for e in now.unknown}
            reported_now = {e.idempotency_key for e in now.permanent}
            settled_after_stop += len(reported_unknown - still_unknown)
            checks.that(
                reported_now == permanent - still_unknown,
                functools.partial(
                    report_mismatch,
                    ledger,
                    thread_id,
                    "now",
                    reported_now,
                    permanent,
                    still_unknown,
                ),
            )
            checks.that(report.dispatched_after_cancel == 0, f"{thread_id}: dispatched after")
    lost = {k for k in applied if not k.startswith("compensate:")} - ledger_keys
    checks.that(not lost, f"effects lost (applied, not in the ledger): {lost}")
    compensations = {k for k in applied if k.startswith("compensate:")}
    checks.that(
        all(compensation_key(k[len("compensate:") :]) == k for k in compensations), compensations
    )
    swept: dict[str, int] = {}
    for line in (tmp / "sweeper.passes.jsonl").read_text().splitlines():
        for kind, count in json.loads(line)["counts"].items():
            swept[kind] = swept.get(kind, 0) + count
    summary = {
        "threads": len(threads),
        "stops_asked": len(json.loads((tmp / "stopped.json").read_text()))
        if (tmp / "stopped.json").exists()
        else 0,
        "cancelled": sum(
            1 for t in threads if ledger.require_latest_run(t).status.value == "cancelled"
        ),
        "swept": swept,
        "not_over": left,
        "kills": fleet.kills,
        "restarts": fleet.restarts,
        "invariant_checks": checks.count,
        "settled_after_stop": settled_after_stop,
        "runs": sorted(
            {t: ledger.require_latest_run(t).status.value for t in threads}.items(),
            key=lambda kv: kv[0],
        ),
    }
    (tmp / "fleet-summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))

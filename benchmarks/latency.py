"""Cancel latency: ``request_cancel`` from a second process until the worker sees it.

The worker is a subprocess (``python -m benchmarks.latency worker MODE URL``);
this process is the requester. Times are wall-clock (``time.time()``) on one
machine, compared with the ledger's ``requested_at`` (written by the requester
inside ``request_cancel``) and ``observed_at``/``quiesced_at``.

Modes:
  check  the worker starts a run with ``scope_for`` and loops on
         ``RunScope.cancel_called()`` (0.5 ms sleep between checks); it records
         when a check first returns True.
  graph  the worker runs a cancel-aware agent graph whose model keeps asking for
         one side-effecting 5 ms tool call per turn; the run's report gives
         requested -> observed (first check that saw it) and -> quiesced, and
         the worker records when ``stream`` returned (run ended).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import Settings, ledger_url, log, rnd, summary

ROOT = Path(__file__).resolve().parent.parent
CHECK_SLEEP_S = 0.0005
GRAPH_TOOL_MS = 5.0
WORKER_ID = "bench-latency-worker"


# =========================================================================== worker side
def _emit(kind: str, payload: Any) -> None:
    sys.stdout.write(f"{kind} {json.dumps(payload)}\n")
    sys.stdout.flush()


def _worker_check(url: str) -> None:
    from langgraph_cancel.ledger import Ledger
    from langgraph_cancel.runtime import drop_scope, scope_for
    from langgraph_cancel.types import RunStatus, utcnow

    ledger = Ledger.from_url(url)
    for line in sys.stdin:
        if line.strip() != "NEXT":
            break
        thread_id = f"lat-{uuid.uuid4().hex[:10]}"
        scope = scope_for({"configurable": {"thread_id": thread_id}}, ledger=ledger)
        checks = 0
        _emit(
            "READY",
            {
                "thread_id": thread_id,
                "run_id": scope.run_id,
                "poll_interval_s": scope.signal.poll_interval,
            },
        )
        while not scope.cancel_called():
            checks += 1
            time.sleep(CHECK_SLEEP_S)
        t_seen = time.time()
        scope.signal.observe()
        ledger.finish_run(scope.run_id, RunStatus.CANCELLED, quiesced_at=utcnow())
        drop_scope(scope)
        _emit("RESULT", {"t_seen": t_seen, "checks": checks})


def _open_saver(url: str) -> Any:
    if url.startswith("sqlite:///"):
        import sqlite3

        from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver

        lite = sqlite3.connect(url[len("sqlite:///") :], check_same_thread=False, timeout=30)
        saver: Any = SqliteCancelSaver(lite)
    else:
        from psycopg import Connection
        from psycopg.rows import dict_row

        from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
        from langgraph_cancel.ledger import Ledger, PostgresBackend

        conn = Connection.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        saver = PostgresCancelSaver(conn, ledger=Ledger(PostgresBackend(url, max_size=4)))
    saver.setup()
    return saver


def _worker_graph(url: str) -> None:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

    from benchmarks.agent import SIDE_EFFECT, build_graph, make_tool
    from langgraph_cancel.testing import ScriptedChatModel, tool_call

    def turn(_messages: list[BaseMessage]) -> AIMessage:
        return AIMessage("", tool_calls=[tool_call("work", {"i": 0}, id=f"c{uuid.uuid4().hex}")])

    # Benchmark-side probe: when did a check in this process first answer True?
    import langgraph_cancel.runtime as rt

    first_true: dict[str, float] = {}
    checks = [0]
    original = rt.CancelSignal.cancel_called

    def probed(self: Any) -> bool:
        checks[0] += 1
        answer = bool(original.fget(self))  # type: ignore[attr-defined]
        if answer and self.run_id not in first_true:
            first_true[self.run_id] = time.time()
        return answer

    rt.CancelSignal.cancel_called = property(probed)  # type: ignore[assignment, method-assign]

    saver = _open_saver(url)
    model = ScriptedChatModel([turn], on_exhausted="repeat_last")
    graph = build_graph([make_tool(SIDE_EFFECT, GRAPH_TOOL_MS)], model, saver, effectful=True)
    for line in sys.stdin:
        if line.strip() != "NEXT":
            break
        thread_id = f"latg-{uuid.uuid4().hex[:10]}"
        cfg = {
            "configurable": {"thread_id": thread_id, "langgraph_cancel_worker": WORKER_ID},
            "recursion_limit": 100_000,
        }
        ready = False
        steps = 0
        checks[0] = 0
        for _chunk in graph.stream({"messages": [HumanMessage("go")]}, cfg, stream_mode="updates"):
            steps += 1
            if not ready and steps >= 2:  # the run exists and the loop is going
                ready = True
                _emit("READY", {"thread_id": thread_id})
        t_end = time.time()
        seen = [v for k, v in first_true.items()]
        first_true.clear()
        _emit(
            "RESULT",
            {
                "t_end": t_end,
                "steps": steps,
                "t_seen": min(seen) if seen else None,
                "checks": checks[0],
            },
        )


def worker_main(argv: list[str]) -> None:
    """Entry point of the worker subprocess."""
    mode, url = argv[0], argv[1]
    if mode == "check":
        _worker_check(url)
    elif mode == "graph":
        _worker_graph(url)
    else:
        raise SystemExit(f"unknown mode {mode}")


# =========================================================================== requester side
class Worker:
    """A worker subprocess spoken to line by line."""

    def __init__(self, mode: str, url: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.latency", "worker", mode, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(ROOT),
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def expect(self, kind: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"worker said nothing for {timeout}s: {''.join(self.err)[-2000:]}"
                )
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"worker exited: {''.join(self.err)[-2000:]}")
            if line.startswith(kind + " "):
                return dict(json.loads(line[len(kind) + 1 :]))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("QUIT")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _trials_cross_process(mode: str, url: str, trials: int, warmup: int) -> list[dict[str, Any]]:
    from langgraph_cancel.ledger import Ledger

    requester = Ledger.from_url(url)
    worker = Worker(mode, url)
    rows: list[dict[str, Any]] = []
    rng = random.Random(7)
    try:
        for trial in range(trials + warmup):
            worker.send("NEXT")
            ready = worker.expect("READY", timeout=120)
            # A random phase against the worker's check/poll cycle and its steps.
            time.sleep(rng.uniform(0.02, 0.08))
            thread_id = ready["thread_id"]
            t_call = time.time()
            requester.request_cancel(thread_id, reason="benchmark", requested_by="bench")
            t_ret = time.time()
            result = worker.expect("RESULT", timeout=120)
            run = requester.latest_run(thread_id)
            assert run is not None and run.requested_at is not None
            req = run.requested_at.timestamp()
            row: dict[str, Any] = {
                "poll_interval_ms": (ready.get("poll_interval_s") or 0) * 1e3,
                "request_call_ms": (t_ret - t_call) * 1e3,
                "status": run.status.value,
            }
            if mode == "check":
                row["seen_ms"] = (result["t_seen"] - req) * 1e3
                row["seen_from_call_ms"] = (result["t_seen"] - t_call) * 1e3
                row["checks"] = result["checks"]
            else:
                if run.observed_at is not None:
                    row["observed_ms"] = (run.observed_at.timestamp() - req) * 1e3
                if run.quiesced_at is not None:
                    row["quiesced_ms"] = (run.quiesced_at.timestamp() - req) * 1e3
                row["ended_ms"] = (result["t_end"] - req) * 1e3
                if result.get("t_seen") is not None:
                    row["seen_ms"] = (result["t_seen"] - req) * 1e3
                report = run.report or {}
                row["dispatched_after_cancel"] = report.get("dispatched_after_cancel")
                if report.get("dispatched_after_cancel"):
                    # Which dispatches does the report count, and were they after the
                    # signal was *observed* (I1) or only after requested_at was stamped?
                    obs = run.observed_at.timestamp() if run.observed_at else None
                    row["late_dispatches"] = [
                        {
                            "effect_id": e.effect_id,
                            "dispatched_after_requested_at_ms": round(
                                (e.dispatched_at.timestamp() - req) * 1e3, 3
                            ),
                            "dispatched_before_observed": (
                                None if obs is None else e.dispatched_at.timestamp() < obs
                            ),
                            "request_call_ms": round(row["request_call_ms"], 3),
                            "status": e.status.value,
                        }
                        for e in requester.effects(thread_id)
                        if e.dispatched_at is not None and e.dispatched_at > run.requested_at
                    ]
            if trial >= warmup:
                rows.append(row)
    finally:
        worker.close()
        requester.close()
    return rows


def _trials_in_process(trials: int) -> list[dict[str, Any]]:
    """memory:// cannot be shared across processes: a second thread requests instead."""
    from langgraph_cancel.ledger import Ledger
    from langgraph_cancel.runtime import drop_scope, scope_for

    ledger = Ledger.from_url("memory://")
    rows = []
    rng = random.Random(7)
    for _ in range(trials):
        thread_id = f"lat-{uuid.uuid4().hex[:10]}"
        scope = scope_for({"configurable": {"thread_id": thread_id}}, ledger=ledger)
        seen: dict[str, float] = {}

        def spin(scope: Any = scope, seen: dict[str, float] = seen) -> None:
            while not scope.cancel_called():
                time.sleep(CHECK_SLEEP_S)
            seen["t"] = time.time()

        th = threading.Thread(target=spin)
        th.start()
        time.sleep(rng.uniform(0.005, 0.02))
        t_call = time.time()
        ledger.request_cancel(thread_id, reason="benchmark", requested_by="bench")
        th.join()
        run = ledger.get_run(scope.run_id)
        assert run.requested_at is not None
        rows.append(
            {
                "seen_ms": (seen["t"] - run.requested_at.timestamp()) * 1e3,
                "seen_from_call_ms": (seen["t"] - t_call) * 1e3,
            }
        )
        drop_scope(scope)
    ledger.close()
    return rows


def _summarise(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    return {k: summary([r[k] for r in rows if r.get(k) is not None], digits=2) for k in keys}


def run(settings: Settings, backends: list[str]) -> dict[str, Any]:
    """Check and graph latency per backend."""
    trials = settings.latency_trials
    warmup = 1 if settings.quick else 2
    out: dict[str, Any] = {
        "method": __doc__.strip() if __doc__ else "",
        "check_sleep_ms": CHECK_SLEEP_S * 1e3,
        "graph_tool_ms": GRAPH_TOOL_MS,
        "trials": trials,
        "backends": {},
    }
    for backend in backends:
        log(f"latency: {backend}")
        entry: dict[str, Any] = {}
        if backend == "memory":
            rows = _trials_in_process(trials)
            entry["check"] = _summarise(rows, ["seen_ms", "seen_from_call_ms"])
            entry["check"]["note"] = "same process (memory:// is per process): a thread requests"
        else:
            with ledger_url(backend, settings, "lat") as url:
                rows = _trials_cross_process("check", url, trials, warmup)
                entry["check"] = _summarise(
                    rows, ["seen_ms", "seen_from_call_ms", "request_call_ms"]
                )
                entry["poll_interval_ms"] = rows[0]["poll_interval_ms"] if rows else None
                g_trials = max(2, trials // 2)
                rows = _trials_cross_process("graph", url, g_trials, warmup)
                entry["graph"] = _summarise(
                    rows, ["seen_ms", "observed_ms", "quiesced_ms", "ended_ms", "request_call_ms"]
                )
                entry["graph"]["dispatched_after_cancel_max"] = max(
                    (r.get("dispatched_after_cancel") or 0 for r in rows), default=0
                )
                entry["graph"]["statuses"] = sorted({r["status"] for r in rows})
                entry["graph"]["late_dispatches"] = [
                    d for r in rows for d in r.get("late_dispatches", [])
                ]
        check = entry["check"]["seen_ms"]
        log(f"  {backend:8s} check seen p50={check.get('median')}ms p99={check.get('p99')}ms")
        if "graph" in entry:
            graph = entry["graph"]
            log(
                f"  {backend:8s} graph observed p50={graph['observed_ms'].get('median')}ms "
                f"p99={graph['observed_ms'].get('p99')}ms quiesced p50="
                f"{graph['quiesced_ms'].get('median')}ms "
                f"ended p50={graph['ended_ms'].get('median')}ms"
            )
        out["backends"][backend] = entry
    return out


def rnd_row(row: dict[str, Any]) -> dict[str, Any]:
    """Round a row's floats (for logs)."""
    return {k: rnd(v, 2) if isinstance(v, float) else v for k, v in row.items()}


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "worker":
        worker_main(sys.argv[2:])
    else:
        raise SystemExit("usage: python -m benchmarks.latency worker check|graph URL")

"""Recovery: from process start to a resumed, reconciled thread after a crash.

Per trial, a first subprocess runs the agent until its side-effecting tool has
charged the (fake, SQLite-file) provider and then dies with ``os._exit(137)``:
the ledger holds the effect as ``dispatched``, the checkpoint has the tool
step pending. A second subprocess is then timed from ``Popen`` to the moment
``graph.invoke(None, config)`` returned with the effect reconciled through the
tool's reconcile hook and the run completed. The same crash and resume with a
plain ``ToolNode`` graph on LangGraph's saver is timed as the baseline (it
re-runs the tool: its charge count shows the double effect we avoid).

The crashed worker's lease is live for 30 s; the resuming process reuses the
same worker identity (``configurable.langgraph_cancel_worker``, like a
restarted pod with a stable name), so it is not refused with ThreadBusy.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import Settings, ledger_url, log, rnd, summary

ROOT = Path(__file__).resolve().parent.parent
WORKER_ID = "bench-recovery-worker"
CRASH_ENV = "LGC_BENCH_CRASH"
PROVIDER_ENV = "LGC_BENCH_PROVIDER"


# =========================================================================== child side
def _provider() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ[PROVIDER_ENV], timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, amount INTEGER)")
    return conn


def _tools(variant: str) -> list[Any]:
    from langchain_core.tools import tool

    from langgraph_cancel import EffectKind, Outcome, effect, idempotency_key

    @tool
    def charge(amount: int) -> str:
        """Charge the customer (an external, irreversible side effect)."""
        try:
            key = idempotency_key()
        except RuntimeError:  # plain ToolNode: no key
            key = f"plain-{uuid.uuid4().hex}"
        conn = _provider()
        conn.execute("INSERT OR IGNORE INTO charges (key, amount) VALUES (?, ?)", (key, amount))
        conn.close()
        if os.environ.get(CRASH_ENV) == "1":
            os._exit(137)  # after the effect, before the outcome is recorded
        return json.dumps({"charged": amount, "key": key})

    def reconcile(key: str, args: dict[str, Any]) -> Outcome:
        conn = _provider()
        row = conn.execute("SELECT amount FROM charges WHERE key = ?", (key,)).fetchone()
        conn.close()
        if row is None:
            return Outcome.not_applied()
        return Outcome.committed(json.dumps({"charged": row[0], "key": key}))

    if variant == "plain":
        return [charge]
    return [effect(EffectKind.IRREVERSIBLE, requires_approval=False, reconcile=reconcile)(charge)]


def _open(variant: str, url: str) -> Any:
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
        if variant == "plain":
            from langgraph.checkpoint.sqlite import SqliteSaver

            saver: Any = SqliteSaver(conn)
        else:
            from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver

            saver = SqliteCancelSaver(conn)
        saver.setup()
        return saver
    from psycopg import Connection
    from psycopg.rows import dict_row

    conn_pg = Connection.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    if variant == "plain":
        from langgraph.checkpoint.postgres import PostgresSaver

        saver = PostgresSaver(conn_pg)
    else:
        from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
        from langgraph_cancel.ledger import Ledger, PostgresBackend

        saver = PostgresCancelSaver(conn_pg, ledger=Ledger(PostgresBackend(url, max_size=4)))
    saver.setup()
    return saver


def child_main(phase: str, variant: str, url: str, thread_id: str) -> None:
    """``crash``: run until the tool dies; ``resume``: invoke(None) and report."""
    t_main = time.time()
    import langgraph.graph  # noqa: F401  (LangGraph itself, timed apart from our package)
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

    t_deps = time.time()
    from benchmarks.agent import build_graph
    from langgraph_cancel.testing import ScriptedChatModel, tool_call

    t_imported = time.time()

    def turn(messages: list[BaseMessage]) -> AIMessage:
        if messages and isinstance(messages[-1], ToolMessage):
            return AIMessage("charged")
        return AIMessage("", tool_calls=[tool_call("charge", {"amount": 42}, id="call-charge-1")])

    saver = _open(variant, url)
    model = ScriptedChatModel([turn], on_exhausted="repeat_last")
    graph = build_graph(_tools(variant), model, saver, effectful=variant == "ours")
    cfg: dict[str, Any] = {
        "configurable": {"thread_id": thread_id, "langgraph_cancel_worker": WORKER_ID}
    }
    t_opened = time.time()
    if phase == "crash":
        graph.invoke({"messages": [HumanMessage("charge me")]}, cfg, durability="sync")
        raise SystemExit("the tool should have crashed the process")
    out = graph.invoke(None, cfg)
    t_resumed = time.time()
    info: dict[str, Any] = {
        "t_main": t_main,
        "t_deps": t_deps,
        "t_imported": t_imported,
        "t_opened": t_opened,
        "t_resumed": t_resumed,
        "final": out["messages"][-1].content,
        "tool_messages": sum(1 for m in out["messages"] if isinstance(m, ToolMessage)),
    }
    ledger = getattr(saver, "ledger", None)
    if ledger is not None:
        effects = ledger.effects(thread_id)
        info["effect_statuses"] = [e.status.value for e in effects]
        run = ledger.latest_run(thread_id)
        info["run_status"] = None if run is None else run.status.value
    print("RESULT " + json.dumps(info), flush=True)


# =========================================================================== parent side
def _spawn(
    phase: str, variant: str, url: str, thread_id: str, provider: str
) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    env[PROVIDER_ENV] = provider
    env[CRASH_ENV] = "1" if phase == "crash" else "0"
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.recovery", phase, variant, url, thread_id],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        env=env,
        timeout=300,
    )
    return t0, proc


def _charges(provider: str) -> int:
    conn = sqlite3.connect(provider)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM charges").fetchone()[0])
    finally:
        conn.close()


def _trial(variant: str, url: str, workdir: str) -> dict[str, Any]:
    thread_id = f"rec-{variant}-{uuid.uuid4().hex[:8]}"
    provider = os.path.join(workdir, f"provider-{uuid.uuid4().hex[:8]}.db")
    _, crashed = _spawn("crash", variant, url, thread_id, provider)
    if crashed.returncode != 137:
        raise RuntimeError(
            f"crash phase exited {crashed.returncode}, expected 137: {crashed.stderr[-2000:]}"
        )
    t0, resumed = _spawn("resume", variant, url, thread_id, provider)
    t_exit = time.time()
    if resumed.returncode != 0:
        raise RuntimeError(f"resume failed ({resumed.returncode}): {resumed.stderr[-3000:]}")
    line = next(x for x in resumed.stdout.splitlines() if x.startswith("RESULT "))
    info = json.loads(line[len("RESULT ") :])
    return {
        "to_resumed_ms": (info["t_resumed"] - t0) * 1e3,
        # What the plain graph would take without importing langgraph_cancel (the
        # harness's scripted model lives in it): its import time taken out.
        "to_resumed_excl_lgc_import_ms": (
            info["t_resumed"] - t0 - (info["t_imported"] - info["t_deps"])
        )
        * 1e3,
        "process_exit_ms": (t_exit - t0) * 1e3,
        "interpreter_start_ms": (info["t_main"] - t0) * 1e3,
        "imports_ms": (info["t_imported"] - info["t_main"]) * 1e3,
        "import_langgraph_ms": (info["t_deps"] - info["t_main"]) * 1e3,
        "import_langgraph_cancel_ms": (info["t_imported"] - info["t_deps"]) * 1e3,
        "open_and_build_ms": (info["t_opened"] - info["t_imported"]) * 1e3,
        "invoke_none_ms": (info["t_resumed"] - info["t_opened"]) * 1e3,
        "charges_at_provider": _charges(provider),
        "effect_statuses": info.get("effect_statuses"),
        "run_status": info.get("run_status"),
        "final": info["final"],
    }


def run(settings: Settings, backends: list[str]) -> dict[str, Any]:
    """Recovery per durable backend, ours vs plain LangGraph."""
    trials = 1 if settings.quick else 3
    out: dict[str, Any] = {"method": (__doc__ or "").strip(), "trials": trials, "backends": {}}
    keys = [
        "to_resumed_ms",
        "to_resumed_excl_lgc_import_ms",
        "process_exit_ms",
        "interpreter_start_ms",
        "imports_ms",
        "import_langgraph_ms",
        "import_langgraph_cancel_ms",
        "open_and_build_ms",
        "invoke_none_ms",
    ]
    for backend in backends:
        if backend == "memory":
            out["backends"]["memory"] = {"skipped": "nothing survives a process: not durable"}
            continue
        log(f"recovery: {backend}")
        entry: dict[str, Any] = {}
        # --quick skips the plain-LangGraph baseline (two more interpreter starts).
        for variant in ("ours",) if settings.quick else ("ours", "plain"):
            rows = []
            for _ in range(trials):
                with ledger_url(backend, settings, f"rec{variant}") as url:
                    rows.append(_trial(variant, url, tempfile.mkdtemp(dir=settings.workdir)))
            entry[variant] = {k: summary([r[k] for r in rows], digits=1) for k in keys}
            entry[variant]["charges_at_provider"] = sorted({r["charges_at_provider"] for r in rows})
            entry[variant]["effect_statuses"] = rows[-1]["effect_statuses"]
            entry[variant]["run_status"] = rows[-1]["run_status"]
            log(
                f"  {backend:8s} {variant:5s} to resumed p50="
                f"{entry[variant]['to_resumed_ms']['median']}ms invoke(None) p50="
                f"{entry[variant]['invoke_none_ms']['median']}ms charges="
                f"{entry[variant]['charges_at_provider']}"
            )
        if "plain" not in entry:
            out["backends"][backend] = entry
            continue
        ours, plain = entry["ours"], entry["plain"]
        entry["added_ms"] = rnd(
            (ours["to_resumed_ms"]["median"] or 0)
            - (plain["to_resumed_excl_lgc_import_ms"]["median"] or 0),
            1,
        )
        entry["added_note"] = (
            "ours to_resumed minus plain to_resumed_excl_lgc_import (the plain child imports "
            "langgraph_cancel only for the scripted model; that import is taken out)"
        )
        out["backends"][backend] = entry
    return out


if __name__ == "__main__":
    child_main(*sys.argv[1:5])

"""The worker of the kill -9 suite: runs (or recovers) one refund-agent thread in its own process.

``tests/test_recovery_kill9.py`` starts each job in a fresh process (forked from
a ``multiprocessing`` fork server that has the heavy imports preloaded, so a
process costs milliseconds instead of seconds) and SIGKILLs it at a *kill
point*. A job is a plain dict (see :func:`run_job`); it can also be run by hand
(from the repository root; the log and result land in ``workdir``)::

    PYTHONPATH=. python tests/recovery_worker.py '{"name": "w", "action": "run",
        "db_url": "sqlite:////tmp/w/agent.db", "providers": "/tmp/w/providers.db",
        "thread_id": "t-1", "worker_id": "w-1", "workdir": "/tmp/w"}'

Kill points (``kill_points.py``) are reached deterministically: the worker wraps
``Ledger.transition`` (points ``before:<status>:<tool>`` / ``after:<status>:<tool>``),
``Ledger.finish_run`` (``before:finish_run:<status>``), the fake providers' requests
(``before_call:<operation>`` / ``after_call:<operation>``) and the end of an
invocation that stopped at an interrupt (``interrupted``). At the job's
``kill_at`` point it writes a marker file and blocks until it is killed; at a
``pause_at`` point it writes a marker and waits for the test's ``go`` file; at
a ``signal_at`` point it writes a marker and carries on (the test kills it
further on, e.g. inside a provider call that hangs).

A recovering job (``action="recover"``) first answers the three questions of
the seeds from the database alone (:func:`three_questions`), writes the answers,
and only then resumes the thread.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sqlite3
import sys
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

import langgraph_cancel.execution.call_lease as call_lease
import langgraph_cancel.lifecycle as lgc_lifecycle
from kill_points import Points, install_points, say
from langgraph_cancel import (
    ApprovalGate,
    EffectKind,
    EffectStatus,
    EffectToolNode,
    Ledger,
    Outcome,
    add_cancellation,
    effect,
    idempotency_key,
)
from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver
from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver
from langgraph_cancel.demo import tools as refund_tools
from langgraph_cancel.testing.fake_model import ScriptedChatModel, tool_call
from langgraph_cancel.types import MAYBE_APPLIED_STATUSES, UNDISPATCHED_STATUSES

# ------------------------------------------------------------------ the agent's script
ORDER = "o-88"
REFUND_AMOUNT = 50.0
CUSTOMER = "dana@example.com"


def refund_script(amount: float = REFUND_AMOUNT) -> list[list[tuple[str, dict[str, Any]]]]:
    """The refund agent's plan: one tool batch per model turn, fixed call ids (so a
    new process replaying a turn produces the same effects). A refund over 100
    needs a reviewer's approval (``ApprovalGate`` interrupts)."""
    return [
        [
            ("lookup_order", {"order_id": ORDER}),
            ("update_order", {"order_id": ORDER, "status": "refund_pending"}),
        ],
        [
            ("issue_refund", {"order_id": ORDER, "amount": amount}),
            ("send_email", {"to": CUSTOMER, "subject": "Your refund", "body": "Refunded."}),
        ],
        [
            (
                "create_ticket",
                {"order_id": ORDER, "subject": "Refund issued", "body": "Check stock."},
            ),
        ],
    ]


HOOK_SCRIPT: list[list[tuple[str, dict[str, Any]]]] = [
    [("notify_customer", {"to": CUSTOMER, "text": "We are looking into your order."})],
]
FINAL_ANSWER = "All done."
SPEC_ENV = "RECOVERY_WORKER_SPEC"
#: What the reviewer answers ``ApprovalGate`` after the crash.
APPROVE_ALL = {"decisions": [{"type": "approve"}], "reviewer": "reviewer-after-crash"}


def call_id(batch: int, index: int, name: str) -> str:
    """The fixed tool-call id of one planned call."""
    return f"call-{batch}-{index}-{name}"


def scripted_turn(
    script: list[list[tuple[str, dict[str, Any]]]], *, fresh_ids: bool = False
) -> Any:
    """A reactive model turn: the next batch is chosen by how many batches the history holds.

    ``fresh_ids``: every call gets a new id each time the model is asked, as a real
    model's do (asked again after a crash, it names the same calls differently).
    """

    def turn(messages: list[BaseMessage]) -> AIMessage | str:
        done = sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls)
        if done >= len(script):
            return FINAL_ANSWER
        calls = [
            tool_call(
                name,
                args,
                id=call_id(done, i, name) + (f"-{uuid.uuid4().hex[:8]}" if fresh_ids else ""),
            )
            for i, (name, args) in enumerate(script[done])
        ]
        return AIMessage("", tool_calls=calls)

    return turn


# ------------------------------------------------------- a tool with misbehaving hooks
def make_hook_tool(mode: str) -> BaseTool:
    """``notify_customer``: irreversible, keyed, and a reconcile hook that misbehaves.

    ``mode``: ``raise`` (the hook raises), ``hang`` (sleeps far past its
    ``hook_timeout``), ``garbage`` (returns a dict, not an ``Outcome``), or
    ``ok`` (asks the provider).
    """

    def reconcile(key: str, args: dict[str, Any]) -> Any:
        if mode == "raise":
            raise RuntimeError("provider status API exploded")
        if mode == "hang":
            time.sleep(120)
            return Outcome.not_applied()
        if mode == "garbage":
            return {"status": "probably fine"}
        found = refund_tools.providers().find_email(key)
        return Outcome.committed(json.dumps(found)) if found else Outcome.not_applied()

    @effect(
        EffectKind.IRREVERSIBLE,
        reconcile=reconcile,
        requires_approval=False,
        hook_timeout=0.5,
    )
    @tool
    def notify_customer(to: str, text: str) -> str:
        """Email the customer a short notice (permanent once sent).

        Args:
            to: The customer's address.
            text: The notice.
        """
        return json.dumps(
            refund_tools.providers().send_email(to, "Notice", text, idempotency_key()),
            sort_keys=True,
        )

    return notify_customer


# ------------------------------------------------------------------------- the graph
def build_builder(spec: dict[str, Any]) -> Any:
    """The refund agent's builder: model, approval gate, tools, prepared by ``add_cancellation``."""
    tools: list[BaseTool] = list(refund_tools.TOOLS)
    if spec.get("script") == "hooks":
        script = HOOK_SCRIPT
        tools.append(make_hook_tool(spec.get("hook_mode", "ok")))
    else:
        script = refund_script(float(spec.get("refund_amount", REFUND_AMOUNT)))
    model = ScriptedChatModel(
        [scripted_turn(script, fresh_ids=bool(spec.get("fresh_ids")))], on_exhausted="repeat_last"
    )

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("approval", ApprovalGate(tools))
    builder.add_node("tools", EffectToolNode(tools, handle_tool_errors=True))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "approval", END: END})
    builder.add_edge("approval", "tools")
    builder.add_edge("tools", "agent")
    add_cancellation(
        builder,
        compensate_on_cancel=bool(spec.get("compensate_on_cancel")),
        reconcile_interactive=bool(spec.get("reconcile_interactive", False)),
        cancel_timeout=float(spec.get("cancel_timeout", 5.0)),
    )
    return builder


def build_agent(spec: dict[str, Any], saver: Any = None) -> Any:
    """The same refund agent made by ``create_agent`` with ``EffectMiddleware``
    (``spec["agent"] == "create_agent"``): the same tools and script; a turn's calls
    run at once, as ``create_agent`` runs them."""
    from langchain.agents import create_agent

    from langgraph_cancel.middleware import EffectMiddleware

    model = ScriptedChatModel(
        [scripted_turn(refund_script(float(spec.get("refund_amount", REFUND_AMOUNT))))],
        on_exhausted="repeat_last",
    )
    middleware = EffectMiddleware(
        compensate_on_cancel=bool(spec.get("compensate_on_cancel")),
        cancel_timeout=float(spec.get("cancel_timeout", 5.0)),
    )
    return create_agent(
        model, list(refund_tools.TOOLS), middleware=[middleware], checkpointer=saver
    )


def build_graph(spec: dict[str, Any], saver: Any) -> Any:
    """The refund agent compiled on ``saver``."""
    if spec.get("agent") == "create_agent":
        return build_agent(spec, saver)
    return build_builder(spec).compile(checkpointer=saver)


def builder_from_env() -> Any:
    """The job's builder (``langgraph-cancel resume --graph recovery_worker:builder_from_env``)."""
    return build_builder(json.loads(os.environ[SPEC_ENV]))


def agent_from_env() -> Any:
    """The job's ``create_agent`` agent, with no saver
    (``langgraph-cancel resume --graph recovery_worker:agent_from_env``)."""
    return build_agent(json.loads(os.environ[SPEC_ENV]))


def run_cli(argv: list[str]) -> tuple[int, Any]:
    """Run ``langgraph-cancel ARGV`` in this process; its exit code and JSON output."""
    import io
    from contextlib import redirect_stdout

    from langgraph_cancel import cli

    out = io.StringIO()
    with redirect_stdout(out):
        code = cli.main(argv)
    text = out.getvalue()
    try:
        return code, json.loads(text)
    except json.JSONDecodeError:
        return code, text


def sweep_with_cli(spec: dict[str, Any], db_url: str, providers: Path) -> tuple[int, Any]:
    """``langgraph-cancel sweep --json --graph`` naming the job's agent (its builder, or
    its ``create_agent`` agent), in this process; its exit code and JSON summary."""
    graph = "agent_from_env" if spec.get("agent") == "create_agent" else "builder_from_env"
    os.environ[SPEC_ENV] = json.dumps(spec)
    refund_tools.set_providers_path(str(providers))
    try:
        return run_cli(["sweep", "--db", db_url, "--json", "--graph", f"recovery_worker:{graph}"])
    finally:
        refund_tools.set_providers_path(None)
        del os.environ[SPEC_ENV]


@contextlib.contextmanager
def open_saver(db_url: str) -> Iterator[Any]:
    """The cancel-aware saver for ``db_url`` (``sqlite:///...`` or ``postgresql://...``)."""
    if db_url.startswith("sqlite:///"):
        conn = sqlite3.connect(db_url[len("sqlite:///") :], check_same_thread=False, timeout=30)
        try:
            saver = SqliteCancelSaver(conn)
            saver.setup()
            yield saver
        finally:
            conn.close()
    else:
        with PostgresCancelSaver.from_conn_string(db_url) as pg_saver:
            pg_saver.setup()
            yield pg_saver


def slow_down_checkpoints(saver: Any, seconds: float) -> None:
    """Make every checkpoint write after the first take ``seconds`` (the per-task
    writes stay fast).

    With the default ``durability="async"`` checkpoints are written in the
    background while the next step runs, so a kill can find the saved
    checkpoint a step or more behind the ledger. The first (the input) is
    written at once: the thread has a saved state to resume from.
    """
    put = saver.put
    puts = itertools.count()

    def slow_put(*args: Any, **kwargs: Any) -> Any:
        if next(puts):
            time.sleep(seconds)
        return put(*args, **kwargs)

    saver.put = slow_put


def config_for(spec: dict[str, Any]) -> dict[str, Any]:
    """The invocation config: the thread and this worker's identity (``None``: the
    process's own, ``langgraph_cancel.runtime.WORKER_ID``)."""
    conf = {"thread_id": spec["thread_id"]}
    if spec.get("worker_id") is not None:
        conf["langgraph_cancel_worker"] = spec["worker_id"]
    return {"configurable": conf}


# ------------------------------------------------------------ the three questions
def _effect_view(record: Any) -> dict[str, Any]:
    return {
        "effect_id": record.effect_id,
        "tool": record.tool,
        "kind": record.kind.value,
        "status": record.status.value,
        "idempotency_key": record.idempotency_key,
        "owner": record.owner,
        "next_action": record.next_action,
        "error": record.error,
    }


def three_questions(graph: Any, ledger: Ledger, thread_id: str) -> dict[str, Any]:
    """What was done, which effects were (or may have been) committed, what comes next.

    Read from the database alone (the ledger and the checkpoint), by a process
    that has run nothing of the thread.
    """
    run = ledger.latest_run(thread_id)
    effects = ledger.effects(thread_id)
    snapshot = graph.get_state({"configurable": {"thread_id": thread_id}})
    messages = list((snapshot.values or {}).get("messages", []))
    answered = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    side = [e for e in effects if e.kind is not EffectKind.READ_ONLY]
    committed_statuses = {
        EffectStatus.COMMITTED,
        EffectStatus.COMPENSATING,
        EffectStatus.COMPENSATED,
        EffectStatus.COMPENSATION_FAILED,
    }
    in_doubt = {EffectStatus.DISPATCHED, EffectStatus.UNKNOWN}
    answers: dict[str, Any] = {
        "run": None
        if run is None
        else {"run_id": run.run_id, "status": run.status.value, "reason": run.reason},
        "done": {
            "steps_checkpointed": answered,
            "effects": [_effect_view(e) for e in effects if e.settled],
        },
        "committed": [e.idempotency_key for e in side if e.status in committed_statuses],
        "may_have_been_committed": [e.idempotency_key for e in side if e.status in in_doubt],
        "maybe_applied_statuses": sorted(s.value for s in MAYBE_APPLIED_STATUSES),
        "next": {
            "graph_next": list(snapshot.next),
            "interrupts": [i.value for i in snapshot.interrupts],
            "reconcile_first": [
                e.effect_id for e in effects if e.status in in_doubt | {EffectStatus.COMPENSATING}
            ],
            "not_yet_dispatched": [
                e.effect_id for e in effects if e.status in UNDISPATCHED_STATUSES
            ],
        },
    }
    code, status = run_cli(["status", thread_id, "--json", "--db", ledger.url])
    answers["cli_status"] = {"exit": code, "data": status}
    return answers


# --------------------------------------------------------------------------- actions
def wait_for_lease(ledger: Ledger, thread_id: str, owner: str, timeout: float) -> None:
    """Wait until no other worker holds a live lease on the thread (a killed one expires)."""
    from langgraph_cancel.types import utcnow

    deadline = time.monotonic() + timeout
    while True:
        lease = ledger.lease(thread_id)
        if lease is None or lease.owner == owner or lease.expires_at < utcnow():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"lease of {lease.owner} did not expire")
        time.sleep(0.02)


def resume(graph: Any, ledger: Ledger, spec: dict[str, Any]) -> list[str]:
    """Continue the thread until its run is over: interrupts answered, tasks run.

    Decided by the run's status, not by ``get_state().next`` alone: after a kill
    with ``durability="async"`` the last saved checkpoint can be one step behind,
    its tasks all finished (their writes saved), and LangGraph then reports
    ``next == ()`` although ``invoke(None)`` has work to do.
    """
    config = config_for(spec)
    steps: list[str] = []
    for _ in range(6):
        snapshot = graph.get_state(config)
        run = ledger.latest_run(spec["thread_id"])
        if snapshot.interrupts:
            value = spec.get("resume_value", APPROVE_ALL)
            steps.append("resume-interrupt")
            graph.invoke(Command(resume=value), config)
        elif snapshot.next or (run is not None and not run.terminal):
            steps.append("continue:" + ",".join(snapshot.next))
            graph.invoke(None, config)
        else:
            break
    return steps


def resume_with_cli(graph: Any, spec: dict[str, Any], db_url: str) -> list[str]:
    """``langgraph-cancel resume THREAD --graph ...`` (reconciles first), answering an interrupt."""
    os.environ[SPEC_ENV] = json.dumps(spec)
    argv = [
        "resume",
        spec["thread_id"],
        "--db",
        db_url,
        "--json",
        "--graph",
        "recovery_worker:agent_from_env"
        if spec.get("agent") == "create_agent"
        else "recovery_worker:builder_from_env",
    ]
    if graph.get_state(config_for(spec)).interrupts:
        argv += ["--resume-value", json.dumps(spec.get("resume_value", APPROVE_ALL))]
    code, out = run_cli(argv)
    if code != 0:
        raise RuntimeError(f"langgraph-cancel resume failed ({code}): {out}")
    return ["cli-resume"]


def _summary(graph: Any, ledger: Ledger, spec: dict[str, Any]) -> dict[str, Any]:
    thread_id = spec["thread_id"]
    snapshot = graph.get_state(config_for(spec))
    messages = list((snapshot.values or {}).get("messages", []))
    run = ledger.latest_run(thread_id)
    return {
        "run_status": None if run is None else run.status.value,
        "graph_next": list(snapshot.next),
        "interrupts": [i.value for i in snapshot.interrupts],
        "last_message": str(messages[-1].content) if messages else None,
        "effects": [_effect_view(e) for e in ledger.effects(thread_id)],
    }


def run_job(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one job; return what the test needs to see.

    Keys of ``spec``: ``action`` (``run`` | ``recover`` | ``reconcile``), ``db_url``,
    ``providers``, ``thread_id``, ``worker_id``, ``workdir``, ``name``; optional
    ``kill_at``, ``pause_at``, ``signal_at``, ``hold``, ``script``, ``hook_mode``,
    ``refund_amount`` (over 100: the refund waits for approval), ``slow_checkpoints``,
    ``compensate_on_cancel``, ``lease_ttl``, ``wait_lease`` (seconds),
    ``resume_value``, ``start_gate`` (a file to wait for).
    """
    refund_tools.set_providers_path(spec["providers"])
    lgc_lifecycle.LEASE_TTL = float(spec.get("lease_ttl", lgc_lifecycle.LEASE_TTL))
    call_lease.CALL_LEASE_TTL = float(spec.get("lease_ttl", call_lease.CALL_LEASE_TTL))
    points = Points(spec)
    install_points(points)
    from langgraph_cancel import runtime

    result: dict[str, Any] = {
        "pid": os.getpid(),
        "worker_id": spec.get("worker_id") or runtime.WORKER_ID,
    }
    say(f"job {spec['name']} ({spec['action']}) pid {os.getpid()}")
    with open_saver(spec["db_url"]) as saver:
        if spec.get("slow_checkpoints"):
            slow_down_checkpoints(saver, float(spec["slow_checkpoints"]))
        graph = build_graph(spec, saver)
        say("saver open, graph built")
        ledger: Ledger = saver.ledger
        config = config_for(spec)
        action = spec["action"]
        gate = spec.get("start_gate")
        if gate:
            Path(spec["workdir"], f"{spec['name']}.ready").write_text("1")
            deadline = time.monotonic() + 30
            while not Path(gate).exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("start gate never opened")
                time.sleep(0.005)
        if action == "run":
            out = graph.invoke({"messages": [("user", "Refund 50 USD on order o-88.")]}, config)
            if out.get("__interrupt__") or graph.get_state(config).interrupts:
                points.hit("interrupted")
            result["steps"] = ["run"]
        elif action == "recover":
            # A dead worker's lease outlives it by at most its TTL; until then nobody can
            # tell from the database whether it is dead or slow (that is what leases say).
            wait = float(spec.get("wait_lease", 10.0))
            if wait > 0:
                wait_for_lease(ledger, spec["thread_id"], result["worker_id"], wait)
            say("lease free")
            # I7: before touching anything, answer the three questions from the database.
            answers = three_questions(graph, ledger, spec["thread_id"])
            Path(spec["workdir"], f"{spec['name']}.answers.json").write_text(
                json.dumps(answers, indent=1, default=str)
            )
            say("three questions answered")
            if spec.get("resume_via") == "cli":
                result["steps"] = resume_with_cli(graph, spec, ledger.url)
            else:
                result["steps"] = resume(graph, ledger, spec)
        elif action == "reconcile":
            from langgraph_cancel.agents import guarded_agent
            from langgraph_cancel.recovery import reconcile

            agent = guarded_agent(graph)
            assert agent is not None
            done = reconcile(
                ledger, spec["thread_id"], tools=agent.settings.tools, owner=result["worker_id"]
            )
            result["left_unknown"] = [e.effect_id for r in done for e in r.still_unknown]
            result["busy"] = [r.busy for r in done if r.busy]
        else:
            raise ValueError(f"unknown action {action!r}")
        say("done")
        result.update(_summary(graph, ledger, spec))
    result["trail"] = points.trail
    result["ok"] = True
    return result


def main_job(spec: dict[str, Any]) -> None:
    """Process entry point: run the job, write its result (or error) as JSON, exit."""
    workdir = Path(spec["workdir"])
    log = open(workdir / f"{spec['name']}.log", "a", buffering=1)  # noqa: SIM115
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    try:
        result = run_job(spec)
    except BaseException as exc:
        traceback.print_exc()
        result = {
            "ok": False,
            "error_type": type(exc).__name__,
            "error": str(exc),
            "pid": os.getpid(),
            "worker_id": spec.get("worker_id"),
        }
    path = workdir / f"{spec['name']}.result.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(path)
    log.flush()
    # Leave at once: no interpreter teardown waiting on pools or abandoned hook threads.
    os._exit(0)


__all__ = [
    "APPROVE_ALL",
    "FINAL_ANSWER",
    "call_id",
    "main_job",
    "run_job",
    "three_questions",
]

if __name__ == "__main__":  # pragma: no cover - manual runs
    main_job(json.loads(sys.argv[1]))

"""EffectToolNode when a call fails for a while or its node runs again: nothing applied twice.

Transient errors are retried only where that is safe, and an ambiguous failure is
settled by asking (the tool's reconcile hook), never by retrying. A node re-run by an
interrupt, by a RetryPolicy or in a new process after kill -9 replays the calls
already recorded and applies each of the others exactly once; tools count their real
executions in a SQLite file, so counts survive the kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import MessagesState
from langgraph.types import Command, RetryPolicy, interrupt

from graphs import (
    ExecutionLog,
    agent_builder,
    backend_params,
    calls,
    cancellable,
    config_for,
    counting_tool,
    dangling_calls,
    kill_graph,
    module_database,
    new_thread,
    open_saver,
    scripted,
    wait_until,
    worker_command,
    worker_env,
)
from langgraph_cancel import EffectKind, EffectStatus, EffectToolNode, effect, idempotency_key
from langgraph_cancel.demo import tools as refund_tools
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.ledger import derive_idempotency_key
from langgraph_cancel.testing import tool_call
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)
from tool_node_helpers import assert_no_duplicate_keys, effects_by_tool, start, tool_messages

# ----------------------------------------------------------------------------- transient faults


def test_transient_errors_retried_only_when_safe(saver: Any, log: ExecutionLog) -> None:
    tools = [
        counting_tool(
            log,
            "flaky_read",
            EffectKind.READ_ONLY,
            fail=[ConnectionError("reset"), TimeoutError("slow")],
        ),
        counting_tool(
            log,
            "safe_write",
            EffectKind.IRREVERSIBLE,
            retry_safe=True,
            fail=[ConnectionError("reset")],
        ),
        counting_tool(
            log,
            "unsafe_write",
            EffectKind.IRREVERSIBLE,
            fail=[ConnectionError("reset")],
        ),
        counting_tool(
            log,
            "hopeless_read",
            EffectKind.READ_ONLY,
            max_attempts=2,
            fail=[ConnectionError("a"), ConnectionError("b"), ConnectionError("c")],
        ),
        counting_tool(log, "broken_read", EffectKind.READ_ONLY, fail=[ValueError("bug")]),
    ]
    model = scripted(
        calls(
            ("flaky_read", "a", "f1"),
            ("safe_write", "b", "f2"),
            ("unsafe_write", "c", "f3"),
            ("hopeless_read", "d", "f4"),
            ("broken_read", "e", "f5"),
        )
    )
    graph = cancellable(agent_builder(model, EffectToolNode(tools, handle_tool_errors=True)), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    # read-only: retried with backoff until it works
    assert log.attempts("flaky_read") == 3 and answers["f1"].status == "success"
    # retry-safe side effect: retried with the same key
    assert log.attempts("safe_write") == 2 and answers["f2"].status == "success"
    keys = {r["key"] for r in log.rows("safe_write")}
    assert len(keys) == 1
    # not retry-safe: one attempt only; reconcile finds nothing applied
    assert log.attempts("unsafe_write") == 1 and answers["f3"].status == "error"
    # max_attempts bounds the retries; permanent errors are never retried
    assert log.attempts("hopeless_read") == 2 and answers["f4"].status == "error"
    assert log.attempts("broken_read") == 1 and answers["f5"].status == "error"
    eff = effects_by_tool(saver, thread_id)
    assert eff["safe_write"].status is EffectStatus.COMMITTED
    assert eff["unsafe_write"].status is EffectStatus.NOT_APPLIED
    assert log.applied("unsafe_write") == 0


@pytest.mark.parametrize("hook", [True, False], ids=["reconcile", "no-hook"])
def test_ambiguous_failure_on_side_effect(saver: Any, providers_path: str, hook: bool) -> None:
    """fail_after: the provider applied the refund, then the response was lost."""
    systems = Providers(providers_path)
    extra: dict[str, Any] = {"reconcile": refund_tools.reconcile_refund} if hook else {}
    refund = effect(
        EffectKind.IRREVERSIBLE,
        refund_tools.issue_refund,
        idempotency_key=refund_tools.refund_key,
        requires_approval=False,
        **extra,
    )  # not retry_safe: the ambiguity must be settled by asking, not by retrying
    systems.set_fault("refund", "fail_after", times=1)
    amount = 10 if hook else 11  # refund keys are global in the module's ledger
    model = scripted(
        AIMessage(
            "",
            tool_calls=[tool_call("issue_refund", {"order_id": "o-91", "amount": amount}, id="a1")],
        ),
        "fin",
    )
    graph = cancellable(agent_builder(model, EffectToolNode([refund])), saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    key = refund_tools.refund_key({"order_id": "o-91", "amount": amount})
    assert systems.attempts(key) == 1  # never retried
    assert systems.executions(key) == 1  # the world did refund
    rec = saver.ledger.find_effect(thread_id, "a1")
    answer = tool_messages(out["messages"])[0]
    if hook:
        assert rec.status is EffectStatus.COMMITTED
        assert answer.status == "success"
        found = systems.find_refund(key)
        assert found is not None and found["refund_id"] in str(answer.content)
    else:
        assert rec.status is EffectStatus.UNKNOWN
        assert rec.owner and rec.next_action
        assert answer.status == "error" and "unknown" in str(answer.content).lower()
    assert out["messages"][-1].content == "fin"


def test_a_refund_found_not_applied_runs_when_the_model_asks_again(
    saver: Any, providers_path: str
) -> None:
    # The request failed before reaching the provider; its reconcile hook says so.
    # The model asks again (a new call, the same declared key): the refund runs, once.
    systems = Providers(providers_path)
    refund = effect(
        EffectKind.IRREVERSIBLE,
        refund_tools.issue_refund,
        idempotency_key=refund_tools.refund_key,
        reconcile=refund_tools.reconcile_refund,
        requires_approval=False,
    )
    systems.set_fault("refund", "fail_before", times=1)
    args = {"order_id": "o-93", "amount": 12}  # refund keys are global in the module's ledger
    model = scripted(
        AIMessage("", tool_calls=[tool_call("issue_refund", args, id="n1")]),
        AIMessage("", tool_calls=[tool_call("issue_refund", args, id="n2")]),
        "fin",
    )
    graph = cancellable(
        agent_builder(model, EffectToolNode([refund], handle_tool_errors=True)), saver
    )
    thread_id = new_thread()
    out = start(graph, thread_id)
    key = refund_tools.refund_key(args)
    assert systems.attempts(key) == 2 and systems.executions(key) == 1
    first, second = tool_messages(out["messages"])
    assert first.status == "error" and second.status == "success"
    assert saver.ledger.find_effect(thread_id, "n1").status is EffectStatus.DROPPED
    again = saver.ledger.find_effect(thread_id, "n2")
    assert again.status is EffectStatus.COMMITTED and again.idempotency_key == key
    assert out["messages"][-1].content == "fin"


# ----------------------------------------------------------------------------- re-run safety


def test_node_rerun_by_interrupt_replays_committed_calls(saver: Any, log: ExecutionLog) -> None:
    """A node that runs the tool batch and then interrupts is re-run whole on resume."""
    tools = [
        counting_tool(log, "w", EffectKind.REVERSIBLE),
        counting_tool(log, "x", EffectKind.IRREVERSIBLE),
        counting_tool(log, "r", EffectKind.READ_ONLY),
    ]
    effect_node = EffectToolNode(tools)
    seen: list[list[str]] = []

    def tools_then_confirm(state: MessagesState, config: RunnableConfig) -> Any:
        out = effect_node.invoke(state, config)
        seen.append([str(m.content) for m in out["messages"]])
        answer = interrupt({"confirm": seen[-1]})
        assert answer == "yes"
        return out

    model = scripted(calls(("w", "a", "i1"), ("x", "b", "i2"), ("r", "c", "i3")), "fin")
    graph = cancellable(agent_builder(model, tools_then_confirm), saver)
    thread_id = new_thread()
    cfg = config_for(thread_id)
    first = start(graph, thread_id)
    assert first["__interrupt__"]
    assert log.attempts("w") == 1 and log.attempts("x") == 1
    out = graph.invoke(Command(resume="yes"), cfg)
    # The node ran twice; the effects ran once, and the re-run got the recorded answers.
    assert len(seen) == 2 and seen[0] == seen[1]
    assert log.attempts("w") == 1 and log.attempts("x") == 1
    assert log.attempts("r") == 1  # read results are recorded and replayed too
    assert [m.content for m in tool_messages(out["messages"])] == ["w(a) ok", "x(b) ok", "r(c) ok"]
    assert out["messages"][-1].content == "fin"
    assert all(e.status is EffectStatus.COMMITTED for e in saver.ledger.effects(thread_id))
    assert_no_duplicate_keys(saver, thread_id)


def test_tool_that_interrupts_gets_its_answer_and_siblings_run_once(
    saver: Any, log: ExecutionLog
) -> None:
    """interrupt() inside a tool (LangGraph's HITL-in-tool pattern) re-runs the whole batch."""
    tool_w = counting_tool(log, "w", EffectKind.REVERSIBLE)

    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def confirm(item: str) -> str:
        """Ask a person to confirm an item."""
        answer = interrupt({"confirm": item})
        seq = log.start("confirm", idempotency_key(), item)
        log.apply(seq)
        return f"person said {answer}"

    model = scripted(calls(("w", "a", "h1"), ("confirm", "b", "h2")), "fin")
    graph = cancellable(agent_builder(model, EffectToolNode([tool_w, confirm])), saver)
    thread_id = new_thread()
    first = start(graph, thread_id)
    assert first["__interrupt__"][0].value == {"confirm": "b"}
    out = graph.invoke(Command(resume="yes"), config_for(thread_id))
    answers = {m.tool_call_id: m for m in tool_messages(out["messages"])}
    assert answers["h1"].content == "w(a) ok"
    assert answers["h2"].content == "person said yes" and answers["h2"].status == "success"
    assert log.attempts("w") == 1 and log.applied("confirm") == 1
    eff = effects_by_tool(saver, thread_id)
    assert eff["confirm"].status is EffectStatus.COMMITTED
    assert eff["w"].status is EffectStatus.COMMITTED


@pytest.mark.parametrize("hook", [True, False], ids=["reconcile", "no-hook"])
def test_node_rerun_by_retry_policy(saver: Any, log: ExecutionLog, hook: bool) -> None:
    """RetryPolicy re-runs the node after a failure that follows a committed sibling."""
    tools = [
        counting_tool(log, "first", EffectKind.REVERSIBLE),
        counting_tool(
            log, "second", EffectKind.IRREVERSIBLE, reconcile=hook, fail=[RuntimeError("flaky")]
        ),
    ]
    model = scripted(calls(("first", "a", "y1"), ("second", "b", "y2")), "fin")
    builder = agent_builder(
        model,
        EffectToolNode(tools, handle_tool_errors=False),
        retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01, retry_on=RuntimeError),
    )
    graph = cancellable(builder, saver)
    thread_id = new_thread()
    out = start(graph, thread_id)
    assert out["messages"][-1].content == "fin"
    # The committed sibling was not dispatched again.
    assert log.attempts("first") == 1 and log.applied("first") == 1
    # The failed call: known not applied, so the retry made one fresh attempt; applied once.
    assert log.attempts("second") == 2 and log.applied("second") == 1
    keys = {r["key"] for r in log.rows("second")}
    assert len(keys) == 1
    eff = effects_by_tool(saver, thread_id)
    assert eff["first"].status is EffectStatus.COMMITTED
    assert eff["second"].status is EffectStatus.COMMITTED
    statuses = [h.to_status for h in saver.ledger.history(eff["second"].effect_id)]
    assert statuses.count(EffectStatus.DISPATCHED) == 2
    assert EffectStatus.NOT_APPLIED in statuses
    assert_no_duplicate_keys(saver, thread_id)


@pytest.fixture(scope="module", params=backend_params(durable_only=True))
def durable_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """SQLite and PostgreSQL only: what survives the death of a process."""
    with module_database(request) as url:
        yield url


@pytest.mark.slow
def test_kill9_mid_batch_then_resume_in_new_process(
    durable_url: str, providers_path: str, log: ExecutionLog
) -> None:
    """SIGKILL while the second of three side effects is in flight; resume elsewhere.

    One worker runs two threads of the same agent; its ``charge`` call is held
    before the effect on one thread and after it on the other (applied, not yet
    recorded) when the worker is killed.
    """
    systems = Providers(providers_path)
    base = new_thread()
    phases = {"before": f"{base}-b", "after": f"{base}-a"}
    worker = f"worker-{base}"
    with open_saver(durable_url):  # the schema exists before the worker starts
        pass
    for phase in phases:
        log.arm(f"charge_{phase}", phase)
    runs = [f"{thread_id}:charge_{phase}" for phase, thread_id in phases.items()]
    proc = subprocess.Popen(
        worker_command("kill", durable_url, providers_path, runs, worker),
        env=worker_env(providers_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def both_in_flight() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited early: {proc.communicate()[1][-3000:]}")
            held_before = log.rows("charge_before")
            held_after = log.rows("charge_after")
            return bool(held_before) and bool(held_after) and held_after[0]["applied"] is not None

        wait_until(both_in_flight, timeout=90, what="the worker to be inside both charges")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]

    with open_saver(durable_url) as saver:
        ledger = saver.ledger
        for phase, thread_id in phases.items():
            # What the dead worker left: update committed, charge in flight, the email
            # planned with its batch but never dispatched.
            assert ledger.find_effect(thread_id, "k1").status is EffectStatus.COMMITTED
            assert ledger.find_effect(thread_id, "k2").status is EffectStatus.DISPATCHED
            email = ledger.find_effect(thread_id, "k3")
            assert email is not None and email.status is EffectStatus.PLANNED
            assert email.dispatched_at is None
            assert systems.attempts(derive_idempotency_key(thread_id, "k3")) == 0
            assert log.applied(f"charge_{phase}") == (1 if phase == "after" else 0)
            log.release(f"charge_{phase}", phase)

        for phase, thread_id in phases.items():
            charge = f"charge_{phase}"
            graph, _model = kill_graph(saver, log, charge)
            out = graph.invoke(None, config_for(thread_id, worker=worker))
            assert out["messages"][-1].content == "done"
            assert not dangling_calls(out["messages"])
            # Provider truth: every key applied exactly once, and requested once.
            for call_id in ("k1", "k3"):
                key = derive_idempotency_key(thread_id, call_id)
                assert systems.executions(key) == 1 and systems.attempts(key) == 1, call_id
            assert log.applied(charge) == 1
            # Killed before applying: one fresh attempt after reconcile said not applied.
            # Killed after applying: reconcile found it committed; no second attempt.
            assert log.attempts(charge) == (2 if phase == "before" else 1)
            effects = ledger.effects(thread_id)
            assert [e.tool_call_id for e in effects] == ["k1", "k2", "k3"]
            assert all(e.status is EffectStatus.COMMITTED for e in effects)
            assert_no_duplicate_keys(saver, thread_id)
            assert len(ledger.runs(thread_id)) == 1
            assert ledger.latest_run(thread_id).status.value == "completed"

"""Chaos and properties: random plans, a stop and/or a crash at a random point, I1-I8.

Hypothesis generates whole agent runs (``tests/chaos_harness.py``): a scripted
model emitting one to three turns of one to six tool calls of every effect kind
(reads, a read that needs approval, a reversible ticket with a compensating
close, pre-approved emails, refunds that need approval above 100, chat posts
that always need it and cannot be reconciled), an ``effect_concurrency`` of 1
to 3, a reviewer answering approve / reject / edit / an invalid edit, provider
faults (a request failing before or after it was applied, or hanging), and
chaos: ``request_cancel`` from another thread before the start, while the
model writes a turn, while a call is at the provider (before or after it
applied), or while an approval is pending; a crash inside a tool (an exception
nothing catches, as if the process died there); the invocation's asyncio task
cancelled (a server's ``runs.cancel``); a crash inside a reconcile or
compensate hook. Up to three stop requests race at a cancel point; after a
crash, two workers may race to resume the thread. Each run is resumed after
every crash, every interrupt is answered, the thread then gets a new message,
and I1-I8 are checked against the providers' own truth.

A real SIGKILL of a worker process at a random tool call is a separate, smaller
property (the worker is forked from a fork server with the imports preloaded).

Budgets: ``tests/hypothesis_profiles.py`` (``ci`` derandomized with more
examples, ``dev`` random with fewer). Counterexamples found while writing
these tests are kept below as ``@example`` cases.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage

from chaos_harness import (
    TOOL_KINDS,
    CallSpec,
    Inject,
    Plan,
    Runner,
    check_cancelled_run_starts_nothing,
    check_invariants,
    check_persisted_state_answers,
    check_resume_reconciles_first,
    db_url_of,
    kill_worker,
    open_saver,
)
from chaos_strategies import call_specs, chaos, decisions_strategy, faults_strategy, turns_strategy
from fork_server import ensure_fork_server
from hypothesis_profiles import examples
from langgraph_cancel import EffectKind, EffectStatus, Ledger
from langgraph_cancel.errors import DispatchRefusedError
from langgraph_cancel.types import RunStatus

pytestmark = pytest.mark.version_neutral

HERE = Path(__file__).resolve().parent


@st.composite
def plans(draw: st.DrawFn, *, backends: tuple[str, ...] = ("memory", "sqlite")) -> Plan:
    turns = draw(turns_strategy)
    n_calls = sum(len(t) for t in turns)
    use_async = draw(st.booleans())
    chaos_ = draw(chaos(n_calls, len(turns), use_async))
    return Plan(
        turns=turns,
        effect_concurrency=draw(st.integers(1, 3)),
        decisions=draw(decisions_strategy),
        injections=chaos_,
        faults=draw(faults_strategy),
        backend=draw(st.sampled_from(backends)),
        use_async=use_async,
        compensate_on_cancel=draw(st.booleans()) or any(i.phase == "compensate" for i in chaos_),
        reconcile_interactive=draw(st.booleans()),
        racing_cancels=draw(st.sampled_from((1, 1, 2, 3))),
        racing_resumes=draw(st.booleans()),
    )


def play(plan: Plan) -> Runner:
    """Play a plan in a fresh world (providers' file, database, thread); check I1-I8."""
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        root = Path(tmp)
        with open_saver(plan.backend, root) as saver:
            runner = Runner(plan, root, saver, url=db_url_of(plan.backend, root))
            runner.play()
            return runner


# ---------------------------------------------------------------------------- the property
C = CallSpec


@pytest.mark.timeout(1200)
@settings(max_examples=examples(ci=75, dev=20))
@given(plan=plans())
# Kept counterexamples and hand-picked corners (see the module docstring):
# A task killed while a reversible call failed at its provider (ToolNode answered the
# error): the call was once recorded committed.
@example(
    plan=Plan(
        turns=(
            (C("cx_lookup"), C("cx_lookup"), C("cx_lookup"), C("cx_lookup"), C("cx_ticket", 2)),
        ),
        injections=(Inject("kill_task", "tool", 4, "before"),),
        use_async=True,
    )
)
@example(
    plan=Plan(
        turns=((C("cx_email"), C("cx_ticket"), C("cx_email")),),
        injections=(Inject("cancel", "tool", 1, "after"),),
    )
)
@example(
    plan=Plan(
        turns=((C("cx_email"), C("cx_ticket"), C("cx_post")),),
        injections=(Inject("kill_task", "tool", 0, "after"),),
        use_async=True,
    )
)
@example(
    plan=Plan(
        turns=((C("cx_post"),),),
        injections=(Inject("crash", "tool", 0, "before"),),
        backend="sqlite",
    )
)
@example(
    plan=Plan(
        turns=((C("cx_post"), C("cx_refund", 1)),),
        injections=(Inject("cancel", "approval", 0, "answer"),),
    )
)
@example(
    plan=Plan(
        turns=((C("cx_email"), C("cx_ticket")), (C("cx_refund"),)),
        faults=(("send_email", "fail_after"), ("create_ticket", "fail_before")),
        effect_concurrency=2,
        compensate_on_cancel=True,
        injections=(Inject("cancel", "turn", 1),),
    )
)
@example(
    # Found by a 400-example soak: the cancel came while the model wrote its final
    # answer, so the run's cancel was finished after the graph ended, and the crash
    # hit the ticket's compensation there. The checkpoint names no next step; the
    # run (cancelling) does, and the resume compensates the ticket.
    plan=Plan(
        turns=((C("cx_lookup"),), (C("cx_lookup"),), (C("cx_ticket"),)),
        injections=(
            Inject("cancel", "turn", 3, "before"),
            Inject("crash", "hook", 0, "compensate"),
        ),
        compensate_on_cancel=True,
        use_async=True,
    )
)
@example(
    # Found by a 150-example soak: the run's task was killed inside a tool (a read that
    # needs approval) whose batch ran in the supervised worker; the kill landed after
    # the node returned, before the step's checkpoint, and the cancel finished outside
    # the graph dropped the node's answer (pending writes): c0 left unanswered (I5).
    # About one run in twenty failed; graph.py's _keep_finished_writes fixed it.
    plan=Plan(
        turns=((C("cx_check"),),),
        injections=(
            Inject("cancel", "turn", 1, "before"),
            Inject("kill_task", "tool", 0, "before"),
        ),
        decisions=("approve",),
        backend="sqlite",
        use_async=True,
        reconcile_interactive=True,
    )
)
@example(
    # Found by the next soak, against the first version of that fix (which folded the
    # finished writes in before finishing the cancel): the compensation crashed, and
    # the checkpoint no longer named the tool step its calls were waiting for (I7).
    plan=Plan(
        turns=((C("cx_lookup"),) * 5, (C("cx_lookup"), C("cx_ticket"))),
        injections=(
            Inject("kill_task", "tool", 6, "before"),
            Inject("crash", "hook", 0, "compensate"),
        ),
        use_async=True,
        compensate_on_cancel=True,
    )
)
def test_invariants_hold_under_random_chaos(plan: Plan) -> None:
    runner = play(plan)
    # What the example exercised (pytest --hypothesis-show-statistics).
    for inj in sorted(runner.world.fired, key=repr):
        event(f"fired: {inj.what} at {inj.where} {inj.phase}")
    for status in sorted(runner.final_statuses):
        event(f"effect ended {status}")
    for status in sorted(runner.run_statuses):
        event(f"a run ended {status}")
    if any(i.where == "start" for i in plan.injections):
        assert any(i.where == "start" for i in runner.world.fired)


@pytest.mark.timeout(900)
@settings(
    max_examples=examples(ci=10, dev=4),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(plan=plans(backends=("postgres",)))
def test_invariants_hold_on_postgres(pg_url: str, plan: Plan) -> None:
    """The same property on PostgreSQL (fewer examples: each opens its own pools).

    The examples share one database; each runs on a thread of its own.
    """
    with tempfile.TemporaryDirectory(prefix="chaos-pg-") as tmp:
        root = Path(tmp)
        with open_saver("postgres", root, pg_url) as saver:
            Runner(plan, root, saver, url=pg_url).play()


# ---------------------------------------------------------------------------- I1 stamps
def test_a_dispatch_committed_before_the_request_is_not_counted_late(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression, found by this suite: the report counted legal dispatches as late.

    ``request_cancel`` stamps ``requested_at`` before its transaction commits; a
    dispatch committing in between is legal (the run is still running), yet it
    looked later than the request: a concurrent dispatcher made the report claim
    up to 26 dispatches after cancel. I1 is about the *observed* signal, and
    every dispatch the ledger lets through precedes the observation.
    """
    import langgraph_cancel.ledger.run_ops as run_ops
    from langgraph_cancel.report import build_report
    from langgraph_cancel.types import utcnow

    ledger = Ledger.from_url(db_url)
    try:
        thread_id = f"stamp-{uuid.uuid4().hex[:8]}"
        run = ledger.start_run(thread_id)

        def planned(call_id: str) -> str:
            rec, _ = ledger.plan(
                thread_id=thread_id,
                run_id=run.run_id,
                tool_call_id=call_id,
                tool="t",
                kind=EffectKind.IRREVERSIBLE,
                args={},
            )
            return rec.effect_id

        stamped = utcnow()  # the request takes its stamp ...
        first = planned("d1")
        ledger.transition(first, EffectStatus.DISPATCHED, actor="w", owner="w")
        monkeypatch.setattr(run_ops, "utcnow", lambda: stamped)
        assert ledger.request_cancel(thread_id, reason="stop", requested_by="t").first
        monkeypatch.undo()  # ... and commits after the dispatch did
        with pytest.raises(DispatchRefusedError):  # from here on the ledger refuses
            ledger.transition(planned("d2"), EffectStatus.DISPATCHED, actor="w", owner="w")
        ledger.mark_observed(run.run_id)
        current = ledger.get_run(run.run_id)
        dispatched_at = ledger.get_effect(first).dispatched_at
        assert dispatched_at is not None and current.requested_at is not None
        assert dispatched_at > current.requested_at
        assert build_report(ledger, current).dispatched_after_cancel == 0
        # A dispatch after the observation (one that bypassed the guard) still counts.
        late = planned("d3")
        ledger.transition(
            late, EffectStatus.DISPATCHED, actor="w", owner="w", require_active_run=False
        )
        assert build_report(ledger, ledger.get_run(run.run_id)).dispatched_after_cancel == 1
    finally:
        ledger.close()


# ---------------------------------------------------------------------------- coverage
def test_the_strategies_reach_every_kind_of_chaos() -> None:
    """The generator can produce each effect kind, injection and fault (no dead branches)."""
    seen: set[object] = set()

    @settings(max_examples=300, derandomize=True, database=None)
    @given(plan=plans())
    def collect(plan: Plan) -> None:
        seen.update(TOOL_KINDS[c.tool] for t in plan.turns for c in t)
        seen.update((i.what, i.where) for i in plan.injections)
        seen.update(f[1] for f in plan.faults)
        seen.add(("concurrency", plan.effect_concurrency))

    collect()
    wanted = {
        EffectKind.READ_ONLY,
        EffectKind.REVERSIBLE,
        EffectKind.IRREVERSIBLE,
        ("cancel", "start"),
        ("cancel", "turn"),
        ("cancel", "tool"),
        ("cancel", "approval"),
        ("crash", "tool"),
        ("crash", "hook"),
        ("kill_task", "tool"),
        "fail_before",
        "fail_after",
        "hang:0.2",
        ("concurrency", 1),
        ("concurrency", 3),
    }
    assert wanted <= seen, wanted - seen


# ---------------------------------------------------------------------------- SIGKILL
CTX = multiprocessing.get_context("forkserver")


@pytest.fixture(scope="module")
def fork_server() -> Iterator[None]:
    """A fork server with the harness (and so LangGraph) imported once (``fork_server``).

    Another module may have started it already; it is shared then.
    """
    CTX.set_forkserver_preload(["chaos_harness", "recovery_worker"])
    ensure_fork_server()
    yield


#: Tools whose plain calls run without an approval, so a kill point on them is reached.
UNGATED = ("cx_lookup", "cx_ticket", "cx_email", "cx_refund")


@st.composite
def kill_plans(draw: st.DrawFn) -> tuple[Plan, int, str]:
    """A plan whose first turn runs without approvals, and a call of it to SIGKILL at."""
    first = draw(
        st.lists(
            st.builds(CallSpec, st.sampled_from(UNGATED), st.sampled_from((0, 2))),
            min_size=1,
            max_size=5,
        )
    )
    at = draw(st.integers(0, len(first) - 1))
    # The call killed at must get to its provider request and back (no refusal).
    first[at] = CallSpec(first[at].tool, 0)
    later = draw(st.lists(st.lists(call_specs, min_size=1, max_size=3).map(tuple), max_size=1))
    # Sometimes the stop is pressed while that call is at the provider: the worker then
    # dies in the middle of cancelling, and the recovery must finish the cancel once.
    cancel_too = draw(st.booleans())
    plan = Plan(
        turns=(tuple(first), *later),
        effect_concurrency=draw(st.integers(1, 3)),
        decisions=draw(decisions_strategy),
        injections=(Inject("cancel", "tool", at, "before"),) if cancel_too else (),
        backend="sqlite",
        compensate_on_cancel=draw(st.booleans()),
        reconcile_interactive=draw(st.booleans()),
    )
    phase = "after" if cancel_too else draw(st.sampled_from(("before", "after")))
    return plan, at, phase


def recover_after_sigkill(plan: Plan, root: Path, thread_id: str) -> Runner:
    """A new process's view: I7 from the database alone, resume, new message, I1-I8."""
    # The chaos happened in the dead worker; the recovering process plays it straight.
    plan = dataclasses.replace(plan, injections=())
    with open_saver("sqlite", root) as saver:
        runner = Runner(
            plan, root, saver, url=db_url_of("sqlite", root), thread_id=thread_id, arm_faults=False
        )
        check_persisted_state_answers(runner)
        run = runner.ledger.latest_run(thread_id)
        assert run is not None and not run.terminal
        stopping = run.cancel_requested
        in_flight = [
            e for e in runner.ledger.effects(thread_id) if e.status is EffectStatus.DISPATCHED
        ]
        runner.drive(None)  # resume the killed run (waits out the dead worker's lease)
        for record in in_flight:
            assert runner.ledger.get_effect(record.effect_id).status is not EffectStatus.DISPATCHED
        if stopping:  # the dead worker was cancelling: the recovery finished the cancel
            finished = runner.ledger.get_run(run.run_id)
            assert finished.status is RunStatus.CANCELLED and finished.reason == run.reason
        check_cancelled_run_starts_nothing(runner)
        unsettled = [
            e
            for e in runner.ledger.effects(thread_id)
            if e.status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN)
        ]
        before = {r.run_id for r in runner.ledger.runs(thread_id)}
        runner.drive({"messages": [HumanMessage("where do things stand?")]})
        check_resume_reconciles_first(runner, unsettled, before)
        check_invariants(runner)
        return runner


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(max_examples=examples(ci=6, dev=3))
@given(case=kill_plans())
# Kept: killed while a cancelled read was being abandoned; the checkpoint then holds the
# finished step's writes, not yet committed, so it names no "next" node (I7 misread it).
@example(
    case=(
        Plan(
            turns=((C("cx_lookup"),), (C("cx_check"),)),
            effect_concurrency=3,
            decisions=("approve",),
            injections=(Inject("cancel", "tool", 0, "before"),),
            backend="sqlite",
            reconcile_interactive=False,
        ),
        0,
        "after",
    )
)
def test_sigkill_at_a_random_tool_call_then_resume(
    fork_server: None, case: tuple[Plan, int, str]
) -> None:
    plan, at, phase = case
    event(
        f"killed at a call {phase} its provider request"
        + (", while cancelling" if plan.injections else "")
    )
    with tempfile.TemporaryDirectory(prefix="chaos-kill-") as tmp:
        root = Path(tmp)
        thread_id = f"kill-{uuid.uuid4().hex[:10]}"
        with open_saver("sqlite", root):
            pass  # the schema exists before the worker starts
        proc = CTX.Process(
            target=kill_worker, args=(plan, str(root), thread_id, (at, phase)), daemon=True
        )
        proc.start()
        marker = root / "killed-here"
        deadline = time.monotonic() + 60
        try:
            while not marker.exists():
                assert proc.is_alive() or marker.exists(), (
                    f"the worker ended before its kill point (exit {proc.exitcode})"
                )
                assert time.monotonic() < deadline, "the worker never reached its kill point"
                time.sleep(0.01)
        finally:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
        recover_after_sigkill(plan, root, thread_id)

"""Budgets and deadlines: a breach stops the run through the cancel protocol.

Each limit is breached by a real compiled graph (the chaos harness's agent:
``add_cancellation``, ``ApprovalGate``, ``EffectToolNode``) on memory, SQLite and
PostgreSQL, sync and async; the run ends in one ``cancelled`` transition whose
report names the limit and the figure, and I1-I8 are checked against the
providers' own truth. A property test breaches a random budget at a random
point of a random plan.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage

from chaos_harness import CallSpec, Plan, Runner, open_saver
from chaos_strategies import turns_strategy
from hypothesis_profiles import examples
from langgraph_cancel import Limits, Prices
from langgraph_cancel.errors import InvalidLimitsError
from langgraph_cancel.limits import LimitName, limit_of_reason, tokens_of
from langgraph_cancel.types import RunRecord, RunStatus

C = CallSpec
BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="limits-") as tmp:
        yield Path(tmp)


@contextmanager
def play(plan: Plan, root: Path, pg_url: str | None, *, delay: float = 0.0) -> Iterator[Runner]:
    """Play ``plan`` (run, resume after the stop, I1-I8); the runner, its saver open."""
    with open_saver(plan.backend, root, pg_url) as saver:
        runner = Runner(plan, root, saver)
        runner.world.delay = delay
        runner.play()
        yield runner


def first_run(runner: Runner) -> RunRecord:
    return runner.ledger.runs(runner.thread_id)[0]


def assert_stopped_by(runner: Runner, limit: LimitName) -> RunRecord:
    """The first run was stopped by ``limit``: one cancelled transition, the report says so."""
    run = first_run(runner)
    assert run.status is RunStatus.CANCELLED, run
    assert run.requested_by == "limits"
    assert run.reason is not None and run.reason.startswith(f"limit: {limit.value} "), run.reason
    assert limit_of_reason(run.reason) is limit
    assert run.report is not None
    assert run.report["reason"] == run.reason
    assert run.report["limit"] == limit.value
    events = [e for e in runner.cancelled_events if e["report"]["run_id"] == run.run_id]
    assert len(events) <= 1
    return run


def pg_for(backend: str, request: pytest.FixtureRequest) -> str | None:
    if backend != "postgres":
        return None
    url: str = request.getfixturevalue("pg_url")
    return url


# ------------------------------------------------------------------- the record
def test_limits_reject_what_cannot_be_enforced() -> None:
    with pytest.raises(InvalidLimitsError):
        Limits(max_tool_calls=-1)
    with pytest.raises(InvalidLimitsError):
        Limits(max_tokens=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidLimitsError):
        Limits(deadline=timedelta(0))
    with pytest.raises(InvalidLimitsError, match="price table"):
        Limits(max_cost=1.0)
    with pytest.raises(InvalidLimitsError):
        Prices(per_token=-0.1)
    assert Limits(deadline=timedelta(minutes=2)).deadline_seconds == 120.0
    assert Limits(deadline=3).deadline_seconds == 3.0


def test_a_reason_names_its_limit() -> None:
    assert limit_of_reason("limit: tool_calls 12 > 10") is LimitName.TOOL_CALLS
    assert limit_of_reason("limit: repeats 3 > 2 (search)") is LimitName.REPEATS
    assert limit_of_reason("user pressed stop") is None
    assert limit_of_reason("limit: nonsense 1 > 0") is None
    assert limit_of_reason(None) is None


def test_tokens_are_the_reported_usage_else_the_words() -> None:
    reported = AIMessage(
        "a b c", usage_metadata={"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
    )
    assert tokens_of([reported, AIMessage("four words right here"), HumanMessage("x y")]) == 14


# ------------------------------------------------------------ each limit breached
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_tool_call_budget(
    backend: str, use_async: bool, root: Path, request: pytest.FixtureRequest
) -> None:
    plan = Plan(
        turns=((C("cx_lookup"), C("cx_ticket")), (C("cx_email"), C("cx_ticket"), C("cx_email"))),
        backend=backend,
        use_async=use_async,
        limits=Limits(max_tool_calls=3),
    )
    with play(plan, root, pg_for(backend, request)) as runner:
        run = assert_stopped_by(runner, LimitName.TOOL_CALLS)
        effects = runner.ledger.run_effects(run.run_id)
        emails = runner.world.providers.truth()["emails"]
    assert run.reason == "limit: tool_calls 5 > 3"
    # The second batch was planned whole, then dropped before any of it went out.
    by_status = {e.tool_call_id: e.status.value for e in effects}
    assert by_status == {
        "c0": "committed",
        "c1": "committed",
        "c2": "dropped",
        "c3": "dropped",
        "c4": "dropped",
    }
    assert emails == []


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_side_effect_budget(
    backend: str, use_async: bool, root: Path, request: pytest.FixtureRequest
) -> None:
    plan = Plan(
        turns=((C("cx_lookup"), C("cx_lookup"), C("cx_ticket")), (C("cx_email"), C("cx_lookup"))),
        backend=backend,
        use_async=use_async,
        limits=Limits(max_side_effects=1, max_tool_calls=10),
    )
    with play(plan, root, pg_for(backend, request)) as runner:
        run = assert_stopped_by(runner, LimitName.SIDE_EFFECTS)
    assert run.reason == "limit: side_effects 2 > 1"


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_token_budget(
    backend: str, use_async: bool, root: Path, request: pytest.FixtureRequest
) -> None:
    plan = Plan(
        turns=((C("cx_lookup"),), (C("cx_lookup"),), (C("cx_lookup"),), (C("cx_lookup"),)),
        backend=backend,
        use_async=use_async,
        report_usage=True,
        limits=Limits(max_tokens=40),
    )
    with play(plan, root, pg_for(backend, request)) as runner:
        run = assert_stopped_by(runner, LimitName.TOKENS)
        lookups = len(runner.ledger.run_effects(run.run_id))
    assert run.tokens_used > 40
    # Stopped before the model's fourth turn ran its lookup.
    assert lookups < 4


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_call_budget(
    backend: str, use_async: bool, root: Path, request: pytest.FixtureRequest
) -> None:
    plan = Plan(
        turns=((C("cx_lookup", 3),), (C("cx_lookup", 3),), (C("cx_lookup", 3), C("cx_ticket"))),
        backend=backend,
        use_async=use_async,
        limits=Limits(max_repeats=1),
    )
    with play(plan, root, pg_for(backend, request)) as runner:
        run = assert_stopped_by(runner, LimitName.REPEATS)
        tickets = runner.world.providers.truth()["tickets"]
    assert run.reason == "limit: repeats 2 > 1 (cx_lookup)"
    assert tickets == []


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_cost_budget(
    backend: str, use_async: bool, root: Path, request: pytest.FixtureRequest
) -> None:
    prices = Prices(per_tool={"cx_email": 0.5}, default_tool=0.01)
    plan = Plan(
        turns=((C("cx_lookup"), C("cx_email")), (C("cx_email"), C("cx_email"))),
        backend=backend,
        use_async=use_async,
        limits=Limits(max_cost=1.0, prices=prices),
    )
    with play(plan, root, pg_for(backend, request)) as runner:
        run = assert_stopped_by(runner, LimitName.COST)
        emails = runner.world.providers.truth()["emails"]
    assert run.reason == "limit: cost 1.51 > 1"
    assert len(emails) == 1


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_deadline_fires_while_a_tool_runs(
    backend: str, use_async: bool, root: Path, request: pytest.FixtureRequest
) -> None:
    plan = Plan(
        turns=((C("cx_ticket"),), (C("cx_email"),)),
        backend=backend,
        use_async=use_async,
        limits=Limits(deadline=timedelta(seconds=0.5)),
    )
    # Every side-effecting call takes 1.5 s: the deadline passes inside the first.
    with play(plan, root, pg_for(backend, request), delay=1.5) as runner:
        run = assert_stopped_by(runner, LimitName.DEADLINE)
        effects = runner.ledger.run_effects(run.run_id)
    # The model's second turn (the email) never came: the stop came inside the first.
    assert [e.tool for e in effects] == ["cx_ticket"]
    ticket = effects[0]
    assert ticket.status.value == "committed"  # in flight when the stop came: awaited
    assert run.requested_at is not None and ticket.settled_at is not None
    assert run.requested_at < ticket.settled_at, "the deadline waited for the tool to return"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resumed_run_keeps_its_budget(
    backend: str, root: Path, request: pytest.FixtureRequest
) -> None:
    """A crash after two calls: the resumed run counts them and stops at its budget."""
    from chaos_harness import Inject

    plan = Plan(
        turns=((C("cx_ticket"), C("cx_ticket")), (C("cx_email"),)),
        backend=backend,
        injections=(Inject("crash", "tool", 1, "after"),),
        limits=Limits(max_side_effects=2),
    )
    with play(plan, root, pg_for(backend, request)) as runner:
        run = assert_stopped_by(runner, LimitName.SIDE_EFFECTS)
        emails = runner.world.providers.truth()["emails"]
    assert run.reason == "limit: side_effects 3 > 2"
    assert emails == []


def test_a_breach_after_a_users_stop_does_not_replace_its_reason(root: Path) -> None:
    """The first reason wins: a stop pressed while the model writes turn 1 keeps its reason."""
    from chaos_harness import Inject

    plan = Plan(
        turns=((C("cx_ticket"),), (C("cx_ticket"), C("cx_ticket"))),
        injections=(Inject("cancel", "turn", 1),),
        limits=Limits(max_tool_calls=1),
    )
    with play(plan, root, None) as runner:
        run = first_run(runner)
    assert run.status is RunStatus.CANCELLED
    assert run.requested_by != "limits"
    assert run.report is not None and run.report["limit"] is None


# --------------------------------------------------------------- the property
@st.composite
def budget_plans(draw: st.DrawFn, backends: tuple[str, ...]) -> Plan:
    turns = draw(turns_strategy)
    n_calls = sum(len(turn) for turn in turns)
    which = draw(st.sampled_from(["tool_calls", "side_effects", "repeats", "tokens", "cost"]))
    limits: dict[str, Any] = {}
    if which == "tool_calls":
        limits["max_tool_calls"] = draw(st.integers(0, n_calls))
    elif which == "side_effects":
        limits["max_side_effects"] = draw(st.integers(0, n_calls))
    elif which == "repeats":
        limits["max_repeats"] = draw(st.integers(0, 2))
        turns = tuple((*turn, C("cx_lookup", 3)) for turn in turns)
    elif which == "tokens":
        limits["max_tokens"] = draw(st.integers(0, 200))
    else:
        limits["max_cost"] = draw(st.floats(0.0, 2.0))
        limits["prices"] = Prices(default_tool=0.25, per_token=0.001)
    return Plan(
        turns=turns,
        effect_concurrency=draw(st.integers(1, 3)),
        backend=draw(st.sampled_from(backends)),
        use_async=draw(st.booleans()),
        compensate_on_cancel=draw(st.booleans()),
        report_usage=True,
        limits=Limits(**limits),
    )


def _check_budget_run(runner: Runner) -> None:
    """Every run ended once; one stopped by a limit says which, and went no further."""
    for run in runner.ledger.runs(runner.thread_id):
        assert run.terminal
        event(f"a run ended {run.status.value} ({run.requested_by or 'nobody'} asked)")
        if run.requested_by == "limits":
            assert run.status is RunStatus.CANCELLED
            assert run.report is not None
            assert run.report["limit"] == limit_of_reason(run.reason).value  # type: ignore[union-attr]


@pytest.mark.timeout(1200)
@settings(max_examples=examples(ci=30, dev=10))
@given(plan=budget_plans(("memory", "sqlite")))
def test_a_budget_breach_at_any_point_ends_in_one_terminal_transition(plan: Plan) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="limits-") as tmp,
        play(plan, Path(tmp), None) as runner,
    ):
        _check_budget_run(runner)


@pytest.mark.postgres
@pytest.mark.timeout(1200)
@settings(
    max_examples=examples(ci=10, dev=4),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(plan=budget_plans(("postgres",)))
def test_a_budget_breach_on_postgres_ends_in_one_terminal_transition(
    pg_url: str, plan: Plan
) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="limits-") as tmp,
        play(plan, Path(tmp), pg_url) as runner,
    ):
        _check_budget_run(runner)


# ------------------------------------------------------- create_agent middleware
def _agent_tools(sent: list[str], *, delay: float = 0.0) -> list[Any]:
    from langchain_core.tools import tool

    from langgraph_cancel import EffectKind, effect

    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def send_note(to: str) -> str:
        """Send a note (permanent)."""
        time.sleep(delay)
        sent.append(to)
        return f"sent to {to}"

    @effect(EffectKind.READ_ONLY)
    @tool
    def find(name: str) -> str:
        """Find a person."""
        return f"{name}@example.com"

    return [send_note, find]


def _run_agent(agent: Any, thread: str, *, use_async: bool) -> dict[str, Any]:
    inp = {"messages": [HumanMessage("go")]}
    cfg = {"configurable": {"thread_id": thread}}
    if use_async:
        out: dict[str, Any] = asyncio.run(agent.ainvoke(inp, cfg))
        return out
    result: dict[str, Any] = agent.invoke(inp, cfg)
    return result


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_middleware_tool_call_budget(db_url: str, use_async: bool) -> None:
    from langchain.agents import create_agent

    from graphs import open_saver as open_url_saver
    from langgraph_cancel.middleware import EffectMiddleware
    from langgraph_cancel.testing import ScriptedChatModel, tool_call

    sent: list[str] = []
    model = ScriptedChatModel(
        [
            AIMessage(
                "",
                tool_calls=[
                    tool_call("find", {"name": "ann"}),
                    tool_call("send_note", {"to": "ann"}),
                ],
            ),
            AIMessage("", tool_calls=[tool_call("send_note", {"to": "bob"})]),
            AIMessage("done"),
        ]
    )
    thread = f"mw-budget-{uuid.uuid4().hex[:8]}"
    with open_url_saver(db_url) as saver:
        agent = create_agent(
            model,
            _agent_tools(sent),
            middleware=[EffectMiddleware(approval=False, limits=Limits(max_tool_calls=2))],
            checkpointer=saver,
        )
        out = _run_agent(agent, thread, use_async=use_async)
        run = saver.ledger.latest_run(thread)
        effects = {e.tool_call_id: e for e in saver.ledger.run_effects(run.run_id)}
    assert sent == ["ann"], "the call past the budget never went out"
    assert run.status is RunStatus.CANCELLED
    assert run.reason == "limit: tool_calls 3 > 2"
    assert out["cancellation_report"]["limit"] == "tool_calls"
    assert sorted(e.status.value for e in effects.values()) == ["committed", "committed", "dropped"]
    assert model.calls == 2, "no model call after the breach"


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_middleware_token_budget_and_deadline(db_url: str, use_async: bool) -> None:
    from langchain.agents import create_agent

    from graphs import open_saver as open_url_saver
    from langgraph_cancel.middleware import EffectMiddleware
    from langgraph_cancel.testing import ScriptedChatModel, tool_call

    def looping_model() -> ScriptedChatModel:
        turns = [
            AIMessage("let me write to ann", tool_calls=[tool_call("send_note", {"to": f"a{i}"})])
            for i in range(5)
        ]
        return ScriptedChatModel([*turns, AIMessage("done")], report_usage=True)

    with open_url_saver(db_url) as saver:
        # Tokens: the model reports its usage; the run stops before a turn past 60.
        sent: list[str] = []
        model = looping_model()
        thread = f"mw-tokens-{uuid.uuid4().hex[:8]}"
        agent = create_agent(
            model,
            _agent_tools(sent),
            middleware=[EffectMiddleware(approval=False, limits=Limits(max_tokens=60))],
            checkpointer=saver,
        )
        out = _run_agent(agent, thread, use_async=use_async)
        run = saver.ledger.latest_run(thread)
        assert run.status is RunStatus.CANCELLED
        assert out["cancellation_report"]["limit"] == "tokens"
        assert run.tokens_used > 60
        assert len(sent) < 5
        # Deadline: every note takes 2 s; the stop comes inside the first one. The first
        # note must leave before the deadline: a second leaves room for the run's start
        # on a loaded machine.
        sent = []
        thread = f"mw-deadline-{uuid.uuid4().hex[:8]}"
        agent = create_agent(
            looping_model(),
            _agent_tools(sent, delay=2.0),
            middleware=[EffectMiddleware(approval=False, limits=Limits(deadline=1.0))],
            checkpointer=saver,
        )
        out = _run_agent(agent, thread, use_async=use_async)
        run = saver.ledger.latest_run(thread)
        note = saver.ledger.run_effects(run.run_id)[0]
    assert run.status is RunStatus.CANCELLED
    assert out["cancellation_report"]["limit"] == "deadline"
    assert sent == ["a0"], "the note in flight was awaited; nothing after it went out"
    assert run.requested_at is not None and note.settled_at is not None
    assert run.requested_at < note.settled_at

"""Irreversible last: the approval payload and the report say when a permanent change
came before the rest of the run's work.

Real graphs (the chaos harness's agent: ``ApprovalGate``, ``EffectToolNode``,
``add_cancellation``) on memory, SQLite and PostgreSQL, sync and async.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from chaos_harness import CallSpec, Inject, Plan, Runner, open_saver
from langgraph_cancel.report import build_report

C = CallSpec
BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextmanager
def played(plan: Plan, pg_url: str | None) -> Iterator[tuple[Runner, list[dict[str, Any]]]]:
    """Play ``plan``; the runner (saver open) and every approval request it answered."""
    asked: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="ordering-") as tmp,
        open_saver(plan.backend, Path(tmp), pg_url) as saver,
    ):
        runner = Runner(plan, Path(tmp), saver)
        answer = runner.approval_answer

        def recording(value: dict[str, Any]) -> dict[str, Any]:
            asked.append(value)
            return answer(value)

        runner.approval_answer = recording  # type: ignore[method-assign]
        runner.play()
        yield runner, asked


def pg_for(backend: str, request: pytest.FixtureRequest) -> str | None:
    if backend != "postgres":
        return None
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_email_before_the_drafts_is_named(
    backend: str, use_async: bool, request: pytest.FixtureRequest
) -> None:
    # Turn 0 sends an email (pre-approved); turn 1 reads and opens a ticket that needs
    # approval: the reviewer is told the email already went out.
    plan = Plan(
        turns=((C("cx_email"),), (C("cx_lookup"), C("cx_ticket", 1))),
        backend=backend,
        use_async=use_async,
    )
    with played(plan, pg_for(backend, request)) as (runner, asked):
        first = runner.ledger.runs(runner.thread_id)[0]
        report = build_report(runner.ledger, first)
    assert asked, "the ticket was put to a reviewer"
    note = asked[0]["ordering"]
    assert [e["tool"] for e in note["irreversible_already_ran"]] == ["cx_email"]
    assert "went out before this read-only / reversible work" in note["warning"]
    assert [e.tool for e in report.irreversible_first] == ["cx_email"]
    assert report.irreversible_effects == 1


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_reads_drafts_then_the_gate_then_the_email_is_clean(
    backend: str, use_async: bool, request: pytest.FixtureRequest
) -> None:
    plan = Plan(
        turns=((C("cx_lookup"), C("cx_ticket", 1)), (C("cx_email"),)),
        backend=backend,
        use_async=use_async,
    )
    with played(plan, pg_for(backend, request)) as (runner, asked):
        first = runner.ledger.runs(runner.thread_id)[0]
        report = build_report(runner.ledger, first)
    assert asked and all("ordering" not in value for value in asked)
    assert report.irreversible_first == []
    assert report.irreversible_effects == 1


def test_a_stop_before_the_irreversible_turn_leaves_nothing_permanent() -> None:
    """Irreversible last: a stop while the model writes its last turn leaves only
    reversible work behind, which the cancel undoes."""
    plan = Plan(
        turns=((C("cx_lookup"), C("cx_ticket")), (C("cx_email"), C("cx_refund"))),
        injections=(Inject("cancel", "turn", 1),),
        compensate_on_cancel=True,
    )
    with played(plan, None) as (runner, _asked):
        first = runner.ledger.runs(runner.thread_id)[0]
        first_report = build_report(runner.ledger, first)
    assert first_report.status == "cancelled"
    assert first_report.permanent == [] and first_report.irreversible_effects == 0
    assert [e.tool for e in first_report.compensated] == ["cx_ticket"]
    # The irreversible turn was asked for and never ran.
    assert sorted(e.tool for e in first_report.not_run) == ["cx_email", "cx_refund"]


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_create_agent_review_names_what_already_went_out(db_url: str, use_async: bool) -> None:
    """EffectMiddleware asks about a reversible call after a permanent one: it says so."""
    import asyncio
    import uuid

    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool

    from graphs import open_saver as open_url_saver
    from langgraph_cancel import EffectKind, effect
    from langgraph_cancel.middleware import EffectMiddleware
    from langgraph_cancel.testing import ScriptedChatModel, tool_call

    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def send_note(to: str) -> str:
        """Send a note (permanent)."""
        return f"sent to {to}"

    @effect(EffectKind.REVERSIBLE, requires_approval=True, compensate=lambda k, a, r: None)
    @tool
    def draft_order(order_id: str) -> str:
        """Draft an order change (undoable; a person looks first)."""
        return f"drafted {order_id}"

    model = ScriptedChatModel(
        [
            AIMessage("", tool_calls=[tool_call("send_note", {"to": "ann"})]),
            AIMessage("", tool_calls=[tool_call("draft_order", {"order_id": "o-1"})]),
            AIMessage("done"),
        ]
    )
    cfg: Any = {"configurable": {"thread_id": f"ordering-{uuid.uuid4().hex[:8]}"}}
    inp: Any = {"messages": [HumanMessage("go")]}
    with open_url_saver(db_url) as saver:
        agent = create_agent(
            model, [send_note, draft_order], middleware=[EffectMiddleware()], checkpointer=saver
        )
        if use_async:
            asyncio.run(agent.ainvoke(inp, cfg))
        else:
            agent.invoke(inp, cfg)
        interrupts = agent.get_state(cfg).interrupts
    assert len(interrupts) == 1
    question = interrupts[0].value
    assert question["name"] == "draft_order"
    ran = question["ordering"]["irreversible_already_ran"]
    assert [(e["tool"], e["status"]) for e in ran] == [("send_note", "committed")]
    assert "went out before this reversible work" in question["ordering"]["warning"]

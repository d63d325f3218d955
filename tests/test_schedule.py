"""A tool-node batch's schedule: which side effects' intents go with the batch's plan.

One at a time, the first call's, unless it is reviewed or held. At once, those of the
calls that go out together, up to the concurrency, unless one of them is held or
shares its id with another. Never when a read runs first or the run has limits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest
from langchain_core.messages import ToolCall
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool

from langgraph_cancel import EffectKind, effect
from langgraph_cancel.effects import spec_of
from langgraph_cancel.execution.schedule import Phases, sort_calls, to_begin


@effect(EffectKind.IRREVERSIBLE, requires_approval=False)
@tool
def refund(order: str) -> str:
    """Refund an order."""
    return f"refunded {order}"


@effect(EffectKind.IRREVERSIBLE, requires_approval=True)
@tool
def wire(order: str) -> str:
    """Wire money for an order (a reviewer approves it first)."""
    return f"wired {order}"


@effect(EffectKind.IRREVERSIBLE, requires_approval=False, delay=timedelta(minutes=5))
@tool
def email(order: str) -> str:
    """Email about an order, held in the outbox for five minutes."""
    return f"emailed {order}"


@effect(EffectKind.READ_ONLY)
@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}"


TOOLS: dict[str, BaseTool] = {t.name: t for t in (refund, wire, email, lookup)}


def _phases(*calls: tuple[str, str, str]) -> Phases:
    batch = [
        ToolCall(name=name, args={"order": order}, id=call_id, type="tool_call")
        for name, call_id, order in calls
    ]
    return sort_calls(
        batch,
        tools_by_name=TOOLS,
        specs={name: spec_of(each) for name, each in TOOLS.items()},
        wrapped=False,
        thread_id="t-schedule",
        history=[],
    )


def _begun(phases: Phases, concurrency: int, *, limited: bool = False, **config: Any) -> list[str]:
    plans = to_begin(phases, cast(RunnableConfig, config), concurrency, limited=limited)
    return [plan.call_id for plan in plans]


def test_one_at_a_time_the_first_call_begins() -> None:
    phases = _phases(("refund", "a", "o-1"), ("refund", "b", "o-2"), ("wire", "c", "o-3"))
    assert _begun(phases, 1) == ["a"]


@pytest.mark.parametrize("first", ["wire", "email"])
def test_one_at_a_time_a_first_call_reviewed_or_held_does_not_begin(first: str) -> None:
    assert _begun(_phases((first, "a", "o-1"), ("refund", "b", "o-2")), 1) == []


def test_at_once_the_calls_that_go_together_begin_up_to_the_concurrency() -> None:
    phases = _phases(*(("refund", f"c{i}", f"o-{i}") for i in range(3)))
    assert _begun(phases, 3) == ["c0", "c1", "c2"]
    assert _begun(phases, 2) == ["c0", "c1"]
    # The run's max_concurrency bounds the calls running at once, as it bounds ToolNode's.
    assert _begun(phases, 3, max_concurrency=2) == ["c0", "c1"]
    assert _begun(phases, 3, max_concurrency=1) == ["c0"]


def test_at_once_a_held_call_among_them_keeps_the_plan_apart() -> None:
    phases = _phases(("refund", "a", "o-1"), ("email", "b", "o-2"), ("refund", "c", "o-3"))
    assert _begun(phases, 3) == []
    # Past the concurrency, it does not stand between the plan and the first calls.
    assert _begun(phases, 1) == ["a"]


def test_at_once_a_repeated_call_id_keeps_the_plan_apart() -> None:
    phases = _phases(("refund", "a", "o-1"), ("refund", "a", "o-2"))
    assert _begun(phases, 2) == []


def test_a_review_anywhere_sends_the_calls_one_at_a_time() -> None:
    # A reviewed call makes the batch go one at a time (the questions come in plan
    # order), so only the first call may begin with the plan.
    phases = _phases(("refund", "a", "o-1"), ("refund", "b", "o-2"), ("wire", "c", "o-3"))
    assert _begun(phases, 3) == ["a"]


def test_a_read_first_or_a_run_with_limits_begins_nothing() -> None:
    assert _begun(_phases(("lookup", "r", "o-1"), ("refund", "a", "o-2")), 2) == []
    assert _begun(_phases(("refund", "a", "o-1")), 1, limited=True) == []
    assert _begun(_phases(("lookup", "r", "o-1")), 1) == []

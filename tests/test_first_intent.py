"""A batch's plan carries its first side effect's intent, when nothing stands between.

``EffectToolNode`` plans a batch's side effects in one write before they run. When
they go one at a time, no read runs first and the first needs no review, that write
also records the first call ``dispatched`` (one commit that waits for the disk), after
the step's checkpoint is saved and the run's stop is checked, as the intent on its own
would be. These tests hold the folded write to what the two writes did: the same
records and audit rows, nothing sent twice, a record from an earlier attempt and a
stop before the batch taking the usual way, on every backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph._internal._runnable import RunnableCallable
from langgraph.graph import MessagesState
from langgraph.types import RetryPolicy

from graphs import (
    ExecutionLog,
    agent_builder,
    calls,
    cancellable,
    config_for,
    counting_tool,
    new_thread,
    open_saver,
    scripted,
)
from langgraph_cancel import EffectKind, EffectStatus, EffectToolNode, effect
from langgraph_cancel.ledger import Ledger, derive_effect_id
from langgraph_cancel.nodes.tool_node import EffectToolNode as NodeClass
from langgraph_cancel.types import NewEffect

S = EffectStatus


@pytest.fixture
def log(tmp_path: Path) -> ExecutionLog:
    return ExecutionLog(str(tmp_path / "providers.db"))


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any]]]:
    """The ledger writes a run asks for, in order: plans and transitions' targets."""
    seen: list[tuple[str, Any]] = []

    def spy(name: str, describe: Callable[..., Any]) -> None:
        original = getattr(Ledger, name)

        @functools.wraps(original)
        def wrapper(self: Ledger, *args: Any, **kwargs: Any) -> Any:
            seen.append((name, describe(*args, **kwargs)))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Ledger, name, wrapper)

    spy("plan_many", lambda **kw: [item.tool_call_id for item in kw["items"]])
    spy(
        "plan_many_and_begin",
        lambda **kw: ([item.tool_call_id for item in kw["items"]], kw["begin"]),
    )
    spy("transition", lambda _effect_id, to, **_kw: (EffectStatus(to),))
    spy(
        "transition_many",
        lambda requests: tuple(request.to for request in requests),
    )
    yield seen


def _history(ledger: Ledger, thread: str, call_id: str) -> list[tuple[Any, Any]]:
    effect_id = derive_effect_id(thread, call_id)
    return [(t.from_status, t.to_status) for t in ledger.history(effect_id)]


def test_the_first_intent_goes_with_the_plan(
    db_url: str, log: ExecutionLog, asked: list[tuple[str, Any]]
) -> None:
    refund = counting_tool(log, "refund")
    model = scripted(calls(("refund", "a", "a"), ("refund", "b", "b")), "done")
    thread = new_thread()
    with open_saver(db_url) as saver:
        graph = cancellable(agent_builder(model, EffectToolNode([refund])), saver)
        out = graph.invoke({"messages": [HumanMessage("two refunds")]}, config_for(thread))
        ledger: Ledger = saver.ledger
        assert out["messages"][-1].content == "done"
        assert log.applied("refund") == 2 and log.attempts("refund") == 2
        effects = {e.tool_call_id: e for e in ledger.effects(thread)}
        assert {call: e.status for call, e in effects.items()} == {
            "a": S.COMMITTED,
            "b": S.COMMITTED,
        }
        # The same audit trail the plan and the intent wrote apart.
        for call in ("a", "b"):
            assert _history(ledger, thread, call) == [
                (None, S.PLANNED),
                (S.PLANNED, S.DISPATCHED),
                (S.DISPATCHED, S.COMMITTED),
            ]
    ledger_writes = [entry for entry in asked if entry[0] != "transition" or entry[1]]
    # One write plans both calls and sends the first; the first's outcome goes with the
    # second's intent; no intent of its own for the first.
    assert ledger_writes == [
        ("plan_many_and_begin", (["a", "b"], ["a"])),
        ("transition_many", (S.COMMITTED, S.DISPATCHED)),
        ("transition_many", (S.COMMITTED,)),
    ]


def test_a_call_recorded_by_an_earlier_attempt_takes_the_usual_way(
    db_url: str, log: ExecutionLog, asked: list[tuple[str, Any]]
) -> None:
    # An earlier attempt of the step (a retried node) planned the call and stopped
    # before its intent: the folded write finds the record, begins nothing, and the
    # intent is written on its own; the call goes out once.
    refund = counting_tool(log, "refund")
    model = scripted(calls(("refund", "a", "a")), "done")
    thread = new_thread()
    with open_saver(db_url) as saver:
        ledger: Ledger = saver.ledger

        def agent(state: MessagesState) -> dict[str, Any]:
            reply = model.invoke(state["messages"])
            run = ledger.latest_run(thread)
            if reply.tool_calls and run is not None:
                item = NewEffect(
                    tool_call_id="a",
                    tool="refund",
                    kind=EffectKind.IRREVERSIBLE,
                    args={"item": "a"},
                )
                ledger.plan_many(thread_id=thread, run_id=run.run_id, items=[item])
            return {"messages": [reply]}

        builder = agent_builder(model, EffectToolNode([refund]))
        builder.nodes["agent"].runnable = RunnableCallable(agent)
        graph = cancellable(builder, saver)
        out = graph.invoke({"messages": [HumanMessage("refund")]}, config_for(thread))
        assert out["messages"][-1].content == "done"
        assert log.applied("refund") == 1
        assert _history(ledger, thread, "a") == [
            (None, S.PLANNED),
            (S.PLANNED, S.DISPATCHED),
            (S.DISPATCHED, S.COMMITTED),
        ]
    plans = [entry for entry in asked if entry[0].startswith("plan")]
    assert plans == [("plan_many", ["a"]), ("plan_many_and_begin", (["a"], ["a"]))]
    assert ("transition", (S.DISPATCHED,)) in asked  # the intent, on its own


def test_a_begun_call_whose_attempt_died_before_sending_is_sent_once(
    db_url: str, log: ExecutionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node's first attempt wrote the plan with the first intent, then failed before
    # the call left (LangGraph retries the node): the retry finds the call dispatched,
    # asks its reconcile hook (never applied), and sends it, once, under the same key.
    refund = counting_tool(log, "refund")
    model = scripted(calls(("refund", "a", "a")), "done")
    thread = new_thread()
    original = NodeClass._effects
    failures = [RuntimeError("worker lost before the first call left")]

    def effects_once_failing(self: NodeClass, *args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(NodeClass, "_effects", effects_once_failing)
    with open_saver(db_url) as saver:
        ledger: Ledger = saver.ledger
        node = EffectToolNode([refund])
        builder = agent_builder(
            model,
            node,
            retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.01, retry_on=RuntimeError),
        )
        graph = cancellable(builder, saver)
        out = graph.invoke({"messages": [HumanMessage("refund")]}, config_for(thread))
        assert out["messages"][-1].content == "done"
        assert log.applied("refund") == 1 and log.attempts("refund") == 1
        (record,) = ledger.effects(thread)
        assert record.status is S.COMMITTED
        trail = _history(ledger, thread, "a")
        assert trail[:2] == [(None, S.PLANNED), (S.PLANNED, S.DISPATCHED)]
        assert trail[-1] == (S.DISPATCHED, S.COMMITTED)
        assert S.NOT_APPLIED in {to for _from, to in trail}


def test_a_stop_before_the_batch_plans_without_an_intent(
    db_url: str,
    log: ExecutionLog,
    asked: list[tuple[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The stop lands while the node decides which call goes first: the batch is only
    # planned, and its calls are dropped, none dispatched.
    refund = counting_tool(log, "refund")
    model = scripted(calls(("refund", "a", "a"), ("refund", "b", "b")), "stopped", strict=False)
    thread = new_thread()
    to_begin = NodeClass._to_begin

    with open_saver(db_url) as saver:
        ledger: Ledger = saver.ledger

        def stop_first(self: NodeClass, *args: Any) -> Any:
            assert ledger.request_cancel(thread, reason="stop", requested_by="user").accepted
            return to_begin(self, *args)

        monkeypatch.setattr(NodeClass, "_to_begin", stop_first)
        graph = cancellable(agent_builder(model, EffectToolNode([refund])), saver)
        graph.invoke({"messages": [HumanMessage("two refunds")]}, config_for(thread))
        assert log.attempts("refund") == 0
        for effect in ledger.effects(thread):
            assert effect.status is S.DROPPED and effect.dispatched_at is None
        run = ledger.latest_run(thread)
        assert run is not None and run.status.value == "cancelled"
    assert [entry for entry in asked if entry[0].startswith("plan")] == [("plan_many", ["a", "b"])]


def test_a_call_needing_review_first_keeps_its_plan_apart(
    db_url: str, asked: list[tuple[str, Any]]
) -> None:
    # The first call waits for a reviewer: nothing may be dispatched with the plan.
    sent: list[str] = []

    @effect(EffectKind.IRREVERSIBLE, requires_approval=True)
    @tool
    def refund(item: str) -> str:
        """Refund an item."""
        sent.append(item)
        return f"refunded {item}"

    model = scripted(calls(("refund", "a", "a")), "done")
    thread = new_thread()
    with open_saver(db_url) as saver:
        graph = cancellable(agent_builder(model, EffectToolNode([refund])), saver)
        out = graph.invoke({"messages": [HumanMessage("refund")]}, config_for(thread))
        assert "__interrupt__" in out and sent == []
        (pending,) = saver.ledger.effects(thread)
        assert pending.status is S.PENDING_APPROVAL
    assert [entry for entry in asked if entry[0].startswith("plan")] == [("plan_many", ["a"])]

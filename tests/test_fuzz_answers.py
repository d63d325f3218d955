"""Bad-input fuzzing: malformed answers to a person's questions never crash a graph.

Two questions a graph puts to a person on resume, each fuzzed with Hypothesis
on a real compiled graph (``add_cancellation``, ``ApprovalGate``,
``EffectToolNode``) whose tools reach the refund agent's fake providers:

1. **Approval resume values** given to ``ApprovalGate`` (``Command(resume=...)``):
   any JSON value, wrong counts, unknown decision types, edits of other tools,
   edits with off-schema or key-changing arguments, odd reviewers.
2. **Reconcile answers** about an outcome left unknown ("did these happen?"):
   near the documented shape, or anything at all.

The graph must never fail with anything but our typed errors
(``LangGraphCancelError``, e.g. ``InvalidDecisionError``); a bad reconcile
answer is asked again, never raised. No ledger row is lost, the audit trail of
every record is one unbroken chain ending in its status, and nothing the
reviewer did not approve reached a provider. The strategies and checks are in
``fuzz_inputs_helpers.py``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import assume, event, example, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.types import Command

from chaos_harness import CallSpec, World, call_args
from fuzz_inputs_helpers import (
    ASKED,
    GATED_BATCH,
    _agent_graph,
    _empty_plan,
    _records,
    _weighted,
    assert_audit_consistent,
    assert_left_resumable,
    assert_nothing_unapproved_ran,
    fresh,
    json_values,
    resume_values,
    run_graph,
)
from hypothesis_profiles import examples
from langgraph_cancel import EffectKind, EffectStatus, InvalidDecisionError
from langgraph_cancel.ledger import derive_effect_id
from langgraph_cancel.types import EffectRecord


# ---------------------------------------------------------------------------- 3. approvals
def _gated_graph(world: World, saver: Any) -> Any:
    batch = [
        {"name": spec.tool, "args": call_args(spec, n), "id": f"c{n}"}
        for n, spec in enumerate(GATED_BATCH)
    ]
    return _agent_graph(world, saver, batch)


def _decided(records: dict[str, EffectRecord]) -> dict[str, Any]:
    return {k: (r.status, r.approval, r.args) for k, r in records.items()}


@pytest.mark.timeout(900)
@settings(max_examples=examples(ci=80, dev=25))
@given(
    answers=st.lists(resume_values(), min_size=1, max_size=4),
    backend=st.sampled_from(("memory", "sqlite")),
)
# Found by this test: an edit whose arguments name no order makes the refund raise its
# own error, which ToolNode's default error handling (and so the node's) lets through.
@example(
    answers=[
        [
            {
                "type": "edit",
                "edited_action": {
                    "args": {"order_id": "a" * 10_000, "amount": 5.0, "ref": "r-c0", "tag": "c0"}
                },
            },
            {"type": "approve"},
            {"type": "approve"},
        ]
    ],
    backend="memory",
)
def test_approval_resume_values_never_crash_nor_lose_a_row(
    answers: list[Any], backend: str
) -> None:
    with fresh(backend) as (root, saver):
        world = World(root, plan=_empty_plan())
        graph = _gated_graph(world, saver)
        cfg = {"configurable": {"thread_id": world.thread_id}}
        ledger = saver.ledger
        out = run_graph(graph, {"messages": [HumanMessage("go")]}, cfg)
        assert "__interrupt__" in out
        asked = [a["tool_call_id"] for a in out["__interrupt__"][0].value["action_requests"]]
        assert asked == [f"c{n}" for n, _ in ASKED]
        for value in answers:
            if "__interrupt__" not in out:
                break
            before = _decided(_records(ledger, world.thread_id))
            out = run_graph(graph, Command(resume=value), cfg)
            if "error" in out:
                # A malformed answer is refused whole: nothing decided, the question stands.
                assert isinstance(out["error"], InvalidDecisionError), out["error"]
                assert _decided(_records(ledger, world.thread_id)) == before
                snapshot = graph.get_state(cfg)
                assert snapshot.next == ("approval",) and len(snapshot.interrupts) == 1
                out = {"__interrupt__": snapshot.interrupts}
                event("refused: InvalidDecisionError")
            elif "__interrupt__" in out:
                event("asked again")
            else:
                event("decided")
        if "__interrupt__" in out:  # a well-formed answer settles what is still open
            open_request_count = len(out["__interrupt__"][0].value["action_requests"])
            out = run_graph(graph, Command(resume=[{"type": "approve"}] * open_request_count), cfg)
        assert "error" not in out and "__interrupt__" not in out, out
        records = _records(ledger, world.thread_id)
        assert sorted(records) == [f"c{n}" for n in range(len(GATED_BATCH))]
        if "tool_error" in out:
            # An edit named no order: the tool raised its own exception.
            assert_left_resumable(world, ledger, records)
            return
        assert_audit_consistent(ledger, records)
        assert_nothing_unapproved_ran(world, records)
        keys = world.providers.truth()["keys"]
        for cid, rec in records.items():
            approval = rec.approval or {}
            if rec.status is EffectStatus.REJECTED:
                assert approval.get("decision") == "reject"
                assert keys.get(rec.idempotency_key, {}).get("attempts", 0) == 0
            if approval.get("decision") == "edit":
                assert approval["original_args"] == call_args(
                    GATED_BATCH[int(cid[1:])], int(cid[1:])
                )
            if rec.kind is not EffectKind.READ_ONLY:
                assert keys.get(rec.idempotency_key, {}).get("executions", 0) <= 1
            assert rec.settled, rec
        messages = graph.get_state(cfg).values["messages"]
        answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
        assert answered == set(records)
        # What the message history shows is what ran (edited args included).
        ai = next(m for m in messages if isinstance(m, AIMessage))
        for call in ai.tool_calls:
            assert call["id"] is not None
            rec = records[call["id"]]
            if rec.approval and rec.approval.get("decision") == "edit":
                assert _same(call["args"], rec.args), (call["args"], rec.args)
        assert derive_effect_id(world.thread_id, "c0") == records["c0"].effect_id


def _same(left: Any, right: Any) -> bool:
    """Equality that treats NaN as equal to itself (JSON round trips keep NaN)."""
    if (
        isinstance(left, float)
        and isinstance(right, float)
        and math.isnan(left)
        and math.isnan(right)
    ):
        return True
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(
            _same(x, y) for x, y in zip(left, right, strict=True)
        )
    return bool(left == right)


# ---------------------------------------------------------------------------- 4. reconcile answers
@st.composite
def reconcile_answers(draw: st.DrawFn, effect_id: str) -> Any:
    """A person's answer to "did these happen?": near the documented shape, or anything."""
    decision = st.fixed_dictionaries(
        {
            "effect_id": _weighted((4, st.just(effect_id)), (1, json_values)),
            "decision": _weighted(
                (4, st.sampled_from(("committed", "not_applied", "unknown"))), (1, json_values)
            ),
        },
        optional={
            "result": json_values,
            "owner": _weighted((3, st.just("ops")), (1, json_values)),
            "next_action": _weighted((3, st.just("call the bank")), (1, json_values)),
            "reviewer": json_values,
        },
    )
    decisions = _weighted((4, st.lists(decision, min_size=1, max_size=2)), (1, json_values))
    value = draw(_weighted((2, decisions), (2, st.fixed_dictionaries({"decisions": decisions}))))
    assume(value is not None)  # Command(resume=None) fails inside LangGraph itself
    return value


def _asked_about_an_unknown_post(
    world: World, saver: Any
) -> tuple[Any, dict[str, Any], EffectRecord, dict[str, Any]]:
    """A thread whose last run died with a chat post in flight, recorded unknown (the
    tool has no reconcile hook); a new message makes the graph ask a person about it."""
    graph = _agent_graph(world, saver, [])
    ledger = saver.ledger
    thread_id = world.thread_id
    run = ledger.start_run(thread_id)
    rec, _ = ledger.plan(
        thread_id=thread_id,
        run_id=run.run_id,
        tool_call_id="p1",
        tool="cx_post",
        kind=EffectKind.IRREVERSIBLE,
        args=call_args(CallSpec("cx_post"), 1),
    )
    ledger.transition(rec.effect_id, EffectStatus.DISPATCHED, actor="w", owner="w")
    ledger.transition(
        rec.effect_id, EffectStatus.UNKNOWN, actor="w", owner="operator", next_action="check"
    )
    ledger.finish_run(run.run_id, "failed")
    cfg = {"configurable": {"thread_id": thread_id}}
    out = run_graph(graph, {"messages": [HumanMessage("go")]}, cfg)
    assert "__interrupt__" in out, out
    return graph, cfg, rec, out


def test_reconcile_answer_naming_no_string_effect_id_is_asked_again() -> None:
    """Regression, found by the fuzz below: ``"effect_id": []`` crashed the subgraph
    (an unhashable set lookup) instead of asking again with the error."""
    with fresh("memory") as (root, saver):
        world = World(root, plan=_empty_plan())
        graph, cfg, rec, _ = _asked_about_an_unknown_post(world, saver)
        out = run_graph(graph, Command(resume=[{"effect_id": [], "decision": "committed"}]), cfg)
        assert "error" not in out and "__interrupt__" in out, out
        assert "not asked about" in out["__interrupt__"][0].value["error"]
        assert saver.ledger.get_effect(rec.effect_id).status is EffectStatus.UNKNOWN


@pytest.mark.timeout(900)
@settings(max_examples=examples(ci=40, dev=15))
@given(data=st.data(), backend=st.sampled_from(("memory", "sqlite")))
def test_reconcile_answers_never_crash_nor_lose_a_row(data: st.DataObject, backend: str) -> None:
    """An unknown outcome is put to a person on resume; whatever they answer, nothing breaks."""
    with fresh(backend) as (root, saver):
        world = World(root, plan=_empty_plan())
        graph, cfg, rec, out = _asked_about_an_unknown_post(world, saver)
        ledger = saver.ledger
        thread_id = world.thread_id
        for _ in range(data.draw(st.integers(1, 4))):
            if "__interrupt__" not in out:
                break
            out = run_graph(graph, Command(resume=data.draw(reconcile_answers(rec.effect_id))), cfg)
            assert "error" not in out, out["error"]  # a bad answer is asked again, never raised
            event("asked again" if "__interrupt__" in out else "settled")
        if "__interrupt__" in out:
            settle = [{"effect_id": rec.effect_id, "decision": "not_applied"}]
            out = run_graph(graph, Command(resume=settle), cfg)
        assert "error" not in out and "__interrupt__" not in out, out
        final = ledger.get_effect(rec.effect_id)
        assert final.status in (
            EffectStatus.COMMITTED,
            EffectStatus.NOT_APPLIED,
            EffectStatus.UNKNOWN,
        )
        if final.status is EffectStatus.UNKNOWN:
            assert final.owner and final.next_action
        assert_audit_consistent(ledger, {final.tool_call_id: final})
        assert ledger.latest_run(thread_id).status.value == "completed"

"""End to end through ``langgraph dev`` with the refund agent built by ``create_agent``.

The same server, client and sources of truth as ``test_server_e2e.py`` (the ledger
opened from this process, the fake providers' own file), serving
``langgraph_cancel.demo.agent:agent``: LangChain's ``create_agent`` with
``EffectMiddleware``, as a LangGraph Platform user serves an agent to Studio.

1. Approval: "refund 120 USD" stops on the middleware's per-call question; the
   answer sends the refund once and the agent runs to its end.
2. Studio's stop (``runs.cancel``) while the refund is in flight, then new input: the
   refund ends settled and is never sent again; the cut-short run is closed and its
   calls answered right after them, before the new message.
3. ``request_cancel`` while the second turn's slow call is in flight: the agent ends
   at its next model call, the report in the thread state agreeing with the
   providers' truth; nothing is sent after the stop.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from langgraph_cancel import EffectStatus
from langgraph_cancel.demo.tools import refund_key
from langgraph_cancel.types import RunStatus
from served_helpers import (
    REVIEWER,
    SERVED_BACKENDS,
    Served,
    approve,
    client_fixture,  # noqa: F401 (a fixture, found by name)
    dispatch_count,
    human,
    interrupts_of,
    no_dangling_calls,
    refund_request,
    serving,
    stopped_durably,
    stopped_in_studio_mid_refund,
    thread_id_fixture,  # noqa: F401 (a fixture, found by name)
    tool_answers_follow_their_calls,
    update_order_in_flight,
    wait_for,
)
from server_util import REPO_ROOT

pytest.importorskip("langchain.agents")
pytestmark = pytest.mark.timeout(110)

from langgraph_cancel.demo.agent import AGENT_NAME  # noqa: E402


@pytest.fixture(scope="module", params=SERVED_BACKENDS)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """``langgraph dev`` serving the ``create_agent`` refund agent, ledger on one backend."""
    config = tmp_path_factory.mktemp("create_agent_config") / "langgraph.json"
    config.write_text(
        json.dumps(
            {
                "dependencies": [str(REPO_ROOT)],
                "graphs": {AGENT_NAME: "langgraph_cancel.demo.agent:agent"},
                "env": {},
            }
        )
    )
    with serving(request, tmp_path_factory, config, AGENT_NAME) as running:
        yield running


@pytest.mark.server
async def test_create_agent_approval_then_resume_dispatches_once(
    served: Served, client: Any, thread_id: str
) -> None:
    key = refund_key({"order_id": "o-88", "amount": 120.0})
    await client.runs.wait(thread_id, served.graph_id, input=human(refund_request(120)))
    state = await client.threads.get_state(thread_id)
    (question,) = [pending["value"] for pending in interrupts_of(state)]
    assert question["type"] == "tool_approval" and question["name"] == "issue_refund", question
    assert question["idempotency_key"] == key and question["effect_kind"] == "irreversible"
    assert question["args"] == {"order_id": "o-88", "amount": 120.0}
    assert (await client.threads.get(thread_id))["status"] == "interrupted"
    assert served.providers.attempts(key) == 0  # nothing left while the human decides

    result = await client.runs.wait(thread_id, served.graph_id, command=approve())

    providers = served.providers
    assert providers.executions(key) == 1 and providers.attempts(key) == 1
    rec = served.ledger.effect_by_key(key)
    assert rec is not None and rec.status is EffectStatus.COMMITTED, rec
    assert dispatch_count(served.ledger, rec) == 1
    assert (rec.approval or {}).get("reviewer") == REVIEWER, rec.approval
    for effect in served.ledger.effects(thread_id):
        if effect.kind.value != "read_only":
            assert effect.status is EffectStatus.COMMITTED, effect
            assert providers.executions(effect.idempotency_key) == 1, effect
    final = result["messages"][-1]
    assert final["type"] == "ai" and final["content"].startswith("Done: refunded 120.00"), final
    no_dangling_calls(result["messages"])
    assert (await client.threads.get(thread_id))["status"] == "idle"
    runs = served.ledger.runs(thread_id)
    assert [r.status for r in runs] == [RunStatus.COMPLETED], runs


@pytest.mark.server
async def test_create_agent_stopped_in_studio_then_typed_to_again(
    served: Served, client: Any, thread_id: str
) -> None:
    rec = await stopped_in_studio_mid_refund(served, client, thread_id)  # under 100: no approval
    key = rec.idempotency_key
    assert rec.status in (EffectStatus.COMMITTED, EffectStatus.UNKNOWN), rec
    if rec.status is EffectStatus.UNKNOWN:
        assert rec.owner and rec.next_action, rec

    values = await client.runs.wait(
        thread_id, served.graph_id, input=human("Thanks. Did that go through?")
    )

    assert served.providers.attempts(key) == 1
    messages = values["messages"]
    no_dangling_calls(messages)
    tool_answers_follow_their_calls(messages)  # chat APIs reject any other order
    cut_short, *later = served.ledger.runs(thread_id)
    assert cut_short.status is RunStatus.CANCELLED, cut_short
    assert later and later[-1].status is RunStatus.COMPLETED, later


@pytest.mark.server
async def test_create_agent_durable_stop_ends_at_the_next_model_call(
    served: Served, client: Any, thread_id: str
) -> None:
    from langgraph_cancel.demo.graph import SEED_REQUEST

    served.providers.set_fault("update_order", "hang:2", times=1)
    run = await client.runs.create(thread_id, served.graph_id, input=human(SEED_REQUEST))
    slow = await wait_for(
        "update_order(o-88) to be in flight", lambda: update_order_in_flight(served, thread_id)
    )
    state = await stopped_durably(served, client, thread_id, run["run_id"])
    report = state["values"]["cancellation_report"]
    assert report["status"] == "cancelled" and report["reason"] == "stop pressed", report
    assert report["requested_by"] == "studio" and report["dispatched_after_cancel"] == 0
    assert report["unknown"] == [] and report["awaiting"] == [], report
    # The second turn's calls went out at once, before the stop; the third turn never came.
    ledger = served.ledger
    ran = {e.effect_id for e in ledger.effects(thread_id) if e.kind.value != "read_only"}
    reported = report["permanent"] + report["reversible_committed"]
    assert {e["effect_id"] for e in reported} == ran, report
    assert slow.effect_id in {e["effect_id"] for e in report["reversible_committed"]}
    providers = served.providers
    for entry in reported:
        assert providers.executions(entry["idempotency_key"]) == 1, entry
    assert providers.truth()["orders"]["o-88"]["status"] == "refunded"
    messages = state["values"]["messages"]
    no_dangling_calls(messages)
    assert not any(
        m["type"] == "ai" and str(m.get("content", "")).startswith("Done:") for m in messages
    ), messages
    ledger_run = ledger.latest_run(thread_id)
    assert ledger_run is not None and ledger_run.status is RunStatus.CANCELLED, ledger_run

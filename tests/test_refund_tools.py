"""The refund agent's tools: classification, key forwarding, reconcile and compensate hooks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool

from langgraph_cancel.demo import tools as demo_tools
from langgraph_cancel.demo.services import Providers, RestoreConflict
from langgraph_cancel.effects import Outcome, bound_idempotency_key, spec_of
from langgraph_cancel.types import EffectKind


@pytest.fixture
def providers(tmp_path: Path) -> Iterator[Providers]:
    path = tmp_path / "providers.db"
    demo_tools.set_providers_path(path)
    try:
        yield Providers(path)
    finally:
        demo_tools.set_providers_path(None)


def call(tool: BaseTool, *args: Any, **kwargs: Any) -> str:
    """Call the tool's underlying function (as EffectToolNode's dispatch would)."""
    func = getattr(tool, "func", None)
    assert callable(func)
    result = func(*args, **kwargs)
    assert isinstance(result, str)
    return result


def reconcile(tool: BaseTool, key: str, args: dict[str, Any]) -> Outcome:
    """Run the tool's reconcile hook (all of them are synchronous here)."""
    hook = spec_of(tool).reconcile
    assert hook is not None
    outcome = hook(key, args)
    assert isinstance(outcome, Outcome)
    return outcome


def compensate(tool: BaseTool, key: str, args: dict[str, Any], result: Any) -> None:
    """Run the tool's compensate hook."""
    hook = spec_of(tool).compensate
    assert hook is not None
    assert hook(key, args, result) is None


def test_every_tool_is_classified() -> None:
    kinds = {tool.name: spec_of(tool).kind for tool in demo_tools.TOOLS}
    assert kinds == {
        "lookup_order": EffectKind.READ_ONLY,
        "search_policy": EffectKind.READ_ONLY,
        "update_order": EffectKind.REVERSIBLE,
        "create_ticket": EffectKind.REVERSIBLE,
        "issue_refund": EffectKind.IRREVERSIBLE,
        "send_email": EffectKind.IRREVERSIBLE,
        "notify_slack": EffectKind.IRREVERSIBLE,
        "schedule_email": EffectKind.IRREVERSIBLE,
    }
    for tool in demo_tools.TOOLS:
        spec = spec_of(tool)
        assert spec.classified
        assert tool.description.strip(), tool.name
        if spec.kind is not EffectKind.READ_ONLY:
            assert spec.reconcile is not None, tool.name
        if spec.kind is EffectKind.REVERSIBLE:
            assert spec.compensate is not None, tool.name


def test_approval_rules() -> None:
    refund = spec_of(demo_tools.issue_refund)
    assert refund.needs_approval({"order_id": "o-88", "amount": 120})
    assert not refund.needs_approval({"order_id": "o-88", "amount": 100})
    assert not refund.needs_approval({"order_id": "o-88", "amount": "99.5"})
    assert refund.retry_safe
    assert not spec_of(demo_tools.send_email).needs_approval({"to": "a@example.com"})
    assert spec_of(demo_tools.send_email).retry_safe
    assert spec_of(demo_tools.notify_slack).needs_approval({"channel": "#refunds", "text": "x"})
    assert not spec_of(demo_tools.update_order).needs_approval({"order_id": "o-88", "status": "x"})
    assert not spec_of(demo_tools.lookup_order).needs_approval({"order_id": "o-88"})
    assert "100" in demo_tools.issue_refund.description


def test_refund_key_is_per_order_and_amount() -> None:
    key = spec_of(demo_tools.issue_refund).idempotency_key
    assert key is not None
    assert key({"order_id": "o-88", "amount": 120}) == "refund:o-88:120.00"
    assert key({"order_id": "o-88", "amount": 120.0}) == key({"order_id": "o-88", "amount": 120})
    assert key({"order_id": "o-91", "amount": 120}) != key({"order_id": "o-88", "amount": 120})


def test_side_effecting_tools_need_a_key(providers: Providers) -> None:
    with pytest.raises(RuntimeError, match="idempotency_key"):
        call(demo_tools.issue_refund, "o-88", 10)
    assert providers.truth()["refunds"] == []


def test_read_only_tools(providers: Providers) -> None:
    order = json.loads(demo_tools.lookup_order.invoke({"order_id": "o-88"}))
    assert order["order_id"] == "o-88" and order["total"] == 249.0
    hits = json.loads(demo_tools.search_policy.invoke({"query": "refund approval"}))
    assert hits[0]["policy_id"] == "refunds"


def test_issue_refund_forwards_the_key(providers: Providers) -> None:
    with bound_idempotency_key("k1"):
        first = json.loads(call(demo_tools.issue_refund, "o-88", 120))
        again = json.loads(call(demo_tools.issue_refund, "o-88", 120))
    assert first == again
    truth = providers.truth()
    assert [(r["order_id"], r["amount"], r["key"]) for r in truth["refunds"]] == [
        ("o-88", 120.0, "k1")
    ]
    assert providers.executions("k1") == 1
    assert providers.attempts("k1") == 2


def test_tool_invoke_sees_the_bound_key(providers: Providers) -> None:
    with bound_idempotency_key("via-invoke"):
        sent = json.loads(
            demo_tools.send_email.invoke(
                {"to": "dana@example.com", "subject": "Refund issued", "body": "Hi Dana"}
            )
        )
    assert sent["key"] == "via-invoke"
    assert providers.find_email("via-invoke") is not None


def test_reconcile_refund(providers: Providers) -> None:
    args = {"order_id": "o-88", "amount": 120}
    assert reconcile(demo_tools.issue_refund, "k1", args).status == "not_applied"
    with bound_idempotency_key("k1"):
        output = call(demo_tools.issue_refund, "o-88", 120)
    outcome = reconcile(demo_tools.issue_refund, "k1", args)
    assert outcome.status == "committed"
    assert outcome.result == output


def test_reconcile_after_a_lost_response(providers: Providers) -> None:
    providers.set_fault("refund", "fail_after", times=1)
    with bound_idempotency_key("lost"), pytest.raises(TimeoutError):
        call(demo_tools.issue_refund, "o-88", 30)
    outcome = demo_tools.reconcile_refund("lost", {"order_id": "o-88", "amount": 30})
    assert outcome.status == "committed"
    assert json.loads(outcome.result)["amount"] == 30.0


def test_reconcile_while_in_flight_is_unknown(providers: Providers) -> None:
    providers.set_fault("update_order", "hang:0.5", times=1)

    def dispatch() -> None:
        with bound_idempotency_key("upd"):
            call(demo_tools.update_order, "o-88", "updated")

    worker = threading.Thread(target=dispatch)
    worker.start()
    deadline = time.monotonic() + 5
    while not providers.pending("upd"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    in_flight = reconcile(demo_tools.update_order, "upd", {"order_id": "o-88", "status": "updated"})
    assert in_flight.status == "unknown" and in_flight.reason
    worker.join()
    assert (
        reconcile(demo_tools.update_order, "upd", {"order_id": "o-88", "status": "updated"}).status
        == "committed"
    )


def test_send_email_and_reconcile(providers: Providers) -> None:
    args = {"to": "dana@example.com", "subject": "Refund", "body": "Done"}
    assert reconcile(demo_tools.send_email, "mail-1", args).status == "not_applied"
    with bound_idempotency_key("mail-1"):
        call(demo_tools.send_email, **args)
        call(demo_tools.send_email, **args)
    assert len(providers.truth()["emails"]) == 1
    assert reconcile(demo_tools.send_email, "mail-1", args).status == "committed"


def test_update_order_and_compensate(providers: Providers) -> None:
    args = {"order_id": "o-88", "status": "refunded", "note": "refund r-4471"}
    with bound_idempotency_key("upd-1"):
        content = call(demo_tools.update_order, **args)
    order = providers.get_order("o-88")
    assert (order["status"], order["note"]) == ("refunded", "refund r-4471")
    result = json.loads(content)
    assert result["previous"] == {"note": "", "status": "refund_requested"}
    # What the ledger records is the ToolMessage content string.
    compensate(demo_tools.update_order, "upd-1", args, content)
    order = providers.get_order("o-88")
    assert (order["status"], order["note"]) == ("refund_requested", "")
    # Compensation is idempotent: a retry restores nothing more.
    compensate(
        demo_tools.update_order, "upd-1", args, ToolMessage(content=content, tool_call_id="c1")
    )
    assert providers.executions(demo_tools.compensation_key("upd-1")) == 1
    assert len(providers.truth()["restores"]) == 1


def test_update_compensate_without_a_recorded_result(providers: Providers) -> None:
    with bound_idempotency_key("upd-2"):
        call(demo_tools.update_order, "o-91", "on_hold")
    compensate(demo_tools.update_order, "upd-2", {"order_id": "o-91", "status": "on_hold"}, None)
    assert providers.get_order("o-91")["status"] == "delivered"
    with pytest.raises(RuntimeError, match="nothing known to undo"):
        compensate(
            demo_tools.update_order, "never-dispatched", {"order_id": "o-91", "status": "x"}, None
        )


def test_update_compensate_refuses_to_clobber(providers: Providers) -> None:
    with bound_idempotency_key("upd-3"):
        content = call(demo_tools.update_order, "o-93", "on_hold")
    providers.update_order("o-93", {"status": "cancelled"}, "by-a-human")
    with pytest.raises(RestoreConflict):
        compensate(
            demo_tools.update_order, "upd-3", {"order_id": "o-93", "status": "on_hold"}, content
        )
    assert providers.get_order("o-93")["status"] == "cancelled"


def test_reconcile_update(providers: Providers) -> None:
    assert reconcile(demo_tools.update_order, "u", {}).status == "not_applied"
    with bound_idempotency_key("u"):
        call(demo_tools.update_order, "o-88", "updated")
    outcome = reconcile(demo_tools.update_order, "u", {})
    assert outcome.status == "committed"
    assert json.loads(outcome.result)["previous"] == {"status": "refund_requested"}


def test_create_ticket_and_compensate(providers: Providers) -> None:
    args = {"order_id": "o-88", "subject": "Crushed box", "body": "Refund issued; check stock"}
    assert reconcile(demo_tools.create_ticket, "tk", args).status == "not_applied"
    with bound_idempotency_key("tk"):
        content = call(demo_tools.create_ticket, **args)
    assert json.loads(content)["status"] == "open"
    assert reconcile(demo_tools.create_ticket, "tk", args).status == "committed"
    compensate(demo_tools.create_ticket, "tk", args, content)
    compensate(demo_tools.create_ticket, "tk", args, content)
    tickets = providers.truth()["tickets"]
    assert len(tickets) == 1 and tickets[0]["status"] == "closed"
    assert providers.executions(demo_tools.compensation_key("tk")) == 1


def test_notify_slack(providers: Providers) -> None:
    with bound_idempotency_key("slack-1"):
        posted = json.loads(call(demo_tools.notify_slack, "#refunds", "o-88 refunded"))
    assert posted["channel"] == "#refunds"
    assert reconcile(demo_tools.notify_slack, "slack-1", {}).status == "committed"
    assert reconcile(demo_tools.notify_slack, "slack-2", {}).status == "not_applied"
    assert len(providers.truth()["messages"]) == 1


def test_providers_path_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo_tools.set_providers_path(None)
    path = tmp_path / "from-env.db"
    monkeypatch.setenv("REFUND_AGENT_PROVIDERS_DB", str(path))
    assert demo_tools.providers_path() == str(path)
    assert demo_tools.providers().path == path
    monkeypatch.delenv("REFUND_AGENT_PROVIDERS_DB")
    assert demo_tools.providers_path() == "./refund-providers.db"
    demo_tools.set_providers_path(tmp_path / "explicit.db")
    try:
        assert demo_tools.providers_path() == str(tmp_path / "explicit.db")
    finally:
        demo_tools.set_providers_path(None)


def test_parse_result() -> None:
    assert demo_tools.parse_result('{"a": 1}') == {"a": 1}
    assert demo_tools.parse_result({"a": 1}) == {"a": 1}
    assert demo_tools.parse_result(ToolMessage(content='{"a": 1}', tool_call_id="x")) == {"a": 1}
    assert demo_tools.parse_result("not json") is None
    assert demo_tools.parse_result(None) is None
    assert demo_tools.parse_result("[1, 2]") is None

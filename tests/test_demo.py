"""``langgraph-cancel demo``: the seed scenario end to end, run as a user runs it.

Each test starts the CLI as a subprocess in a temporary directory with no setup
(the embedded SQLite default) and checks the report against the fake providers'
own truth (invariant I6), not against what the agent believes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli_util import flat, ok, ok_json, one_line_error, run_cli
from langgraph_cancel.demo.send_at import SendAtMail
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.report import CancellationReport

pytestmark = pytest.mark.version_neutral

QUEUED = {"create_ticket", "send_email", "update_order", "issue_refund"}


@dataclass
class DemoRun:
    """One finished ``demo --json`` run."""

    workdir: Path
    report: dict[str, Any]
    truth: dict[str, Any]


def _demo(workdir: Path, *args: str) -> DemoRun:
    workdir.mkdir(parents=True, exist_ok=True)
    report = ok_json(run_cli(["demo", "--json", *args], workdir))
    providers = workdir / "refund-providers.db"
    if "--providers-db" in args:
        providers = Path(args[args.index("--providers-db") + 1])
    return DemoRun(workdir, report, Providers(providers).truth())


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The default demo: no --db, no --providers-db, a fresh directory."""
    return _demo(tmp_path_factory.mktemp("demo"))


def _tools(effects: list[dict[str, Any]]) -> list[str]:
    return sorted(e["tool"] for e in effects)


def _executions(truth: dict[str, Any], key: str) -> int:
    return int(truth["keys"].get(key, {}).get("executions", 0))


def assert_seed_report(report: dict[str, Any]) -> None:
    """The seed's outcome: what the report must say."""
    CancellationReport.model_validate(report)
    assert report["status"] == "cancelled"
    assert report["reason"] == "user pressed stop"
    assert _tools(report["permanent"]) == ["issue_refund", "send_email", "send_email"]
    assert all(e["status"] == "committed" for e in report["permanent"])
    assert [(e["tool"], e["args"]["order_id"]) for e in report["reversible_committed"]] == [
        ("update_order", "o-88")
    ]
    assert report["reversible_committed"][0]["args"]["status"] == "refunded"
    assert len(report["not_run"]) == 4
    assert {e["tool"] for e in report["not_run"]} == QUEUED
    assert all(e["dispatched_at"] is None for e in report["not_run"])
    assert report["unknown"] == []
    assert report["compensated"] == [] and report["compensation_failed"] == []
    assert report["rejected"] == []
    assert report["dispatched_after_cancel"] == 0
    assert report["orphans"] == 0
    assert report["requested_at"] and report["observed_at"] and report["quiesced_at"]
    assert report["cancel_latency_ms"] is not None and report["quiescence_ms"] is not None
    assert report["summary"] == (
        "1 issue_refund and 2 send_email are permanent; 1 update_order committed "
        "(reversible); 4 steps not run"
    )


def assert_seed_truth(report: dict[str, Any], truth: dict[str, Any]) -> None:
    """The providers did exactly what the report says (I6), each key at most once (I2)."""
    assert [(r["order_id"], r["amount"]) for r in truth["refunds"]] == [("o-88", 40.0)]
    assert sorted(e["to_addr"] for e in truth["emails"]) == [
        "dana@example.com",
        "finance@example.com",
    ]
    assert [(u["order_id"], u["fields"]) for u in truth["updates"]] == [
        ("o-88", {"status": "refunded"})
    ]
    assert truth["orders"]["o-88"]["status"] == "refunded"
    assert truth["orders"]["o-91"]["status"] == "delivered"  # the queued update never ran
    assert truth["tickets"] == [] and truth["messages"] == [] and truth["restores"] == []
    for entry in report["permanent"] + report["reversible_committed"]:
        assert _executions(truth, entry["idempotency_key"]) == 1, entry
    for entry in report["not_run"]:
        assert _executions(truth, entry["idempotency_key"]) == 0, entry
    assert all(info["executions"] <= 1 for info in truth["keys"].values())


def test_seed_report(seed: DemoRun) -> None:
    assert_seed_report(seed.report)


def test_seed_providers_truth_agrees(seed: DemoRun) -> None:
    assert_seed_truth(seed.report, seed.truth)


def test_seed_needs_no_setup(seed: DemoRun) -> None:
    # The embedded defaults, in the working directory: the agent's database and the
    # providers' own file, apart from it.
    assert (seed.workdir / ".langgraph-cancel.db").is_file()
    assert (seed.workdir / "refund-providers.db").is_file()


def test_demo_is_repeatable(tmp_path: Path) -> None:
    # A second demo on the same database resets its thread and its providers.
    first = _demo(tmp_path)
    second = _demo(tmp_path)
    assert second.report["run_id"] != first.report["run_id"]
    assert_seed_report(second.report)
    assert_seed_truth(second.report, second.truth)


def test_any_thread_on_the_default_database(tmp_path: Path) -> None:
    # The refund key is the ledger's, whatever the thread; on the command line's own
    # default database an earlier demo's thread holding it gives way.
    first = _demo(tmp_path)
    proc = run_cli(["demo", "--thread", "my-demo"], tmp_path)
    out = flat(ok(proc))
    assert "Providers' truth agrees" in out
    assert "replaced the earlier demo on thread 'refund-demo'" in flat(proc.stderr)
    status = ok_json(run_cli(["status", "my-demo", "--json"], tmp_path))
    assert status["run"]["status"] == "cancelled"
    assert status["run"]["run_id"] != first.report["run_id"]
    gone = one_line_error(run_cli(["status", "refund-demo"], tmp_path))
    assert "unknown thread 'refund-demo'" in gone


def test_another_thread_on_a_named_database_is_refused(tmp_path: Path) -> None:
    # On a database the user named, the demo touches no thread it did not make.
    db = str(tmp_path / "agent.db")
    _demo(tmp_path, "--db", db)
    line = one_line_error(run_cli(["demo", "--db", db, "--thread", "mine"], tmp_path))
    assert "already holds the demo's refund key 'refund:o-88:40.00' on thread 'refund-demo'" in line
    assert ok_json(run_cli(["status", "refund-demo", "--json", "--db", db], tmp_path))["run"]
    # Nothing was reset: the earlier demo's world is still there.
    assert len(Providers(tmp_path / "refund-providers.db").truth()["refunds"]) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("step", "permanent", "not_run", "applied"),
    [
        ("refund", ["issue_refund"], 2, {"refunds": 1, "emails": 0, "updates": 0}),
        ("email", ["issue_refund", "send_email"], 1, {"refunds": 1, "emails": 1, "updates": 0}),
        # Stopped at the approval gate: every call of the batch is not run, the read too.
        ("approval", [], 4, {"refunds": 0, "emails": 0, "updates": 0}),
    ],
)
def test_cancel_at(
    tmp_path: Path, step: str, permanent: list[str], not_run: int, applied: dict[str, int]
) -> None:
    run = _demo(tmp_path, "--cancel-at", step)
    report = run.report
    assert report["status"] == "cancelled"
    assert _tools(report["permanent"]) == permanent
    assert len(report["not_run"]) == not_run
    assert report["unknown"] == [] and report["dispatched_after_cancel"] == 0
    assert {k: len(run.truth[k]) for k in applied} == applied
    for entry in report["not_run"]:
        assert _executions(run.truth, entry["idempotency_key"]) == 0


def test_cancel_at_subagent_reports_the_childs_refund_as_permanent(tmp_path: Path) -> None:
    """Stop pressed at the parent while its sub-agent's refund is in flight, in the child."""
    run = _demo(tmp_path, "--cancel-at", "subagent")
    report = CancellationReport.model_validate(run.report)
    assert report.thread_id == "refund-demo" and report.status == "cancelled"
    (refund,) = report.permanent
    assert (refund.tool, refund.args) == ("issue_refund", {"order_id": "o-88", "amount": 40.0})
    assert refund.child_thread_id == "refund-demo-refunds" and refund.child_run_id
    assert "1 issue_refund is permanent" in report.summary
    # The child's email was queued behind the refund: dropped, never sent.
    assert [(e.tool, e.child_thread_id) for e in report.not_run] == [
        ("send_email", "refund-demo-refunds")
    ]
    assert [e.tool for e in report.reads] == ["lookup_order"]
    # Every call the child's model asked for is in exactly one bucket of the parent's report.
    assert len(report.entries()) == 3
    assert report.orphans == 0 and report.dispatched_after_cancel == 0
    assert report.unknown == [] and report.failed == []
    # The providers' truth: exactly the refund happened.
    assert len(run.truth["refunds"]) == 1 and run.truth["emails"] == []
    assert _executions(run.truth, refund.idempotency_key) == 1
    # The child's own run was stopped by the cascade, and says so from its thread.
    child = ok_json(run_cli(["status", "refund-demo-refunds", "--json"], tmp_path))
    assert child["run"]["status"] == "cancelled"
    assert child["run"]["run_id"] == refund.child_run_id
    # People see which sub-agent did it.
    text = flat(ok(run_cli(["report", "refund-demo"], tmp_path)))
    assert f"by sub-agent run {refund.child_run_id} (thread refund-demo-refunds)" in text


def test_demo_help_lists_every_moment(tmp_path: Path) -> None:
    text = flat(ok(run_cli(["demo", "--help"], tmp_path)))
    for step in ("update", "refund", "email", "plan", "approval", "subagent", "none"):
        assert f"{step} (" in text or f"{step} (default" in text, step


@pytest.mark.slow
def test_cancel_at_plan_closes_the_model_stream(tmp_path: Path) -> None:
    report = _demo(tmp_path, "--cancel-at", "plan").report
    assert report["status"] == "cancelled"
    assert _tools(report["permanent"]) == ["issue_refund", "send_email", "send_email"]
    assert report["reversible_committed"] == []  # nothing of turn 2 was dispatched
    assert report["dispatched_after_cancel"] == 0
    assert report["tokens_after_cancel"] is not None


def test_cancel_at_window_revokes_the_scheduled_email(tmp_path: Path) -> None:
    run = _demo(tmp_path, "--cancel-at", "window")
    report = run.report
    assert report["status"] == "cancelled"
    assert _tools(report["permanent"]) == ["issue_refund", "send_email", "send_email"]
    (revoked,) = report["revoked"]
    assert revoked["tool"] == "schedule_email" and revoked["status"] == "revoked"
    assert revoked["release_at"] is not None
    assert report["scheduled"] == [] and report["unknown"] == []
    assert report["dispatched_after_cancel"] == 0
    assert "1 schedule_email revoked inside the delay window" in report["summary"]
    # The send-at provider's own truth: withdrawn before delivery, never delivered.
    mail = SendAtMail(tmp_path / "refund-providers.db").truth()
    assert [e["key"] for e in mail["revoked"]] == [revoked["idempotency_key"]]
    assert mail["delivered"] == [] and mail["scheduled"] == []
    assert len(run.truth["emails"]) == 2  # only the two plain emails went out


@pytest.mark.slow
def test_without_stop_the_run_completes(tmp_path: Path) -> None:
    run = _demo(tmp_path, "--cancel-at", "none")
    assert run.report["status"] == "completed"
    assert run.report["not_run"] == [] and run.report["unknown"] == []
    assert len(run.truth["refunds"]) == 2 and len(run.truth["emails"]) == 3
    assert len(run.truth["updates"]) == 2 and len(run.truth["tickets"]) == 1


def test_human_output(tmp_path: Path) -> None:
    proc = run_cli(["demo"], tmp_path)
    out = flat(ok(proc))
    for text in (
        "Permanent (3)",
        "Reversible, committed (1)",
        "Unknown outcome (0)",
        "Not run (4)",
        "dispatched after cancel",
        "Summary: 1 issue_refund and 2 send_email are permanent; 1 update_order committed "
        "(reversible); 4 steps not run",
        "Providers' truth agrees",
    ):
        assert text in out, out
    # Progress goes to stderr: the stop is pressed while the update is in flight.
    assert "STOP pressed while update_order(o-88) is in flight" in flat(proc.stderr), proc.stderr


@pytest.mark.postgres
def test_demo_on_postgres(tmp_path: Path, pg_url: str) -> None:
    run = _demo(tmp_path, "--db", pg_url, "--providers-db", str(tmp_path / "providers.db"))
    assert_seed_report(run.report)
    assert_seed_truth(run.report, run.truth)


def test_cancel_at_budget_names_the_limit(tmp_path: Path) -> None:
    """Nobody presses stop: the run's tool-call budget stops it, through the same cancel."""
    run = _demo(tmp_path, "--cancel-at", "budget")
    report = run.report
    assert report["status"] == "cancelled"
    assert report["requested_by"] == "limits"
    assert report["limit"] == "tool_calls"
    assert report["reason"] == "limit: tool_calls 9 > 6"
    assert report["summary"].startswith("stopped by its limit: tool_calls 9 > 6; ")
    assert _tools(report["permanent"]) == ["issue_refund", "send_email", "send_email"]
    assert {e["tool"] for e in report["not_run"]} == QUEUED and len(report["not_run"]) == 5
    assert report["dispatched_after_cancel"] == 0 and report["unknown"] == []
    assert len(run.truth["refunds"]) == 1 and run.truth["updates"] == []
    for entry in report["not_run"]:
        assert _executions(run.truth, entry["idempotency_key"]) == 0


def test_cancel_at_ordered_leaves_nothing_permanent(tmp_path: Path) -> None:
    """Irreversible last: reads and undoable drafts first, the permanent calls behind the
    approval gate; a stop while the refund waits leaves nothing permanent."""
    run = _demo(tmp_path, "--cancel-at", "ordered")
    report = run.report
    assert report["status"] == "cancelled"
    assert report["permanent"] == [] and report["reversible_committed"] == []
    assert report["irreversible_effects"] == 0 and report["irreversible_first"] == []
    assert _tools(report["compensated"]) == ["create_ticket", "update_order"]
    assert _tools(report["not_run"]) == ["issue_refund", "send_email", "send_email"]
    assert run.truth["refunds"] == [] and run.truth["emails"] == []
    assert run.truth["orders"]["o-88"]["status"] == "refund_requested"  # the hold was undone
    assert len(run.truth["restores"]) == 1
    assert [t["status"] for t in run.truth["tickets"]] == ["closed"]


def test_the_seed_names_its_irreversible_calls_that_came_first(seed: DemoRun) -> None:
    """The seed sends the refund and emails before its reversible update of o-88."""
    assert _tools(seed.report["irreversible_first"]) == [
        "issue_refund",
        "send_email",
        "send_email",
    ]
    assert seed.report["irreversible_effects"] == 3

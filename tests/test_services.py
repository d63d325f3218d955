"""The refund agent's fake external systems: idempotency keys, faults, processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from langgraph_cancel.demo.providers.mail import Mailer
from langgraph_cancel.demo.providers.orders import Orders
from langgraph_cancel.demo.providers.payments import Payments
from langgraph_cancel.demo.providers.store import ProviderStore
from langgraph_cancel.demo.services import (
    IdempotencyKeyReused,
    OrderNotFound,
    Providers,
    RefundRejected,
    RestoreConflict,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "providers.db"


@pytest.fixture
def providers(db: Path) -> Providers:
    return Providers(db)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


# ---------------------------------------------------------------- basics


def test_seeded_orders_and_own_file(providers: Providers, db: Path) -> None:
    assert db.exists()
    order = providers.get_order("o-88")
    assert order["status"] == "refund_requested"
    assert order["total"] == 249.0
    truth = providers.truth()
    assert {"o-88", "o-91"} <= set(truth["orders"])
    json.dumps(truth)  # JSON-able
    with pytest.raises(OrderNotFound):
        providers.get_order("o-nope")
    # Re-opening does not re-seed.
    assert Providers(db).truth()["orders"] == truth["orders"]


def test_refund_is_applied_once_per_key(providers: Providers) -> None:
    first = providers.refund("o-88", 120, "refund:o-88:120.00")
    again = providers.refund("o-88", 120.0, "refund:o-88:120.00")
    assert first == again
    assert first["refund_id"].startswith("r-")
    assert providers.executions("refund:o-88:120.00") == 1
    assert providers.attempts("refund:o-88:120.00") == 2
    assert providers.find_refund("refund:o-88:120.00") == first
    assert providers.find_refund("never-used") is None
    assert len(providers.truth()["refunds"]) == 1
    other = providers.refund("o-88", 20, "other-key")
    assert other["refund_id"] != first["refund_id"]
    assert providers.executions("never-used") == providers.attempts("never-used") == 0


def test_key_reused_for_a_different_request_is_refused(providers: Providers) -> None:
    providers.refund("o-88", 10, "k")
    with pytest.raises(IdempotencyKeyReused):
        providers.refund("o-88", 11, "k")
    with pytest.raises(IdempotencyKeyReused):
        providers.send_email("a@example.com", "s", "b", "k")
    assert providers.executions("k") == 1
    assert len(providers.truth()["refunds"]) == 1


def test_each_provider_works_on_its_own_over_one_store(db: Path) -> None:
    store = ProviderStore(db)
    refund = Payments(store).refund("o-88", 30, "refund:o-88:30.00")
    update = Orders(store).update_order("o-88", {"status": "refunded"}, "update:o-88")
    with pytest.raises(IdempotencyKeyReused):
        Mailer(store).send_email("dana@example.com", "s", "b", "refund:o-88:30.00")
    # The facade over the same file sees what each provider did, under the same keys.
    facade = Providers(db)
    assert facade.find_refund("refund:o-88:30.00") == refund
    assert facade.find_update("update:o-88") == Orders(store).find_update("update:o-88")
    assert update["previous"] == {"status": "refund_requested"}
    assert facade.get_order("o-88")["status"] == "refunded"
    # The refused email is not counted: its refusal rolled its arrival back.
    assert facade.executions("refund:o-88:30.00") == facade.attempts("refund:o-88:30.00") == 1
    assert facade.truth()["emails"] == []


def test_refund_rules(providers: Providers) -> None:
    with pytest.raises(RefundRejected):
        providers.refund("o-91", 50, "too-much")  # total 42.50
    with pytest.raises(RefundRejected):
        providers.refund("o-91", 0, "zero")
    with pytest.raises(OrderNotFound):
        providers.refund("o-404", 5, "missing")
    assert providers.executions("too-much") == 0
    assert providers.attempts("too-much") == 1
    providers.refund("o-91", 40, "ok")
    with pytest.raises(RefundRejected):
        providers.refund("o-91", 5, "over-remaining")
    # A rejected key can be used again once the request is valid.
    assert providers.refund("o-91", 2.5, "over-remaining")["amount"] == 2.5
    with pytest.raises(ValueError):
        providers.refund("o-91", 1, "")


def test_email_outbox(providers: Providers) -> None:
    sent = providers.send_email("dana@example.com", "Refund issued", "Hi Dana", "e1")
    assert providers.send_email("dana@example.com", "Refund issued", "Hi Dana", "e1") == sent
    assert providers.find_email("e1") == sent
    assert providers.executions("e1") == 1
    assert [e["email_id"] for e in providers.truth()["emails"]] == [sent["email_id"]]
    with pytest.raises(ValueError):
        providers.send_email("not-an-address", "s", "b", "e2")


def test_update_and_restore_order(providers: Providers) -> None:
    update = providers.update_order("o-88", {"status": "refunded", "note": "r-4471"}, "u1")
    assert update["previous"] == {"note": "", "status": "refund_requested"}
    assert update["fields"] == {"note": "r-4471", "status": "refunded"}
    assert providers.get_order("o-88")["status"] == "refunded"
    assert providers.update_order("o-88", {"status": "refunded", "note": "r-4471"}, "u1") == update
    assert providers.find_update("u1") is not None
    assert providers.find_update("u1")["previous"] == update["previous"]  # type: ignore[index]
    restore = providers.restore_order(
        "o-88", update["previous"], "undo-u1", expected=update["fields"]
    )
    assert providers.get_order("o-88")["status"] == "refund_requested"
    # Idempotent by its own key, even though the order now differs from `expected`.
    again = providers.restore_order(
        "o-88", update["previous"], "undo-u1", expected=update["fields"]
    )
    assert again == restore
    assert providers.executions("undo-u1") == 1
    assert providers.find_restore("undo-u1") is not None
    truth = providers.truth()
    assert len(truth["updates"]) == 1 and len(truth["restores"]) == 1
    with pytest.raises(ValueError):
        providers.update_order("o-88", {"total": 0}, "u2")
    with pytest.raises(ValueError):
        providers.update_order("o-88", {}, "u3")


def test_restore_refuses_to_clobber_a_later_change(providers: Providers) -> None:
    update = providers.update_order("o-93", {"status": "on_hold"}, "u1")
    providers.update_order("o-93", {"status": "cancelled"}, "someone-else")
    with pytest.raises(RestoreConflict):
        providers.restore_order("o-93", update["previous"], "undo-u1", expected=update["fields"])
    assert providers.get_order("o-93")["status"] == "cancelled"
    assert providers.executions("undo-u1") == 0


def test_tickets_and_messages(providers: Providers) -> None:
    ticket = providers.create_ticket("o-88", "Damaged", "Box crushed", "t1")
    assert ticket["status"] == "open"
    assert providers.create_ticket("o-88", "Damaged", "Box crushed", "t1") == ticket
    closed = providers.close_ticket(ticket["ticket_id"], "close-t1", reason="cancelled")
    assert closed["status"] == "closed"
    assert providers.close_ticket(ticket["ticket_id"], "close-t1", reason="cancelled") == closed
    assert providers.find_ticket("t1") is not None
    message = providers.post_message("#refunds", "refunded o-88", "m1")
    assert providers.post_message("#refunds", "refunded o-88", "m1") == message
    assert providers.find_message("m1") == message
    assert len(providers.truth()["messages"]) == 1


def test_search_policy(providers: Providers) -> None:
    hits = providers.search_policy("refund approval over 100")
    assert hits and hits[0]["policy_id"] == "refunds"
    assert providers.search_policy("zzzz qqqq") == []


# ---------------------------------------------------------------- faults


def test_fail_before_applies_nothing(providers: Providers) -> None:
    providers.set_fault("refund", "fail_before")
    with pytest.raises(ConnectionError):
        providers.refund("o-88", 30, "k")
    assert providers.find_refund("k") is None
    assert (providers.attempts("k"), providers.executions("k")) == (1, 0)
    providers.set_fault("refund", "none")
    refund = providers.refund("o-88", 30, "k")
    assert providers.find_refund("k") == refund
    assert (providers.attempts("k"), providers.executions("k")) == (2, 1)


def test_fail_after_applies_then_loses_the_response(providers: Providers) -> None:
    providers.set_fault("update_order", "fail_after", times=1)
    with pytest.raises(TimeoutError):
        providers.update_order("o-88", {"status": "updated"}, "u")
    assert providers.get_order("o-88")["status"] == "updated"
    found = providers.find_update("u")
    assert found is not None
    # The retry with the same key replays the stored response; the fault fired once.
    retried = providers.update_order("o-88", {"status": "updated"}, "u")
    assert retried["update_id"] == found["update_id"]
    assert (providers.attempts("u"), providers.executions("u")) == (2, 1)
    assert providers.faults() == {}


def test_fault_times_and_validation(providers: Providers) -> None:
    providers.set_fault("send_email", "fail_before", times=2)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            providers.send_email("a@example.com", "s", "b", "e")
    providers.send_email("a@example.com", "s", "b", "e")
    assert providers.attempts("e") == 3 and providers.executions("e") == 1
    with pytest.raises(ValueError):
        providers.set_fault("refund", "explode")
    with pytest.raises(ValueError):
        providers.set_fault("teleport", "fail_before")
    with pytest.raises(ValueError):
        providers.set_fault("refund", "hang:-1")
    providers.set_fault("refund", "hang:0.5")
    assert providers.faults()["refund"].hang_seconds == 0.5
    providers.clear_faults()
    assert providers.faults() == {}


def test_read_faults(providers: Providers) -> None:
    providers.refund("o-88", 10, "k")
    providers.set_fault("find_refund", "fail_before", times=1)
    with pytest.raises(ConnectionError):
        providers.find_refund("k")
    assert providers.find_refund("k") is not None
    providers.set_fault("get_order", "fail_after", times=1)
    with pytest.raises(TimeoutError):
        providers.get_order("o-88")


def test_hang_keeps_the_request_in_flight(providers: Providers) -> None:
    providers.set_fault("update_order", "hang:0.6", times=1)
    results: list[dict[str, Any]] = []
    worker = threading.Thread(
        target=lambda: results.append(
            providers.update_order("o-88", {"status": "updated"}, "in-flight")
        )
    )
    worker.start()
    deadline = time.monotonic() + 5
    while not providers.pending("in-flight"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # In flight: the provider has not applied it yet, and says so.
    assert providers.find_update("in-flight") is None
    assert providers.get_order("o-88")["status"] == "refund_requested"
    # A duplicate arriving now waits for the first and gets its result.
    duplicate = providers.update_order("o-88", {"status": "updated"}, "in-flight")
    worker.join()
    assert results == [duplicate]
    assert not providers.pending("in-flight")
    assert providers.get_order("o-88")["status"] == "updated"
    assert (providers.attempts("in-flight"), providers.executions("in-flight")) == (2, 1)


def test_many_threads_one_key(providers: Providers) -> None:
    results: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        refund = providers.refund("o-97", 500, "same-key")
        with lock:
            results.append(refund["refund_id"])

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1
    assert providers.executions("same-key") == 1
    assert providers.attempts("same-key") == 8


# ------------------------------------------------------------- processes

_REFUND_SCRIPT = """
import json, sys, time
from langgraph_cancel.demo.services import Providers
path, key, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
providers = Providers(path)
while time.time() < start:
    time.sleep(0.001)
print(json.dumps(providers.refund("o-88", 249, key)))
"""


def test_two_processes_same_key_apply_once(db: Path) -> None:
    Providers(db)
    start = str(time.time() + 1.0)
    procs = [_spawn(_REFUND_SCRIPT, str(db), "refund:o-88:249.00", start) for _ in range(2)]
    outputs = [json.loads(_finish(p)) for p in procs]
    assert outputs[0] == outputs[1]
    providers = Providers(db)
    assert providers.executions("refund:o-88:249.00") == 1
    assert providers.attempts("refund:o-88:249.00") == 2
    assert len(providers.truth()["refunds"]) == 1


def test_fault_armed_in_one_process_fires_in_another(db: Path) -> None:
    providers = Providers(db)
    providers.set_fault("refund", "hang:0.8", times=1)
    start = str(time.time() + 0.5)
    first = _spawn(_REFUND_SCRIPT, str(db), "k", start)
    deadline = time.monotonic() + 10
    while not providers.pending("k"):
        assert time.monotonic() < deadline, first.stderr.read() if first.stderr else ""
        time.sleep(0.01)
    # The first process's request is in flight; a second process sends the same key.
    second = _spawn(_REFUND_SCRIPT, str(db), "k", "0")
    assert json.loads(_finish(first)) == json.loads(_finish(second))
    assert providers.executions("k") == 1
    assert providers.attempts("k") == 2


def test_fail_after_across_processes(db: Path) -> None:
    providers = Providers(db)
    providers.set_fault("refund", "fail_after", times=1)
    proc = _spawn(_REFUND_SCRIPT, str(db), "lost-response", "0")
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "TimeoutError" in err
    # The refund happened although the caller never heard back.
    assert providers.find_refund("lost-response") is not None
    assert providers.executions("lost-response") == 1


def test_kill_during_hang_loses_the_request(db: Path) -> None:
    providers = Providers(db)
    providers.set_fault("update_order", "hang:30", times=1)
    code = """
    import sys
    from langgraph_cancel.demo.services import Providers
    Providers(sys.argv[1], in_flight_grace=0.0).update_order("o-88", {"status": "x"}, "doomed")
    """
    proc = _spawn(code, str(db))
    deadline = time.monotonic() + 10
    while not providers.pending("doomed"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    # The "server" died with the request: nothing was applied, but nobody can
    # tell yet; the key stays in flight until its deadline passes.
    assert providers.pending("doomed")
    assert providers.find_update("doomed") is None
    assert providers.executions("doomed") == 0
    assert providers.truth()["keys"]["doomed"]["state"] == "in_flight"


def test_stale_in_flight_marker_expires(db: Path) -> None:
    providers = Providers(db, in_flight_grace=0.0)
    providers.set_fault("update_order", "hang:0.3", times=1)
    code = """
    import sys
    from langgraph_cancel.demo.services import Providers
    Providers(sys.argv[1], in_flight_grace=0.0).update_order("o-91", {"status": "x"}, "doomed")
    """
    proc = _spawn(code, str(db))
    deadline = time.monotonic() + 10
    while not providers.pending("doomed"):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    time.sleep(0.4)
    assert not providers.pending("doomed")
    assert providers.find_update("doomed") is None
    update = providers.update_order("o-91", {"status": "x"}, "doomed")
    assert update["fields"] == {"status": "x"}
    assert providers.executions("doomed") == 1


def test_cli_truth_and_fault(db: Path) -> None:
    Providers(db).refund("o-88", 5, "cli-key")
    module = "langgraph_cancel.demo.services"
    out = subprocess.run(
        [sys.executable, "-m", module, "truth", "--db", str(db)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    truth = json.loads(out)
    assert truth["refunds"][0]["key"] == "cli-key"
    assert truth["keys"]["cli-key"]["executions"] == 1
    subprocess.run(
        [sys.executable, "-m", module, "set-fault", "refund", "fail_after", "--db", str(db)],
        cwd=ROOT,
        env=_env(),
        check=True,
    )
    assert Providers(db).faults()["refund"].mode == "fail_after"
    bad = subprocess.run(
        [sys.executable, "-m", module, "set-fault", "refund", "melt", "--db", str(db)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0

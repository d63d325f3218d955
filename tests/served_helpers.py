"""What the served end-to-end tests share: the running ``langgraph dev`` with its two
sources of truth (``Served``, started by :func:`serving`), the ``client`` and
``thread_id`` fixtures, the inputs a Studio user types or answers, and the waits and
checks on the ledger, the providers and the thread's messages.

Import the fixtures into a test module (``from served_helpers import client_fixture,
thread_id_fixture``): pytest registers them under their ``name=``; the module
defines its own module-scoped ``served``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conftest import fresh_database, require_or_skip, selected_backends
from langgraph_cancel import EffectStatus, Ledger
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.demo.tools import refund_key
from langgraph_cancel.types import EffectRecord, RunStatus
from server_util import LangGraphServer, langgraph_dev

REVIEWER = "alice@example.com"
#: The ledger backends a module's ``served`` fixture runs on, one server each.
SERVED_BACKENDS = [
    pytest.param(b, id=b, marks=[pytest.mark.postgres] if b == "postgres" else [])
    for b in selected_backends()
    if b in ("sqlite", "postgres")
]

T = TypeVar("T")


@dataclass
class Served:
    """The running server, the graph id it serves, and the two sources of truth."""

    server: LangGraphServer
    backend: str
    graph_id: str
    ledger_url: str
    ledger: Ledger
    providers_db: Path

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def providers(self) -> Providers:
        return Providers(self.providers_db)


@contextlib.contextmanager
def ledger_url_on(request: pytest.FixtureRequest, backend: str, root: Path) -> Iterator[str]:
    """A ledger URL on ``backend``: a SQLite file, or a fresh PostgreSQL database."""
    if backend == "sqlite":
        yield "sqlite:///" + str((root / "ledger.db").resolve())
        return
    dsn: str = request.getfixturevalue("pg_dsn")  # skipped locally / failed in CI without it
    with fresh_database(dsn, prefix="lgc_srv") as url:
        yield url


@contextlib.contextmanager
def serving(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    config: str | os.PathLike[str],
    graph_id: str,
    *,
    allow_blocking: bool = False,
) -> Iterator[Served]:
    """``langgraph dev`` serving ``config`` with the ledger on the backend the fixture's
    ``request.param`` names, and the providers' file the served tools use."""
    try:
        import langgraph_api  # noqa: F401
    except ImportError:
        require_or_skip("needs langgraph-cli[inmem] (the 'server' extra)")
    backend: str = request.param
    root = tmp_path_factory.mktemp(f"langgraph_dev_{backend}")
    providers_db = root / "providers.db"
    reset_providers(providers_db)
    with ledger_url_on(request, backend, root) as ledger_url:
        env = {
            "LANGGRAPH_CANCEL_DB": ledger_url,
            "REFUND_AGENT_PROVIDERS_DB": str(providers_db),
        }
        ledger = Ledger.from_url(ledger_url)
        try:
            with langgraph_dev(
                config, workdir=root / "server", env=env, allow_blocking=allow_blocking
            ) as server:
                print(f"[{backend}] langgraph dev up in {server.started_in:.2f}s at {server.url}")
                yield Served(server, backend, graph_id, ledger_url, ledger, providers_db)
            print(f"[{backend}] langgraph dev stopped in {server.stopped_in:.2f}s")
        finally:
            ledger.close()


@pytest.fixture(name="client")
def client_fixture(served: Served, request: pytest.FixtureRequest) -> Iterator[Any]:
    """An async ``langgraph_sdk`` client on a fresh providers' file.

    Prints the server log if the test failed.
    """
    from langgraph_sdk import get_client

    reset_providers(served.providers_db)
    failed_before = request.session.testsfailed
    yield get_client(url=served.url)
    if request.session.testsfailed > failed_before:
        served.server.dump_log(f"langgraph dev log after {request.node.name} failed")


@pytest.fixture(name="thread_id")
async def thread_id_fixture(served: Served, client: Any) -> Any:
    """A new server thread, forgotten by the ledger after the test.

    The example's refund keys are per order and amount, unique across threads,
    so each test starts from a ledger without the previous tests' effects.
    """
    tid = str((await client.threads.create())["thread_id"])
    yield tid
    await asyncio.to_thread(served.ledger.delete_thread, tid)


def reset_providers(path: Path) -> Providers:
    """A fresh, seeded providers' file (the server opens it per call, so this is safe)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return Providers(path)


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def refund_request(amount: float) -> str:
    return f"Order o-88 arrived with a damaged item. Please refund {amount:.0f} USD."


def approve(*, count: int = 1) -> dict[str, Any]:
    return {"resume": {"decisions": [{"type": "approve"}] * count, "reviewer": REVIEWER}}


def interrupts_of(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The pending interrupts of a thread state (top level, else per task)."""
    found = state.get("interrupts")
    if found:
        return list(found)
    return [i for task in state.get("tasks", []) for i in task.get("interrupts", [])]


async def wait_for(
    what: str, probe: Callable[[], T | None], *, timeout: float = 20.0, interval: float = 0.05
) -> T:
    """Poll ``probe()`` (sync, run in a thread) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(probe)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


def in_status(ledger: Ledger, key: str, *statuses: EffectStatus) -> EffectRecord | None:
    rec = ledger.effect_by_key(key)
    return rec if rec is not None and rec.status in statuses else None


def in_flight(served: Served, key: str) -> EffectRecord | None:
    """The call with ``key``, while the provider is processing it.

    ``dispatched`` alone is not enough: the tool node records the intent while the
    model step's checkpoint is still being saved, and sends the call only after it.
    """
    rec = in_status(served.ledger, key, EffectStatus.DISPATCHED)
    return rec if rec is not None and served.providers.pending(key) else None


def update_order_in_flight(served: Served, thread_id: str) -> EffectRecord | None:
    """The thread's ``update_order`` call, while the provider is processing it."""
    for rec in served.ledger.effects(thread_id):
        if rec.tool == "update_order" and in_flight(served, rec.idempotency_key):
            return rec
    return None


def settled_from_flight(ledger: Ledger, key: str) -> EffectRecord | None:
    rec = ledger.effect_by_key(key)
    return rec if rec is not None and rec.status is not EffectStatus.DISPATCHED else None


def dispatch_count(ledger: Ledger, rec: EffectRecord) -> int:
    return sum(1 for t in ledger.history(rec.effect_id) if t.to_status is EffectStatus.DISPATCHED)


def no_dangling_calls(messages: list[dict[str, Any]]) -> None:
    """Invariant I5: every tool call in the history has its ToolMessage."""
    calls = {c["id"] for m in messages if m["type"] == "ai" for c in m.get("tool_calls") or []}
    answered = {m["tool_call_id"] for m in messages if m["type"] == "tool"}
    assert calls <= answered, f"unanswered tool calls: {calls - answered}"


def tool_answers_follow_their_calls(messages: list[dict[str, Any]]) -> None:
    """Chat-API order: an AI message's tool calls are answered before any other message."""
    waiting: set[str] = set()
    for message in messages:
        if message["type"] == "tool":
            waiting.discard(message["tool_call_id"])
            continue
        assert not waiting, f"{message['type']} message before the answers to {sorted(waiting)}"
        if message["type"] == "ai":
            waiting = {c["id"] for c in message.get("tool_calls") or []}


async def interrupted_on_refund(served: Served, client: Any, thread_id: str, amount: float) -> str:
    """Run the agent until it stops on our approval interrupt; return the refund's key."""
    key = refund_key({"order_id": "o-88", "amount": amount})
    await client.runs.wait(thread_id, served.graph_id, input=human(refund_request(amount)))
    state = await client.threads.get_state(thread_id)
    pending = interrupts_of(state)
    assert len(pending) == 1, state
    value = pending[0]["value"]
    # Only the refund over 100 needs a human; the read and the emails do not.
    assert [a["name"] for a in value["action_requests"]] == ["issue_refund"], value
    action = value["action_requests"][0]
    assert action["args"] == {"order_id": "o-88", "amount": amount}
    assert action["idempotency_key"] == key
    assert action["effect_kind"] == "irreversible"
    assert action["why_permanent"]
    review = value["review_configs"][0]
    assert review["action_name"] == "issue_refund"
    assert set(review["allowed_decisions"]) == {"approve", "edit", "reject", "respond"}
    assert state["next"] == ["approval"]
    assert (await client.threads.get(thread_id))["status"] == "interrupted"
    # Paused, not finished: the ledger's run waits for the decision (the server's run id
    # is the one LangGraph's interrupt event carries).
    paused = served.ledger.latest_run(thread_id)
    assert paused is not None and paused.status is RunStatus.RUNNING, paused
    # Nothing irreversible left the process while the human decides.
    assert served.providers.attempts(key) == 0
    assert in_status(served.ledger, key, EffectStatus.PENDING_APPROVAL)
    return key


async def stopped_in_studio_mid_refund(
    served: Served, client: Any, thread_id: str, amount: float = 45.0
) -> EffectRecord:
    """Studio's stop (``runs.cancel``) while a refund under the approval threshold is in
    flight; the refund's record once it has left ``dispatched``."""
    key = refund_key({"order_id": "o-88", "amount": amount})
    served.providers.set_fault("refund", "hang:2", times=1)
    run = await client.runs.create(thread_id, served.graph_id, input=human(refund_request(amount)))
    await wait_for("the refund to be in flight", lambda: in_flight(served, key))
    await client.runs.cancel(thread_id, run["run_id"], action="interrupt", wait=True)
    return await wait_for("the refund to settle", lambda: settled_from_flight(served.ledger, key))


async def stopped_durably(served: Served, client: Any, thread_id: str, run_id: str) -> Any:
    """Stop pressed from another process (``request_cancel``) during the server's run:
    the run ends ``success`` with nothing next; the thread's state, its report in it."""
    from langgraph_cancel import request_cancel

    answer = await asyncio.to_thread(
        request_cancel, served.ledger_url, thread_id, reason="stop pressed", requested_by="studio"
    )
    assert answer.accepted, answer
    await asyncio.wait_for(client.runs.join(thread_id, run_id), timeout=30)
    assert (await client.runs.get(thread_id, run_id))["status"] == "success"
    state = await client.threads.get_state(thread_id)
    assert state["next"] == []
    assert state["values"].get("cancellation_report") is not None, sorted(state["values"])
    return state

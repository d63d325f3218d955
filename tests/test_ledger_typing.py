"""``mypy --strict`` sees what the async ledger's coroutines return.

Two checks: this file's ``assert_type`` calls and its deliberate typo (``mypy``
in ``./scripts/test`` checks tests/ too: an ``Any`` result would fail
``assert_type``, and the typo's ``type: ignore`` would be reported unused), and
a test that runs mypy on a snippet with a typo on an awaited record and finds
the error, where the sync ledger's threaded twins let the same typo through.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import assert_type

from langgraph_cancel.errors import DuplicateIdempotencyKeyError, LedgerError
from langgraph_cancel.ledger.aio import AsyncLedger
from langgraph_cancel.types import (
    CancelRequestResult,
    EffectRecord,
    LeaseRecord,
    RunRecord,
    TransitionRecord,
)


async def test_awaited_results_have_their_types() -> None:
    async with await AsyncLedger.from_url("memory://") as ledger:
        run = await ledger.astart_run("t-typed", owner="w1")
        assert_type(run, RunRecord)
        assert_type(await ledger.aget_run(run.run_id), RunRecord)
        assert_type(await ledger.alatest_run("t-typed"), RunRecord | None)
        planned = await ledger.aplan(
            thread_id="t-typed", run_id=run.run_id, tool_call_id="c1", tool="t",
            kind="read_only", args={},
        )  # fmt: skip
        assert_type(planned, tuple[EffectRecord, bool])
        record, created = planned
        assert created
        moved = await ledger.atransition(record.effect_id, "dispatched")
        assert_type(moved, EffectRecord)
        assert_type(await ledger.atransition_many([]), list[EffectRecord | LedgerError])
        assert_type(
            await ledger.aplan_many(thread_id="t-typed", run_id=run.run_id, items=[]),
            list[tuple[EffectRecord, bool] | DuplicateIdempotencyKeyError],
        )
        assert_type(await ledger.ahistory(record.effect_id), list[TransitionRecord])
        assert_type(await ledger.aacquire_lease("t-typed", "w1"), LeaseRecord)
        cancel = await ledger.arequest_cancel("t-typed", reason="r", requested_by="u")
        assert_type(cancel, CancelRequestResult)
        assert_type(await ledger.afinish_run(run.run_id, "cancelled"), bool)
        assert moved.status.value == "dispatched" and cancel.first


async def _typo_on_an_awaited_run(ledger: AsyncLedger) -> object:
    # Never called: mypy checks it. Were aget_run's result Any, this ignore would be unused.
    run = await ledger.aget_run("r")
    return run.staus  # type: ignore[attr-defined]


SNIPPET = """
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledger.aio import AsyncLedger


async def native(ledger: AsyncLedger) -> object:
    run = await ledger.aget_run("r")
    return run.staus


async def threaded(ledger: Ledger) -> object:
    run = await ledger.aget_run("r")
    return run.staus
"""


def test_mypy_strict_catches_a_typo_on_an_awaited_record(tmp_path: Path) -> None:
    snippet = tmp_path / "typo.py"
    snippet.write_text(SNIPPET)
    # In a process of its own: mypy's in-process run keeps two million objects alive
    # for the rest of the suite, and every full collection after it walks them.
    checked = subprocess.run(
        [
            sys.executable, "-m", "mypy",
            "--strict",
            "--config-file", "",
            "--cache-dir", str(tmp_path / "cache"),
            "--follow-imports", "silent",
            str(snippet),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert checked.returncode == 1, checked.stdout + checked.stderr
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert errors == [
        f'{snippet}:8: error: "RunRecord" has no attribute "staus"; maybe "status"?  [attr-defined]'
    ], checked.stdout

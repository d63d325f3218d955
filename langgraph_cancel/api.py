"""Top-level operations on threads: request a cancel, read the report, compensate.

Every function takes a *target*: one of our savers, a ``Ledger``, or a
database URL, so a second process (or machine) sharing the database can act
on a thread it is not running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from langchain_core.tools import BaseTool

from langgraph_cancel.compensation import compensate_run
from langgraph_cancel.effects import CLASSIFIED_TOOLS
from langgraph_cancel.errors import UnknownThreadError
from langgraph_cancel.hooks import run_sync
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.ledgers import coerce_ledger
from langgraph_cancel.report import CancellationReport, build_report
from langgraph_cancel.types import CancelRequestResult, EffectRecord

Target = Any  # a *CancelSaver, a Ledger, or a database URL


def request_cancel(
    target: Target, thread_id: str, *, reason: str, requested_by: str
) -> CancelRequestResult:
    """Ask the thread's live run to stop. Durable, idempotent, first reason wins.

    "Requested" is not "stopped": the run stops at its next check (before each
    node and each dispatch) and becomes ``cancelled`` once everything it started
    is settled. Cancelling a finished run is a no-op answer (``accepted=False``).

    Args:
        target: A saver, a ``Ledger`` or a database URL.
        thread_id: The thread.
        reason: Why (kept; the first reason wins).
        requested_by: Who asked.

    Raises:
        UnknownThreadError: If the ledger has never seen the thread.
    """
    return coerce_ledger(target).request_cancel(thread_id, reason=reason, requested_by=requested_by)


async def arequest_cancel(
    target: Target, thread_id: str, *, reason: str, requested_by: str
) -> CancelRequestResult:
    """Async ``request_cancel``."""
    return await asyncio.to_thread(
        request_cancel, target, thread_id, reason=reason, requested_by=requested_by
    )


def get_report(
    target: Target, thread_id: str, *, run_id: str | None = None, now: bool = False
) -> CancellationReport:
    """The report of the thread's latest run (or of ``run_id``), from the database alone.

    For a cancelled run this is the report stored at its ``cancelled``
    transition (what was true when it stopped); for any other run, or with
    ``now=True``, it is built from the ledger as it is now (after a later
    compensation or reconciliation, say).

    Raises:
        UnknownThreadError: If the ledger has never seen the thread.
    """
    ledger = coerce_ledger(target)
    run = ledger.get_run(run_id) if run_id else ledger.latest_run(thread_id)
    if run is None:
        raise UnknownThreadError(thread_id)
    if run.report and not now:
        return CancellationReport.model_validate(run.report)
    return build_report(ledger, run)


async def aget_report(
    target: Target, thread_id: str, *, run_id: str | None = None, now: bool = False
) -> CancellationReport:
    """Async ``get_report``."""
    return await asyncio.to_thread(get_report, target, thread_id, run_id=run_id, now=now)


async def acompensate(
    target: Target, thread_id: str, *, tools: Mapping[str, BaseTool] | None = None
) -> list[EffectRecord]:
    """Undo the thread's committed reversible effects, newest first (saga).

    Args:
        target: A saver, a ``Ledger`` or a database URL.
        thread_id: The thread.
        tools: Tools by name, for their compensate hooks (default: every tool
            an ``EffectToolNode`` of this process knows).

    Returns:
        The compensated (or ``compensation_failed``) effects.
    """
    ledger: Ledger = coerce_ledger(target)
    if ledger.latest_run(thread_id) is None:
        raise UnknownThreadError(thread_id)
    known = dict(tools) if tools is not None else dict(CLASSIFIED_TOOLS)
    return await asyncio.to_thread(compensate_run, ledger, ledger.effects(thread_id), known)


def compensate(
    target: Target, thread_id: str, *, tools: Mapping[str, BaseTool] | None = None
) -> list[EffectRecord]:
    """Sync ``acompensate``."""
    result: list[EffectRecord] = run_sync(acompensate(target, thread_id, tools=tools))
    return result


__all__ = [
    "acompensate",
    "aget_report",
    "arequest_cancel",
    "compensate",
    "get_report",
    "request_cancel",
]

"""The outbox: sends the calls the package holds for a delay window, once it has passed.

A tool declared ``effect(..., delay=timedelta(minutes=5))`` without a ``revoke``
hook is never called by the run: its intent is recorded ``scheduled`` with a
release time. A stop before then revokes it (``langgraph_cancel.window``). After
it, an outbox worker (``Outbox.drain`` in your own process, or
``langgraph-cancel outbox --watch``) sends it:

1. claim: ``scheduled -> dispatched`` (a compare-and-set: of several workers, and of
   a worker and a stop, exactly one wins; while the run is live the claim is refused
   once its stop was requested), owner ``outbox:<worker>``;
2. call the tool under the call's idempotency key;
3. record ``committed`` (or ``failed``; ``unknown`` with an owner when a transient
   fault leaves the outcome open and no reconcile hook can tell).

A worker killed between 1 and 3 leaves the call ``dispatched``; once it has not
moved for ``stale_after`` seconds, the next drain sends it again under the same
key when the tool is ``retry_safe`` (the provider applies a key once), else asks
its reconcile hook, else records it ``unknown``. So the call goes out once.

The same drain records as permanent (``committed``) the calls their provider holds
whose window has passed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from langchain_core.tools import BaseTool

from langgraph_cancel.effects import CLASSIFIED_TOOLS, EffectSpec, bound_idempotency_key, spec_of
from langgraph_cancel.errors import LedgerError
from langgraph_cancel.execution.answers import outcome_payload
from langgraph_cancel.hooks import call_reconcile, run_sync
from langgraph_cancel.ledger import Ledger, outbox_sql
from langgraph_cancel.ledger.records import effect_record
from langgraph_cancel.types import (
    EffectRecord,
    EffectStatus,
    RunStatus,
    TransitionRequest,
    utcnow,
)
from langgraph_cancel.window import settle_windows

logger = logging.getLogger("langgraph_cancel.outbox")

#: The owner prefix of the calls an outbox worker released: theirs to settle.
OUTBOX_OWNER_PREFIX = "outbox:"
#: Seconds a released call may stay ``dispatched`` before another drain takes it over.
DEFAULT_STALE_AFTER = 30.0
#: The next action recorded on a released call whose outcome nobody can tell.
ASK_PROVIDER = "ask the provider whether the released call was applied"


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What one pass of the outbox did.

    Attributes:
        sent: Held calls released and recorded (committed, failed or unknown).
        resent: Released calls a dead worker left in flight, settled again.
        made_permanent: Provider-held calls whose window passed, now committed.
    """

    sent: tuple[EffectRecord, ...] = ()
    resent: tuple[EffectRecord, ...] = ()
    made_permanent: tuple[EffectRecord, ...] = ()

    @property
    def total(self) -> int:
        """How many effects this pass moved."""
        return len(self.sent) + len(self.resent) + len(self.made_permanent)


def default_worker() -> str:
    """This process's worker name: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Outbox:
    """Drains the held calls of a ledger whose delay window has passed.

    Args:
        ledger: The ledger the runs write to.
        tools: The tools that make the held calls (a list or a name map); default:
            every tool classified with ``effect(...)`` in this process.
        worker: This worker's name, kept as the owner of what it releases.
        batch_size: At most this many calls per pass and kind.
        stale_after: Seconds before a released call left ``dispatched`` is taken over.
    """

    def __init__(
        self,
        ledger: Ledger,
        tools: Mapping[str, BaseTool] | Iterable[BaseTool] | None = None,
        *,
        worker: str | None = None,
        batch_size: int = 100,
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> None:
        if tools is None:
            self.tools: dict[str, BaseTool] = dict(CLASSIFIED_TOOLS)
        elif isinstance(tools, Mapping):
            self.tools = dict(tools)
        else:
            self.tools = {t.name: t for t in tools}
        self.ledger = ledger
        self.owner = f"{OUTBOX_OWNER_PREFIX}{worker or default_worker()}"
        self.batch_size = batch_size
        self.stale_after = stale_after

    # ------------------------------------------------------------------ reads
    def _select(self, sql: str, params: dict[str, Any]) -> list[EffectRecord]:
        backend = self.ledger.backend
        with backend.read() as cur:
            cur.execute(sql, {**params, "limit": self.batch_size})
            rows: list[dict[str, Any]] = cur.fetchall()
        return [effect_record(row, backend) for row in rows]

    def due(self, now: datetime | None = None) -> list[EffectRecord]:
        """The held calls whose window has passed (their runs not being stopped)."""
        return self._select(
            outbox_sql.SELECT_DUE_HELD, {"now": self.ledger.backend.ts_in(now or utcnow())}
        )

    # ------------------------------------------------------------------ a pass
    def drain(self, now: datetime | None = None) -> DrainResult:
        """One pass: settle what a dead worker left, send what is due, settle provider windows.

        Blocking (database I/O and the tools' calls): run it in a thread from async code.
        """
        moment = now or utcnow()
        backend = self.ledger.backend
        stale_before = backend.ts_in(moment - timedelta(seconds=self.stale_after))
        resent = [
            self._resend(rec)
            for rec in self._select(
                outbox_sql.SELECT_STALE_RELEASED, {"stale_before": stale_before}
            )
        ]
        sent = [moved for rec in self.due(moment) if (moved := self._release(rec)) is not None]
        passed = self._select(
            outbox_sql.SELECT_PASSED_PROVIDER_HELD, {"now": backend.ts_in(moment)}
        )
        permanent = settle_windows(self.ledger, passed, now=moment)
        return DrainResult(tuple(sent), tuple(resent), tuple(permanent))

    def run(
        self,
        *,
        watch: bool = False,
        interval: float = 1.0,
        stop: threading.Event | None = None,
    ) -> int:
        """Drain once, or (``watch``) every ``interval`` seconds until ``stop`` is set.

        Returns:
            How many effects were moved in all.
        """
        moved = 0
        while True:
            moved += self.drain().total
            if not watch or (stop is not None and stop.wait(interval)):
                return moved
            if stop is None:
                time.sleep(interval)

    # ------------------------------------------------------------------ steps
    def _spec(self, rec: EffectRecord) -> tuple[BaseTool | None, EffectSpec | None]:
        tool = self.tools.get(rec.tool)
        return tool, None if tool is None else spec_of(tool)

    def _move(self, request: TransitionRequest) -> EffectRecord | None:
        (done,) = self.ledger.transition_many([request])
        if isinstance(done, LedgerError):
            logger.info("outbox: %s moved by someone else: %s", request.effect_id, done)
            return None
        return done

    def _release(self, rec: EffectRecord) -> EffectRecord | None:
        tool, spec = self._spec(rec)
        if tool is None or spec is None:
            logger.warning("outbox: no tool %r known here; %s stays held", rec.tool, rec.effect_id)
            return None
        run = self.ledger.get_run(rec.run_id)
        if run.cancel_requested:
            return None  # its stop revokes it
        # A live run can still be stopped: the claim then carries the run guard, so a
        # stop that lands between this read and the claim wins (no dispatch after the
        # cancel signal). A finished run cannot be stopped any more.
        claimed = self._move(
            TransitionRequest(
                effect_id=rec.effect_id,
                to=EffectStatus.DISPATCHED,
                expected=frozenset({EffectStatus.SCHEDULED}),
                actor=self.owner,
                owner=self.owner,
                require_active_run=run.status is RunStatus.RUNNING,
                detail={"released": True, "release_at": _iso(rec.release_at)},
            )
        )
        if claimed is None:
            return None  # revoked by a stop, or released by another worker
        return self._send(claimed, tool, spec)

    def _resend(self, rec: EffectRecord) -> EffectRecord:
        tool, spec = self._spec(rec)
        if tool is not None and spec is not None and spec.retry_safe:
            claimed = self._move(
                TransitionRequest(
                    effect_id=rec.effect_id,
                    to=EffectStatus.DISPATCHED,
                    expected=frozenset({EffectStatus.DISPATCHED}),
                    actor=self.owner,
                    owner=self.owner,
                    require_active_run=False,
                    detail={"resent": True, "left_by": rec.owner},
                )
            )
            if claimed is None:
                return self.ledger.get_effect(rec.effect_id)
            return self._send(claimed, tool, spec)
        return self._ask(rec, spec, f"released by {rec.owner}, which stopped before recording it")

    def _send(self, rec: EffectRecord, tool: BaseTool, spec: EffectSpec) -> EffectRecord:
        try:
            with bound_idempotency_key(rec.idempotency_key):
                if getattr(tool, "coroutine", None) is not None:
                    answer = run_sync(tool.ainvoke(rec.args))
                else:
                    answer = tool.invoke(rec.args)
        except spec.retryable as exc:
            return self._ask(rec, spec, repr(exc))
        except Exception as exc:
            return self._settle(rec, EffectStatus.FAILED, error=repr(exc))
        return self._settle(rec, EffectStatus.COMMITTED, result=outcome_payload(answer))

    def _ask(self, rec: EffectRecord, spec: EffectSpec | None, why: str) -> EffectRecord:
        """An open outcome: the reconcile hook decides, or it is recorded unknown."""
        if spec is not None and spec.reconcile is not None:
            outcome = run_sync(call_reconcile(spec, rec.idempotency_key, rec.args))
            if outcome.status == "committed":
                return self._settle(rec, EffectStatus.COMMITTED, result={"content": outcome.result})
            if outcome.status == "not_applied":
                return self._settle(rec, EffectStatus.NOT_APPLIED, error=why)
            why = f"{why}; {outcome.reason}"
        return self._settle(rec, EffectStatus.UNKNOWN, error=why, next_action=ASK_PROVIDER)

    def _settle(
        self,
        rec: EffectRecord,
        to: EffectStatus,
        *,
        result: Any = ...,
        error: Any = ...,
        next_action: Any = ...,
    ) -> EffectRecord:
        moved = self._move(
            TransitionRequest(
                effect_id=rec.effect_id,
                to=to,
                expected=frozenset({EffectStatus.DISPATCHED}),
                actor=self.owner,
                owner=self.owner,
                result=result,
                error=error,
                next_action=next_action,
            )
        )
        return moved if moved is not None else self.ledger.get_effect(rec.effect_id)


def drain_outbox(
    ledger: Ledger,
    tools: Mapping[str, BaseTool] | Iterable[BaseTool] | None = None,
    *,
    watch: bool = False,
    interval: float = 1.0,
    stop: threading.Event | None = None,
) -> int:
    """Run an outbox worker in this process (see ``Outbox``); how many effects it moved."""
    return Outbox(ledger, tools).run(watch=watch, interval=interval, stop=stop)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


__all__ = [
    "ASK_PROVIDER",
    "DEFAULT_STALE_AFTER",
    "OUTBOX_OWNER_PREFIX",
    "DrainResult",
    "Outbox",
    "default_worker",
    "drain_outbox",
]

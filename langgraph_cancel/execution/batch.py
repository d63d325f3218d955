"""One tool-node execution's ledger work, folded into as few statements as it allows.

``EffectToolNode`` prepares a batch before its calls run: one read finds what an
earlier attempt recorded for the batch's reads, one write plans its side
effects, and when the first of them may go out at once (no read or review
before it, the run not stopped) that write also records its intent; the call
itself goes once its step's checkpoint is saved and the stop checked again
(``dispatch.py``), so the two commits overlap. While the calls run, the
read-only outcomes are kept and written together once the reads are back
(nothing outside changed, so no intent is owed before they run), and each side
effect's outcome waits to go in the same round trip as the next call's intent.
With ``effect_concurrency`` above 1 the plan carries the intents of the calls that go
out together, and the intents and outcomes of calls in flight together share their
writes (``group.py``).

A call that reaches the interceptor on its own (``create_agent``'s tool node, a
node with a wrapper of the user's that may rewrite calls) gets a batch of its
own that writes at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from langchain_core.messages import ToolCall
from langchain_core.runnables import RunnableConfig

from langgraph_cancel.errors import (
    DispatchRefusedError,
    DuplicateIdempotencyKeyError,
    IllegalTransitionError,
    LedgerError,
)
from langgraph_cancel.execution.group import GroupCommit
from langgraph_cancel.execution.identity import CallTurns, canonical, own_record_steps
from langgraph_cancel.execution.plan import CallPlan
from langgraph_cancel.execution.settlement import never_sent_steps
from langgraph_cancel.execution.steps import (
    GroupWrite,
    IntentWriteCancelled,
    LedgerCall,
    Protocol,
    ask,
    intent_write,
    ledger_call,
    ledger_write_before_flush,
)
from langgraph_cancel.execution.supervision import Supervisor
from langgraph_cancel.ledger import Ledger
from langgraph_cancel.runtime import RunScope
from langgraph_cancel.types import EffectRecord, EffectStatus, NewEffect, TransitionRequest

logger = logging.getLogger("langgraph_cancel.tools")

#: Where a batch travels with its calls: the calls' config (``configurable``).
BATCH_KEY = "__langgraph_cancel_batch"


@dataclass(frozen=True, slots=True)
class Prepared:
    """A call as the batch prepared it, and what the ledger held for it then."""

    plan: CallPlan
    record: EffectRecord | None


class Batch:
    """The ledger work of one execution of a tool node (or of one call on its own)."""

    def __init__(
        self,
        scope: RunScope,
        *,
        defer: bool = False,
        group: GroupCommit | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.scope = scope
        #: Reads' outcomes and a side effect's outcome wait for a later write (set by
        #: the node, which flushes them before it answers).
        self.defer = defer
        #: Concurrent side effects' writes, shared; None when they go one at a time.
        self.group = group
        #: The node's thread watching the worker that runs the side effects, if any.
        self.supervisor = supervisor
        #: By tool-call id: the calls prepared before they ran. A side effect's entry
        #: is taken once (the same id again in the batch plans again).
        self.prepared: dict[str, Prepared] = {}
        #: By position in the batch: the calls' positions (the records' ``seq``).
        self.positions: dict[str, int] = {}
        #: By position: read-only outcomes not written yet. The first note wins (an
        #: abandoned read's answer was given; its late return changes nothing).
        self.reads: dict[int, NewEffect] = {}
        #: The last side effect's success, to be written with the next intent.
        self.outcome: TransitionRequest | None = None
        #: Effects whose intents went with the batch's plan (``prepare``), not yet
        #: sent: each is taken once, by its call's dispatch.
        self.begun: set[str] = set()
        #: The history the batch's calls were asked in, and their turns in it, counted
        #: once for the batch (a pair, replaced whole: calls read it from threads).
        self._turns: tuple[Sequence[Any], CallTurns] | None = None

    @property
    def node_watches(self) -> bool:
        """Whether the node watches the cancel signal while a call runs (its pooled
        reads, its supervised side effects), so a call's driver need not."""
        return self.defer or self.supervisor is not None

    # ------------------------------------------------------------- config
    def attach(self, config: RunnableConfig) -> RunnableConfig:
        """``config`` carrying this batch to every call (``ToolRuntime.config``)."""
        out: dict[str, Any] = dict(config)
        out["configurable"] = {**(config.get("configurable") or {}), BATCH_KEY: self}
        return cast(RunnableConfig, out)

    @staticmethod
    def attached(config: RunnableConfig | None) -> Batch | None:
        """The batch a call's config carries, if any."""
        found = ((config or {}).get("configurable") or {}).get(BATCH_KEY)
        return found if isinstance(found, Batch) else None

    # ------------------------------------------------------------ lookups
    def index_of(self, call: ToolCall) -> int:
        """The call's position in the batch (0 for a call on its own)."""
        return self.positions.get(str(call.get("id")), 0)

    def call_turn(self, history: Sequence[Any], call_id: str) -> int:
        """``identity.call_turn``, with the history counted once for the batch."""
        turns = self._turns
        if turns is None or turns[0] is not history:
            turns = self._turns = (history, CallTurns(history))
        return turns[1].of(call_id)

    def lookup(self, plan: CallPlan) -> Protocol[tuple[CallPlan, EffectRecord | None]]:
        """The call under the id of its own record, and that record if it has one."""
        entry = self.prepared.get(plan.call_id)
        if entry is not None and _same(entry.plan.call, plan.call):
            if not plan.fast_read:
                self.prepared.pop(plan.call_id, None)
            return replace(plan, own_id=entry.plan.own_id, key=entry.plan.key), entry.record
        thread_id = self.scope.thread_id
        own, rec = yield from own_record_steps(thread_id, plan.call, base_id=plan.base_id)
        if own != plan.ledger_id:
            plan = plan.under_own_id(thread_id, own)
        return plan, rec

    def prepare(
        self, reads: list[CallPlan], effects: list[CallPlan], *, begin: Sequence[CallPlan] = ()
    ) -> Protocol[None]:
        """Before the calls run: what the ledger holds for the reads (one read), and
        every side effect planned (one write).

        ``begin``: the side effects to go out first (one, or with ``effect_concurrency``
        those that go at once), when nothing stands between this write and their
        dispatch but their step's checkpoint (the run not stopped, no review, no read
        before them). Their intents go in the plan's write when that write creates
        their records; each call's dispatch then takes its own (``take_begun``), and
        sends it once the checkpoint is saved and the run still not stopped, or
        records it never sent.

        A side effect whose key another effect holds is left out: its own planning
        records and explains the clash.
        """
        scope = self.scope
        for plan in [*reads, *effects]:
            self.positions.setdefault(plan.call_id, plan.index)
        if reads:
            records = yield from ledger_call(
                Ledger.find_effects, scope.thread_id, [plan.ledger_id for plan in reads]
            )
            for plan in reads:
                rec = records.get(plan.ledger_id)
                if rec is not None and plan.needs_own_id(rec):
                    own, rec = yield from own_record_steps(
                        scope.thread_id, plan.call, moved=True, base_id=plan.base_id
                    )
                    plan = plan.under_own_id(scope.thread_id, own)
                self.prepared.setdefault(plan.call_id, Prepared(plan, rec))
        todo = list(effects)
        if begin and todo:
            entries, begun = yield from ledger_call(
                Ledger.plan_many_and_begin,
                thread_id=scope.thread_id,
                run_id=scope.run_id,
                items=[plan.new_effect() for plan in todo],
                begin=[plan.ledger_id for plan in begin],
                owner=scope.owner,
                actor=scope.owner,
            )
            self.begun.update(rec.effect_id for rec in begun)
            todo = yield from self._prepared_effects(todo, entries)
        while todo:
            # Nothing leaves the process before the first intent, whose commit waits for
            # the disk and so makes these rows durable first: this one need not wait.
            entries = yield from ledger_write_before_flush(
                Ledger.plan_many,
                thread_id=scope.thread_id,
                run_id=scope.run_id,
                items=[plan.new_effect() for plan in todo],
                owner=scope.owner,
                actor=scope.owner,
            )
            todo = yield from self._prepared_effects(todo, entries)

    def _prepared_effects(
        self, todo: list[CallPlan], entries: list[Any]
    ) -> Protocol[list[CallPlan]]:
        """The planned side effects kept for their calls; those whose id names another
        call's record and have none of their own yet, to plan in the next round."""
        scope = self.scope
        again: list[CallPlan] = []
        for plan, entry in zip(todo, entries, strict=True):
            if not isinstance(entry, tuple):
                continue
            rec, created = entry
            if not created and plan.needs_own_id(rec):
                # The id names another call's record: this call goes under its own,
                # found (an earlier pass, an approval) or planned in the next round.
                own, found = yield from own_record_steps(
                    scope.thread_id, plan.call, moved=True, base_id=plan.base_id
                )
                plan = plan.under_own_id(scope.thread_id, own)
                if found is None:
                    again.append(plan)
                    continue
                rec = found
            self.prepared[plan.call_id] = Prepared(plan, rec)
        return again

    # -------------------------------------------------------------- reads
    def note_read(self, plan: CallPlan, **fields: Any) -> Protocol[None]:
        """A read's outcome: kept for the batch's one write, or written now."""
        item = plan.new_effect(
            status=fields["status"],
            result=fields.get("result"),
            error=fields.get("error"),
            detail=fields.get("detail"),
        )
        if self.defer:
            self.reads.setdefault(plan.index, item)
            return
        yield from self._record_reads([item])

    def flush_reads(self) -> Protocol[None]:
        """Write the read-only outcomes kept so far (one statement)."""
        # Reads finish in any order; call order decides which one keeps a shared key.
        items = [self.reads[index] for index in sorted(self.reads)]
        self.reads = {}
        if items:
            yield from self._record_reads(items)

    def _record_reads(self, items: list[NewEffect]) -> Protocol[None]:
        # A read changed nothing outside: its record, lost in a database crash, costs
        # a second read on resume. The write need not wait for the disk, and the next
        # commit that does (an intent, the step's checkpoint) makes it durable first.
        scope = self.scope
        entries = yield from ledger_write_before_flush(
            Ledger.record_many,
            thread_id=scope.thread_id,
            run_id=scope.run_id,
            items=items,
            owner=scope.owner,
            actor=scope.owner,
        )
        # A read whose declared key another call holds keeps its outcome under the key
        # derived from this call, so no row is lost.
        clashed = [
            replace(
                item,
                idempotency_key=(
                    f"{item.idempotency_key}#duplicate:{scope.thread_id}:{item.tool_call_id}"
                ),
                detail={**(item.detail or {}), "duplicate_key": item.idempotency_key},
            )
            for item, entry in zip(items, entries, strict=True)
            if isinstance(entry, DuplicateIdempotencyKeyError)
        ]
        if clashed:
            yield from ledger_write_before_flush(
                Ledger.record_many,
                thread_id=scope.thread_id,
                run_id=scope.run_id,
                items=clashed,
                owner=scope.owner,
                actor=scope.owner,
            )

    # ------------------------------------------------------------ effects
    def check_supervisor(self) -> None:
        """Before a dispatch: nothing more goes out once the supervisor took over."""
        if self.supervisor is not None:
            self.supervisor.check()

    def take_begun(self, rec: EffectRecord) -> bool:
        """Whether ``rec``'s intent went with the batch's plan and is this call's to send
        (true once: a second call under the same id plans and replays as before)."""
        if rec.effect_id not in self.begun or rec.status is not EffectStatus.DISPATCHED:
            return False
        self.begun.discard(rec.effect_id)
        return True

    def abandon_begun(self, reason: str) -> Protocol[None]:
        """Record never sent (``not_applied``) the begun calls no dispatch has taken:
        their run's task was cancelled before they could go."""
        untaken, self.begun = sorted(self.begun), set()
        for effect_id in untaken:
            yield from never_sent_steps(effect_id, self.scope.owner, reason)

    def begin(self, plan: CallPlan, rec: EffectRecord) -> Protocol[EffectRecord | Exception]:
        """The durable intent (``dispatched``), or the ledger's refusal.

        The previous call's deferred outcome, if any, goes in the same round trip.
        """
        intent = TransitionRequest(
            effect_id=rec.effect_id,
            to=EffectStatus.DISPATCHED,
            actor=self.scope.owner,
            owner=self.scope.owner,
            detail={"idempotency_key": rec.idempotency_key},
        )
        if self.group is not None:
            try:
                return (yield from intent_write(GroupWrite(self.group, intent)))
            except IntentWriteCancelled as cancelled:
                cancelled.intent = _dispatched(cancelled.answer)
                raise
        outcome, self.outcome = self.outcome, None
        try:
            if outcome is None:
                return (
                    yield from intent_write(
                        LedgerCall(
                            Ledger.transition,
                            (intent.effect_id, intent.to),
                            {"actor": intent.actor, "owner": intent.owner, "detail": intent.detail},
                        )
                    )
                )
            written: Sequence[EffectRecord | Exception] = yield from intent_write(
                LedgerCall(Ledger.transition_many, ([outcome, intent],))
            )
        except (DispatchRefusedError, IllegalTransitionError) as exc:
            return exc
        except IntentWriteCancelled as cancelled:
            answer = cancelled.answer
            if outcome is not None and answer is not None:
                done, answer = answer
                if isinstance(done, LedgerError):
                    _outcome_lost(outcome, done)
            cancelled.intent = _dispatched(answer)
            raise
        done, begun = written
        if isinstance(done, LedgerError):
            _outcome_lost(outcome, done)
        return begun

    def succeeded(self, req: TransitionRequest) -> Protocol[None]:
        """A side effect's success: written with the next intent, or now."""
        if self.defer and self.group is None:
            self.outcome = req
            return
        if self.group is not None:
            done = yield from ask(GroupWrite(self.group, req))
            if isinstance(done, Exception):
                _outcome_lost(req, done)
            return
        yield from self._write_outcome(req)

    def flush_outcome(self) -> Protocol[None]:
        """Write the deferred outcome now (the loop ended, or the next step is no dispatch)."""
        outcome, self.outcome = self.outcome, None
        if outcome is not None:
            yield from self._write_outcome(outcome)

    def _write_outcome(self, req: TransitionRequest) -> Protocol[None]:
        # An outcome with no intent beside it need not wait for the disk: lost in a
        # database crash, the record stands dispatched and reconciliation settles it.
        (done,) = yield from ledger_write_before_flush(Ledger.transition_many, [req])
        if isinstance(done, LedgerError):
            _outcome_lost(req, done)

    def started(self) -> None:
        """A side effect was dispatched (the group's in-flight count)."""
        if self.group is not None:
            self.group.started()

    def finished(self) -> None:
        """A side effect returned, or its wait was given up."""
        if self.group is not None:
            self.group.finished()


def _same(prepared: ToolCall, call: ToolCall) -> bool:
    return prepared is call or (
        prepared.get("name") == call.get("name")
        and canonical(prepared.get("args")) == canonical(call.get("args"))
    )


def _dispatched(written: object) -> EffectRecord | None:
    """The record an intent write answered with, when it moved the call to
    ``dispatched`` (not a refusal, not an error)."""
    if isinstance(written, EffectRecord) and written.status is EffectStatus.DISPATCHED:
        return written
    return None


def _outcome_lost(req: TransitionRequest, error: Exception) -> None:
    """A success that could not be recorded (another writer overtook it, or the database
    failed): the record stands as it is, to be settled by reconciliation; say so loudly."""
    logger.warning(
        "could not record the outcome of %s as %s: %s", req.effect_id, req.to.value, error
    )


__all__ = ["BATCH_KEY", "Batch", "Prepared"]

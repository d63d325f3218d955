"""The sweeper's steps on effects no worker will come back for: reconcile what is in
flight or unknown, and compensate again what failed to undo
(``langgraph_cancel.sweeper``, steps 3 and 4)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from langgraph_cancel.compensation import compensate_effect
from langgraph_cancel.effects import spec_of
from langgraph_cancel.errors import IllegalTransitionError
from langgraph_cancel.nodes.reconcile import reconcile
from langgraph_cancel.nodes.settings import CancellationSettings
from langgraph_cancel.outbox import OUTBOX_OWNER_PREFIX
from langgraph_cancel.sweep_pass import SweepLeases, SweepPass, busy
from langgraph_cancel.sweep_summary import SweepAction, SweepActionKind
from langgraph_cancel.types import EffectRecord, EffectStatus, utcnow


@dataclass(frozen=True, slots=True)
class EffectSweep:
    """Settles effects across threads with no lease on them.

    Attributes:
        leases: The sweeper's leases (its ledger and identity).
        settings: The tools whose reconcile and compensate hooks to use.
        compensation_retry_after: A failed compensation is tried again once it is
            this old (seconds).
    """

    leases: SweepLeases
    settings: CancellationSettings
    compensation_retry_after: float

    def reconcile_effects(self, work: SweepPass) -> None:
        """Reconcile the threads whose effects are in flight, half-compensated, or
        ``unknown`` with a reconcile hook."""
        ledger = self.leases.ledger
        threads: dict[str, list[EffectRecord]] = {}
        for status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN, EffectStatus.COMPENSATING):
            for rec in ledger.effects_by_status(status):
                if self._reconcilable(rec):
                    threads.setdefault(rec.thread_id, []).append(rec)
        for thread_id in threads:
            if self.leases.leased(thread_id):
                continue
            if not work.claim(thread_id):
                return
            for result in reconcile(
                ledger, thread_id, tools=self.settings.all_tools(), owner=self.leases.owner
            ):
                if result.busy is not None:
                    work.actions.append(busy(thread_id, result.busy))
                for settled in result.effects:
                    effect = settled.effect
                    if settled.changed:
                        work.actions.append(
                            SweepAction.of_effect(
                                SweepActionKind.RECONCILED,
                                effect,
                                f"{effect.tool}: {settled.before.value} -> {effect.status.value}",
                            )
                        )
                for left in result.still_unknown:
                    work.actions.append(
                        SweepAction.of_effect(
                            SweepActionKind.LEFT_TO_OWNER,
                            left,
                            f"{left.tool}: {left.status.value}, owned by "
                            f"{left.owner or 'nobody named'}",
                            next_action=left.next_action,
                        )
                    )

    def retry_compensations(self, work: SweepPass) -> None:
        """Compensate again the failed compensations that are due and have a hook."""
        ledger = self.leases.ledger
        due = utcnow() - timedelta(seconds=self.compensation_retry_after)
        for rec in ledger.effects_by_status(EffectStatus.COMPENSATION_FAILED):
            tool = self.settings.tool(rec.tool)
            spec = None if tool is None else spec_of(tool)
            if spec is None or spec.compensate is None or rec.updated_at > due:
                continue
            if self.leases.leased(rec.thread_id) or not work.claim(rec.thread_id):
                continue
            with self.leases.holding(rec.thread_id, work) as held:
                if not held:
                    continue
                current = ledger.get_effect(rec.effect_id)
                if current.status is not EffectStatus.COMPENSATION_FAILED:
                    continue  # another sweeper retried it first
                try:
                    done = compensate_effect(ledger, current, spec, actor="sweeper")
                except IllegalTransitionError:
                    continue
                work.actions.append(
                    SweepAction.of_effect(
                        SweepActionKind.COMPENSATED,
                        done,
                        f"{rec.tool}: compensation tried again -> {done.status.value}",
                    )
                )

    def _reconcilable(self, rec: EffectRecord) -> bool:
        if rec.status is EffectStatus.DISPATCHED and (rec.owner or "").startswith(
            OUTBOX_OWNER_PREFIX
        ):
            return False  # sent by the outbox, which settles it (or takes it over when stale)
        if rec.status is not EffectStatus.UNKNOWN:
            return True  # in flight or half-compensated: settle or record unknown
        tool = self.settings.tool(rec.tool)
        return tool is not None and spec_of(tool).reconcile is not None


__all__ = ["EffectSweep"]

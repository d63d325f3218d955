"""The moving parts of ``langgraph-cancel demo``: where stop is pressed, and the world's truth.

The demo runs the seed scenario (:func:`langgraph_cancel.demo.graph.seed_script`)
against fake providers kept in their own SQLite file, presses stop from another
thread at one of the :data:`STEPS`, and compares the cancellation report with
what the providers actually did (invariant I6: the report's permanent effects
equal what the external systems did).

Steps (``--cancel-at``):

========== =====================================================================
``update`` the seed's moment (default): ``update_order(o-88)`` is in flight (its
           request hangs for ``--hang`` seconds), four calls are queued behind it.
           Result: 1 refund and 2 emails permanent, o-88 updated, 4 steps not run.
``refund`` ``issue_refund(o-88, 40.00)`` is in flight. Result: the refund is
           permanent (cancel waits for it), both emails not run.
``email``  the email to the customer is in flight. Result: the refund and that
           email are permanent, the email to finance not run.
``plan``   the model is writing turn 2 (nothing of it dispatched yet): the model
           stream is closed. Result: turn 1's refund and emails are permanent,
           nothing of turn 2 ran, the tokens after the stop are counted.
``approval`` the refund is 120.00 (over the approval threshold), so the turn waits
           for a human at the ``ApprovalGate``; stop is pressed while it waits.
           Result: nothing permanent, nothing dispatched: zero residue.
``budget`` nobody presses stop: the run has a budget of 6 tool calls, and turn 2
           (5 calls) would take it to 9. The breach requests the cancel itself.
           Result: turn 1's refund and emails are permanent, turn 2 not run, the
           report names the limit (``limit: tool_calls 9 > 6``).
``ordered`` the same request planned irreversible-last: reads, a hold on o-88 and
           a draft ticket first, then the refund (120.00, approval) and the
           emails. Stop is pressed while the refund waits for approval ("minute
           three"). Result: nothing permanent; the hold and the ticket undone.
``subagent`` the refund is made by a sub-agent on its own thread
           (:mod:`langgraph_cancel.demo.subagent`); stop is pressed on the parent's
           thread while the child's ``issue_refund(o-88, 40.00)`` is in flight.
           Result: the parent's report lists the child's refund as permanent,
           marked with the child's run; the child's email and the parent's
           wrap-up not run.
``window`` turn 1 also schedules a follow-up email to Dana with a send-at provider
           (delivered five minutes later); stop is pressed once it is scheduled,
           while the model writes turn 2. Result: the refund and 2 emails are
           permanent, the follow-up is revoked inside its delay window (the
           provider's truth: withdrawn, never delivered), nothing of turn 2 ran.
``none``   stop is never pressed: the run completes; every call ran.
========== =====================================================================
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from langgraph_cancel.demo.graph import CUSTOMER_EMAIL, ordered_script, seed_script
from langgraph_cancel.demo.services import Providers
from langgraph_cancel.limits import Limits
from langgraph_cancel.report import CancellationReport, ReportEffect
from langgraph_cancel.testing import ScriptedChatModel
from langgraph_cancel.types import EffectRecord, EffectStatus

DEFAULT_STEP = "update"
DEFAULT_HANG = 1.5
DEFAULT_THREAD = "refund-demo"


@dataclass(frozen=True)
class Step:
    """A moment at which the demo presses stop.

    Attributes:
        name: The ``--cancel-at`` value.
        when: When stop is pressed, in words.
        operation: The provider operation made to hang, so the call is in flight.
        tool: The tool whose call triggers the stop.
        match: Arguments the triggering call must have.
        status: The status the triggering call must be in.
        refund_amount: Turn 1's refund (over 100 needs approval).
        follow_up: Turn 1 also schedules a follow-up email (``schedule_email``).
        slow_model: The model writes slowly (the stop lands while it writes).
        expect: What the report should say, in words.
        ordered: Play the irreversible-last plan (``ordered_script``), not the seed's.
        limits: The run's budget, if any (a breach stops it, not the stop button).
        compensate: Undo committed reversible effects when the run is cancelled.
        in_child: The run is the sub-agent scenario: the triggering call is the
            child's, stop is pressed on the parent's thread.
    """

    name: str
    when: str
    operation: str | None = None
    tool: str | None = None
    match: Mapping[str, Any] = field(default_factory=dict)
    status: EffectStatus = EffectStatus.DISPATCHED
    refund_amount: float = 40.0
    follow_up: bool = False
    slow_model: bool = False
    expect: str = ""
    ordered: bool = False
    limits: Limits | None = None
    compensate: bool = False
    in_child: bool = False

    def script(self) -> list[AIMessage]:
        """The model's turns for this step."""
        if self.ordered:
            return ordered_script(self.refund_amount)
        return seed_script(self.refund_amount, follow_up=self.follow_up)


STEPS: dict[str, Step] = {
    step.name: step
    for step in (
        Step(
            "update",
            "while update_order(o-88) is in flight, four calls queued behind it",
            operation="update_order",
            tool="update_order",
            match={"order_id": "o-88"},
            expect="1 refund and 2 emails permanent; o-88 updated; 4 steps not run",
        ),
        Step(
            "refund",
            "while issue_refund(o-88, 40.00) is in flight",
            operation="refund",
            tool="issue_refund",
            match={"order_id": "o-88"},
            expect="the refund is permanent; both emails not run",
        ),
        Step(
            "email",
            "while the email to the customer is in flight",
            operation="send_email",
            tool="send_email",
            match={"to": CUSTOMER_EMAIL},
            expect="the refund and one email are permanent; the email to finance not run",
        ),
        Step(
            "plan",
            "while the model is writing turn 2, before any of its calls exist",
            slow_model=True,
            expect="the refund and 2 emails are permanent; nothing of turn 2 ran",
        ),
        Step(
            "approval",
            "while the refund of 120.00 waits for a human's approval",
            tool="issue_refund",
            status=EffectStatus.PENDING_APPROVAL,
            refund_amount=120.0,
            expect="nothing permanent, nothing dispatched: zero residue",
        ),
        Step(
            "budget",
            "never by hand: the run's budget of 6 tool calls stops it",
            limits=Limits(max_tool_calls=6),
            expect="the refund and 2 emails are permanent; turn 2 not run; "
            "the report names the tool_calls limit",
        ),
        Step(
            "ordered",
            "while the refund of 120.00, planned last, waits for a human's approval",
            tool="issue_refund",
            status=EffectStatus.PENDING_APPROVAL,
            refund_amount=120.0,
            ordered=True,
            compensate=True,
            expect="nothing permanent; the hold on o-88 and the draft ticket undone",
        ),
        Step(
            "subagent",
            "at the parent while its refunds sub-agent's issue_refund(o-88, 40.00) is in flight",
            operation="refund",
            tool="issue_refund",
            match={"order_id": "o-88"},
            expect="the child's refund is permanent, marked with the child run; its email "
            "not run; the parent stops before its wrap-up",
            in_child=True,
        ),
        Step(
            "window",
            "while the follow-up email waits in its five-minute delay window",
            tool="schedule_email",
            status=EffectStatus.SCHEDULED,
            follow_up=True,
            slow_model=True,
            expect="the refund and 2 emails permanent; the follow-up email revoked, never sent",
        ),
        Step("none", "never: the run completes", expect="every call ran; nothing dropped"),
    )
}


def reset_providers(path: str | os.PathLike[str]) -> Providers:
    """A fresh providers' file at ``path`` (the previous demo's world is deleted)."""
    base = Path(path)
    for suffix in ("", "-wal", "-shm", "-journal"):
        candidate = base.with_name(base.name + suffix)
        if candidate.exists():
            candidate.unlink()
    return Providers(base)


def arm(step: Step, providers: Providers, hang: float) -> None:
    """Make the step's provider request hang, so the call is in flight when stop is pressed."""
    providers.clear_faults()
    if step.operation is not None and hang > 0:
        providers.set_fault(step.operation, f"hang:{hang:g}", times=1)


def trigger(step: Step, effects: Iterable[EffectRecord]) -> EffectRecord | None:
    """The call whose state means "press stop now" (in flight, or awaiting approval)."""
    if step.tool is None:
        return None
    for rec in effects:
        if (
            rec.tool == step.tool
            and rec.status is step.status
            and all(rec.args.get(k) == v for k, v in step.match.items())
        ):
            return rec
    return None


def refund_keys(step: Step) -> list[str]:
    """The ledger-wide idempotency keys of the script's refunds (one per order and amount)."""
    from langgraph_cancel.demo.tools import refund_key

    return [
        refund_key(call["args"])
        for turn in step.script()
        for call in turn.tool_calls
        if call["name"] == "issue_refund"
    ]


def demo_model(step: Step, started: threading.Event) -> ScriptedChatModel:
    """The seed's scripted model; for ``plan`` it writes slowly and flags turn 2's start."""
    script = step.script()

    def turn(messages: list[BaseMessage]) -> AIMessage:
        replies = sum(1 for m in messages if isinstance(m, AIMessage))
        if replies == 1:
            started.set()
        return script[min(replies, len(script) - 1)]

    return ScriptedChatModel(
        [turn], on_exhausted="repeat_last", delay_per_token=0.1 if step.slow_model else 0.0
    )


# ----------------------------------------------------------------------- truth
_EXPECT_APPLIED = ("permanent", "reversible_committed", "compensated", "compensation_failed")
_EXPECT_NOT_APPLIED = ("not_run", "rejected")


@dataclass
class TruthCheck:
    """How the report compares with what the providers did.

    Attributes:
        agrees: True when every applied key is in the report as applied, and
            nothing the report says did not run reached a provider.
        applied: What the providers applied, by kind (``refunds``, ``emails``...).
        problems: Each disagreement, in words.
        line: One sentence for people.
    """

    agrees: bool
    applied: dict[str, int]
    problems: list[str]
    line: str


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _effects(report: CancellationReport, buckets: Sequence[str]) -> list[ReportEffect]:
    out: list[ReportEffect] = []
    for bucket in buckets:
        out.extend(getattr(report, bucket))
    return out


#: The providers' record kinds a truth check counts: the key in ``Providers.truth()``,
#: the words for them, and one of them.
_APPLIED_KINDS: tuple[tuple[str, str, str], ...] = (
    ("refunds", "refunds", "refund"),
    ("emails", "emails", "email"),
    ("updates", "order updates", "order update"),
    ("restores", "restores", "order restore"),
    ("tickets", "tickets", "ticket"),
    ("messages", "chat messages", "chat message"),
)


def _key_problems(report: CancellationReport, keys: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Where the report and the providers' idempotency keys disagree."""

    def executions(key: str) -> int:
        return int(keys.get(key, {}).get("executions", 0))

    problems: list[str] = []
    applied = _effects(report, _EXPECT_APPLIED)
    for effect in applied:
        if executions(effect.idempotency_key) != 1:
            problems.append(
                f"{effect.tool} {effect.idempotency_key} is reported {effect.status} but the "
                f"provider applied it {executions(effect.idempotency_key)} times"
            )
    for effect in _effects(report, _EXPECT_NOT_APPLIED):
        if executions(effect.idempotency_key):
            problems.append(
                f"{effect.tool} {effect.idempotency_key} is reported not run but a provider "
                "applied it"
            )
    reported = {effect.idempotency_key for effect in applied}
    unknown = {effect.idempotency_key for effect in report.unknown}
    for key, info in keys.items():
        if key.startswith("compensate:") or not info.get("executions"):
            continue
        if key not in reported and key not in unknown:
            problems.append(
                f"the provider applied {info.get('operation')} {key}, not in the report"
            )
    return problems


def _send_at_problems(report: CancellationReport, delivered: set[str]) -> list[str]:
    """Where the report and what the send-at provider delivered disagree."""
    problems = [
        f"{effect.tool} {effect.idempotency_key} is reported revoked but was delivered"
        for effect in report.revoked
        if effect.idempotency_key in delivered
    ]
    held_by_report = {
        effect.idempotency_key for effect in report.permanent + report.scheduled + report.unknown
    }
    problems.extend(
        f"the send-at provider delivered {key}, not in the report as permanent"
        for key in sorted(delivered - held_by_report)
    )
    return problems


def _what_applied(truth: Mapping[str, Any], applied: Mapping[str, int], withdrawn: int) -> str:
    """What the providers applied, in words: ``1 refund, 2 emails (o-88 -> status=...)``."""
    words = {label: one for _key, label, one in _APPLIED_KINDS}
    done = [_plural(count, words[label]) for label, count in applied.items() if count]
    updates = [
        f"{update['order_id']} -> "
        + ", ".join(f"{name}={value}" for name, value in sorted(update["fields"].items()))
        for update in truth.get("updates", [])
    ]
    what = ", ".join(done) if done else "nothing"
    if updates:
        what += f" ({'; '.join(updates)})"
    if withdrawn:
        what += f"; the send-at provider withdrew {_plural(withdrawn, 'scheduled email')}"
        what += " before delivery"
    return what


def check_truth(
    report: CancellationReport,
    truth: Mapping[str, Any],
    send_at: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> TruthCheck:
    """Compare a report with the providers' truth (``Providers.truth()``), and with the
    send-at provider's (``SendAtMail.truth()``) when given."""
    scheduled_mail = send_at or {}
    delivered = {record["key"] for record in scheduled_mail.get("delivered", [])}
    withdrawn = {record["key"] for record in scheduled_mail.get("revoked", [])}
    problems = _key_problems(report, truth.get("keys", {}))
    problems += _send_at_problems(report, delivered)
    applied = {label: len(truth.get(key, [])) for key, label, _one in _APPLIED_KINDS}
    not_run = len(report.not_run) + len(report.rejected)
    if problems:
        line = f"Providers' truth DISAGREES with the report: {'; '.join(problems)}"
    else:
        line = (
            f"Providers' truth agrees: they applied {_what_applied(truth, applied, len(withdrawn))}"
        )
        if not_run:
            line += f"; none of the {not_run} not-run calls reached a provider"
        if report.unknown:
            line += f"; {len(report.unknown)} unknown outcome(s) still to settle"
    return TruthCheck(not problems, applied, problems, line + ".")


def tools_in(report: CancellationReport, bucket: str) -> Counter[str]:
    """How many calls of each tool a report bucket holds."""
    return Counter(e.tool for e in getattr(report, bucket))


__all__ = [
    "DEFAULT_HANG",
    "DEFAULT_STEP",
    "DEFAULT_THREAD",
    "STEPS",
    "Step",
    "TruthCheck",
    "arm",
    "check_truth",
    "demo_model",
    "refund_keys",
    "reset_providers",
    "tools_in",
    "trigger",
]

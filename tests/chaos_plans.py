"""Chaos plans: the script of one thread, and the chaos to inject into it.

A *plan* (:class:`Plan`) is a script for one thread: the model's turns (each a
batch of tool calls of mixed effect kinds), the tool node's concurrency, the
reviewer's answers to approval interrupts, provider faults, and the chaos to
inject: a cancel (before the start, at a model turn, while a tool call is in
flight, or while an approval is pending), a simulated crash inside a tool (an
exception no handler catches, like a process dying mid-call), or the
invocation's asyncio task being cancelled (what a LangGraph server does on
``runs.cancel``).

Also here: the chaos agent's tools by name and effect kind, the providers'
operations behind them, the arguments the model gives each call
(:func:`call_args`) and a reviewer's edits of them (:func:`edited_args`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langgraph_cancel import EffectKind, Limits

#: Seconds the graph waits for an in-flight call once its run is cancelled.
CANCEL_TIMEOUT = 3.0

ORDERS = ("o-88", "o-91", "o-93", "o-97", "o-102")
IRREVERSIBLE_OPS = frozenset({"refund", "send_email", "post_message"})
REVERSIBLE_OPS = frozenset({"create_ticket"})
UNDO_PREFIX = "undo:"
#: How the ledger marks a key an effect gave to another (``#released-to:<effect id>``).
RELEASED = "#released-to:"

#: The chaos agent's tools: name -> (kind, approval rule in words).
TOOL_KINDS: dict[str, EffectKind] = {
    "cx_lookup": EffectKind.READ_ONLY,  # plain read
    "cx_check": EffectKind.READ_ONLY,  # a read that always needs approval
    "cx_ticket": EffectKind.REVERSIBLE,  # approval when priority > 5; undo: close the ticket
    "cx_email": EffectKind.IRREVERSIBLE,  # pre-approved; reconcile by key
    "cx_refund": EffectKind.IRREVERSIBLE,  # approval when amount > 100; key from args
    "cx_post": EffectKind.IRREVERSIBLE,  # always approval; no reconcile, not retry-safe
}
TOOL_NAMES: tuple[str, ...] = tuple(TOOL_KINDS)
#: The providers' operation behind each side-effecting tool.
TOOL_OPERATION = {
    "cx_ticket": "create_ticket",
    "cx_email": "send_email",
    "cx_refund": "refund",
    "cx_post": "post_message",
}


class Crash(BaseException):
    """A simulated process death inside a tool: nothing in the library may catch it."""


# ------------------------------------------------------------------------------ plans
@dataclass(frozen=True)
class CallSpec:
    """One tool call of a turn.

    ``variant``: 0 plain; 1 the approval-needing form (priority 9, amount 150);
    2 a call the provider refuses (unknown order, refund over the order total);
    3 (``cx_lookup`` only) the same arguments every time, as a looping model asks.
    ``ref``: a refund's reference (its declared idempotency key); default one of
    its own, ``r-c<n>``. A later message naming an earlier ref asks for the same
    refund again.
    """

    tool: str
    variant: int = 0
    ref: str | None = None


@dataclass(frozen=True)
class Inject:
    """One piece of chaos.

    ``what``: ``cancel`` (``request_cancel`` from another thread), ``crash``
    (:class:`Crash` raised in the tool) or ``kill_task`` (the invocation's
    asyncio task is cancelled). ``where``: ``start`` (before the first node),
    ``turn`` (while the model produces turn ``at``), ``tool`` (call ``c<at>``,
    ``phase`` ``before`` or ``after`` the provider request), ``approval``
    (approval interrupt number ``at``; ``phase`` ``answer`` resumes with the
    decisions, ``none`` resumes without) or ``hook`` (call number ``at`` of the
    ``phase`` hook: ``reconcile`` or ``compensate``; only crashes go there).
    """

    what: str
    where: str
    at: int = 0
    phase: str = "before"


@dataclass(frozen=True)
class Plan:
    """A script for one thread, and the chaos to throw at it."""

    turns: tuple[tuple[CallSpec, ...], ...]
    effect_concurrency: int = 1
    decisions: tuple[str, ...] = ()
    injections: tuple[Inject, ...] = ()
    faults: tuple[tuple[str, str], ...] = ()
    backend: str = "memory"
    use_async: bool = False
    compensate_on_cancel: bool = False
    reconcile_interactive: bool = True
    #: How many stop requests race each other at each cancel point (I4: one wins).
    racing_cancels: int = 1
    #: After a crash, two workers resume the thread at once (sync plans).
    racing_resumes: bool = False
    #: The run's budget and deadline (``add_cancellation(limits=...)``), if any.
    limits: Limits | None = None
    #: The model reports token usage (``usage_metadata``), for token budgets.
    report_usage: bool = False

    @property
    def n_calls(self) -> int:
        return sum(len(turn) for turn in self.turns)

    def numbered(self, base: int = 0) -> list[list[tuple[int, CallSpec]]]:
        """The turns with each call's global number ``n`` (its id is ``c<n>``), from ``base``."""
        out: list[list[tuple[int, CallSpec]]] = []
        call_number = base
        for turn in self.turns:
            row = []
            for spec in turn:
                row.append((call_number, spec))
                call_number += 1
            out.append(row)
        return out


def call_args(spec: CallSpec, call_number: int) -> dict[str, Any]:
    """The arguments the model gives call ``c<call_number>``; unique per call (``tag``)."""
    tag = f"c{call_number}"
    order = ORDERS[call_number % len(ORDERS)]
    if spec.tool == "cx_lookup":
        if spec.variant == 3:  # the same lookup every time (a looping model)
            return {"order_id": ORDERS[0], "tag": "again"}
        return {"order_id": "o-404" if spec.variant == 2 else order, "tag": tag}
    if spec.tool == "cx_check":
        return {"order_id": order, "tag": tag}
    if spec.tool == "cx_ticket":
        return {
            "order_id": "o-404" if spec.variant == 2 else order,
            "subject": f"ticket {tag}",
            "priority": 9 if spec.variant == 1 else 1,
            "tag": tag,
        }
    if spec.tool == "cx_email":
        return {"to": f"{tag}@example.com", "subject": f"mail {tag}", "tag": tag}
    if spec.tool == "cx_refund":
        amount = {0: 5.0, 1: 150.0, 2: 5000.0}[spec.variant]
        return {"order_id": "o-97", "amount": amount, "ref": spec.ref or f"r-{tag}", "tag": tag}
    if spec.tool == "cx_post":
        return {"channel": "#ops", "text": f"post {tag}", "tag": tag}
    raise ValueError(f"unknown chaos tool {spec.tool!r}")


def edited_args(name: str, args: dict[str, Any], *, valid: bool) -> dict[str, Any]:
    """A reviewer's edit of a call: a valid one, or one the gate must refuse."""
    new = dict(args)
    if name == "cx_refund":
        if valid:
            new["amount"] = float(args["amount"]) + 1.0
        else:
            new["amount"] = "a lot"
    elif name == "cx_ticket":
        if valid:
            new["subject"] = f"{args['subject']} (edited)"
        else:
            new["priority"] = "urgent"
    elif name == "cx_post":
        if valid:
            new["text"] = f"{args['text']} (edited)"
        else:
            new["text"] = 5
    elif name == "cx_check":
        if valid:
            new["order_id"] = "o-93"
        else:
            new["order_id"] = None
    elif valid:
        new["tag"] = f"{args.get('tag')}-edited"
    else:
        new["tag"] = ["not", "a", "string"]
    return new

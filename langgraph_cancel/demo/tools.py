"""The refund agent's tools, each classified by what it does to the world.

| tool | kind | approval | undo / reconcile |
|---|---|---|---|
| ``lookup_order`` | read_only | no | - |
| ``search_policy`` | read_only | no | - |
| ``update_order`` | reversible | no | ``restore_order`` / ``find_update`` |
| ``create_ticket`` | reversible | no | ``close_ticket`` / ``find_ticket`` |
| ``issue_refund`` | irreversible | amount > 100 | - / ``find_refund`` |
| ``send_email`` | irreversible | no (pre-approved notifications) | - / ``find_email`` |
| ``notify_slack`` | irreversible | yes (the default for irreversible) | - / ``find_message`` |
| ``schedule_email`` | irreversible, 5 min delay window | no | revoke: ``SendAtMail.revoke`` |

Every side-effecting tool reads this call's key with ``idempotency_key()`` and
forwards it to the provider, which applies a key at most once. Reconcile hooks
ask the provider what became of a key; compensate hooks undo a committed call
with a key of their own (``compensate:<key>``), so the undo is idempotent too.

The providers' file comes from ``$REFUND_AGENT_PROVIDERS_DB`` (default
``./refund-providers.db``) or :func:`set_providers_path`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from langchain_core.tools import BaseTool, tool

from langgraph_cancel.demo.send_at import SendAtMail
from langgraph_cancel.demo.services import Providers, default_path
from langgraph_cancel.effects import Outcome, effect, idempotency_key
from langgraph_cancel.types import EffectKind

_providers_path: str | None = None


def set_providers_path(path: str | os.PathLike[str] | None) -> None:
    """Point the tools at a providers' file (``None``: back to the environment/default).

    Args:
        path: The SQLite file of the fake external systems.
    """
    global _providers_path
    _providers_path = None if path is None else os.fspath(path)


def providers_path() -> str:
    """The providers' file the tools use right now."""
    return _providers_path or default_path()


def providers() -> Providers:
    """The fake external systems the tools talk to (see :func:`providers_path`)."""
    return Providers(providers_path())


def send_at_mail() -> SendAtMail:
    """The send-at email provider, in the same providers' file (tables of its own)."""
    return SendAtMail(providers_path())


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def parse_result(result: Any) -> dict[str, Any] | None:
    """Turn what the ledger recorded for a call back into the provider's record.

    Args:
        result: The ToolMessage content (a JSON string), a dict, a message
            with ``.content``, or ``None``.

    Returns:
        The decoded dict, or ``None`` when nothing usable was recorded.
    """
    content = getattr(result, "content", result)
    if isinstance(content, bytes):
        content = content.decode()
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except json.JSONDecodeError:
            return None
    if isinstance(content, Mapping):
        return dict(content)
    return None


def compensation_key(key: str) -> str:
    """The idempotency key of the compensation of the effect keyed ``key``."""
    return f"compensate:{key}"


def _reconciler(
    what: str, find: Callable[[Providers, str], dict[str, Any] | None]
) -> Callable[[str, dict[str, Any]], Outcome]:
    def reconcile(key: str, args: dict[str, Any]) -> Outcome:
        systems = providers()
        found = find(systems, key)
        if found is not None:
            return Outcome.committed(_dump(found))
        if systems.pending(key):
            return Outcome.unknown(f"the provider is still processing {what} {key!r}")
        return Outcome.not_applied(f"the provider has no {what} with key {key!r}")

    reconcile.__name__ = f"reconcile_{what.replace(' ', '_')}"
    reconcile.__doc__ = f"Ask the provider whether the {what} keyed ``key`` happened."
    return reconcile


reconcile_refund = _reconciler("refund", Providers.find_refund)
reconcile_email = _reconciler("email", Providers.find_email)
reconcile_update = _reconciler("order update", Providers.find_update)
reconcile_ticket = _reconciler("ticket", Providers.find_ticket)
reconcile_message = _reconciler("chat message", Providers.find_message)


def refund_key(args: Mapping[str, Any]) -> str:
    """``refund:<order_id>:<amount>``: one refund per order and amount, whoever retries.

    The amount is normalised to two decimals so ``120`` and ``120.0`` are the same key.
    """
    return f"refund:{args['order_id']}:{float(args['amount']):.2f}"


def refund_needs_approval(args: Mapping[str, Any]) -> bool:
    """Refunds over 100 (in the order's currency) need a human's approval."""
    return float(args["amount"]) > 100


def undo_update_order(key: str, args: dict[str, Any], result: Any) -> None:
    """Compensate ``update_order``: put back the values the update replaced.

    Uses the recorded result (``previous`` and ``fields``), or asks the provider
    when nothing usable was recorded. Refuses (raises) rather than clobber a
    change someone made after the update.

    Raises:
        RuntimeError: The provider has no update under ``key``.
        RestoreConflict: The order changed since the update.
    """
    systems = providers()
    record = parse_result(result)
    if record is None or "previous" not in record:
        record = systems.find_update(key)
    if record is None:
        raise RuntimeError(f"no order update recorded under key {key!r}; nothing known to undo")
    systems.restore_order(
        str(record["order_id"]),
        record["previous"],
        compensation_key(key),
        expected=record["fields"],
    )


def undo_create_ticket(key: str, args: dict[str, Any], result: Any) -> None:
    """Compensate ``create_ticket``: close the ticket it opened.

    Raises:
        RuntimeError: The provider has no ticket under ``key``.
    """
    systems = providers()
    record = parse_result(result)
    if record is None or "ticket_id" not in record:
        record = systems.find_ticket(key)
    if record is None:
        raise RuntimeError(f"no ticket recorded under key {key!r}; nothing known to close")
    systems.close_ticket(
        str(record["ticket_id"]),
        compensation_key(key),
        reason="run cancelled: ticket opened by the agent withdrawn",
    )


@effect(EffectKind.READ_ONLY)
@tool(parse_docstring=True)
def lookup_order(order_id: str) -> str:
    """Look up an order: customer, email, total, currency, status and note.

    Args:
        order_id: The order id, for example "o-88".
    """
    return _dump(providers().get_order(order_id))


@effect(EffectKind.READ_ONLY)
@tool(parse_docstring=True)
def search_policy(query: str) -> str:
    """Search the support policies (refunds, damaged items, notifications, shipping).

    Returns the best matching policies with their full text.

    Args:
        query: What you want to know, in a few words.
    """
    return _dump(providers().search_policy(query))


@effect(
    EffectKind.IRREVERSIBLE,
    idempotency_key=refund_key,
    reconcile=reconcile_refund,
    requires_approval=refund_needs_approval,
    retry_safe=True,
    permanence="A refund cannot be recalled; correcting it takes a new charge.",
)
@tool(parse_docstring=True)
def issue_refund(order_id: str, amount: float) -> str:
    """Refund part or all of an order to the customer's original payment method.

    This is permanent: an issued refund cannot be recalled. Refunds over 100
    need a human's approval before they are issued. The same order and amount
    is refunded at most once.

    Args:
        order_id: The order to refund, for example "o-88".
        amount: The amount to refund, in the order's currency.
    """
    return _dump(providers().refund(order_id, amount, idempotency_key()))


@effect(
    EffectKind.IRREVERSIBLE,
    reconcile=reconcile_email,
    requires_approval=False,
    retry_safe=True,
    permanence="A sent email cannot be unsent.",
)
@tool(parse_docstring=True)
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email to a customer (notification emails are pre-approved).

    This is permanent: a sent email cannot be recalled.

    Args:
        to: The recipient's email address.
        subject: The subject line.
        body: The plain-text message.
    """
    return _dump(providers().send_email(to, subject, body, idempotency_key()))


@effect(
    EffectKind.REVERSIBLE,
    reconcile=reconcile_update,
    compensate=undo_update_order,
    retry_safe=True,
)
@tool(parse_docstring=True)
def update_order(order_id: str, status: str, note: str = "") -> str:
    """Change an order's status (and optionally its internal note).

    Returns the update, including the previous values.

    Args:
        order_id: The order to change, for example "o-88".
        status: The new status, for example "refunded" or "on_hold".
        note: An internal note to store on the order; empty leaves the note as is.
    """
    fields: dict[str, Any] = {"status": status}
    if note:
        fields["note"] = note
    return _dump(providers().update_order(order_id, fields, idempotency_key()))


@effect(
    EffectKind.REVERSIBLE,
    reconcile=reconcile_ticket,
    compensate=undo_create_ticket,
    retry_safe=True,
)
@tool(parse_docstring=True)
def create_ticket(order_id: str, subject: str, body: str) -> str:
    """Open a support ticket for the warehouse or finance team about an order.

    Args:
        order_id: The order the ticket is about.
        subject: A one-line summary.
        body: What the team needs to know or do.
    """
    return _dump(providers().create_ticket(order_id, subject, body, idempotency_key()))


@effect(
    EffectKind.IRREVERSIBLE,
    reconcile=reconcile_message,
    retry_safe=True,
    permanence="A posted message has been seen; deleting it later does not unsend it.",
)
@tool(parse_docstring=True)
def notify_slack(channel: str, text: str) -> str:
    """Post a message to an internal chat channel, for example "#refunds".

    This is permanent once posted and needs approval first.

    Args:
        channel: The channel, for example "#refunds".
        text: The message.
    """
    return _dump(providers().post_message(channel, text, idempotency_key()))


#: How long a scheduled email stays revocable: the provider delivers it after that.
EMAIL_DELAY = timedelta(minutes=5)


def revoke_scheduled_email(key: str, args: dict[str, Any], handle: Any) -> bool:
    """Withdraw the email scheduled under ``key``; False once the provider delivered it."""
    return send_at_mail().revoke(key)


def reconcile_scheduled_email(key: str, args: dict[str, Any]) -> Outcome:
    """Ask the send-at provider whether it accepted the email keyed ``key``."""
    found = send_at_mail().find(key)
    if found is None:
        return Outcome.not_applied(f"the send-at provider has no email with key {key!r}")
    return Outcome.committed(_dump(found))


@effect(
    EffectKind.IRREVERSIBLE,
    delay=EMAIL_DELAY,
    revoke=revoke_scheduled_email,
    reconcile=reconcile_scheduled_email,
    requires_approval=False,
    retry_safe=True,
)
@tool(parse_docstring=True)
def schedule_email(to: str, subject: str, body: str) -> str:
    """Schedule an email to a customer; it is delivered five minutes later.

    Until then stopping the run withdraws it; after that it is permanent.

    Args:
        to: The recipient's email address.
        subject: The subject line.
        body: The plain-text message.
    """
    handle = send_at_mail().schedule(
        to, subject, body, EMAIL_DELAY.total_seconds(), idempotency_key()
    )
    return _dump(handle)


#: Every tool of the refund agent, reads first.
TOOLS: list[BaseTool] = [
    lookup_order,
    search_policy,
    update_order,
    create_ticket,
    issue_refund,
    send_email,
    notify_slack,
    schedule_email,
]

__all__ = [
    "EMAIL_DELAY",
    "TOOLS",
    "compensation_key",
    "create_ticket",
    "issue_refund",
    "lookup_order",
    "notify_slack",
    "parse_result",
    "providers",
    "providers_path",
    "reconcile_email",
    "reconcile_message",
    "reconcile_refund",
    "reconcile_scheduled_email",
    "reconcile_ticket",
    "reconcile_update",
    "refund_key",
    "refund_needs_approval",
    "revoke_scheduled_email",
    "schedule_email",
    "search_policy",
    "send_at_mail",
    "send_email",
    "set_providers_path",
    "undo_create_ticket",
    "undo_update_order",
    "update_order",
]

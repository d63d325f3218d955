"""What the fake providers refuse: known outcomes, with nothing applied."""

from __future__ import annotations


class ProviderError(Exception):
    """A provider refused a request (a known outcome: nothing was applied)."""


class OrderNotFound(ProviderError, LookupError):
    """No order with that id."""


class TicketNotFound(ProviderError, LookupError):
    """No ticket with that id."""


class RefundRejected(ProviderError, ValueError):
    """The payments provider refused the refund (amount invalid or over the total)."""


class RestoreConflict(ProviderError):
    """The order changed since the update being undone; restoring would clobber it."""


class IdempotencyKeyReused(ProviderError, ValueError):
    """The key was already used for a different request."""


__all__ = [
    "IdempotencyKeyReused",
    "OrderNotFound",
    "ProviderError",
    "RefundRejected",
    "RestoreConflict",
    "TicketNotFound",
]

"""SQL of the outbox: the held calls whose delay window has passed, and the ones a
worker left in flight.

Statements use psycopg's ``%(name)s`` placeholders; ``to_sqlite`` rewrites them.
Both probes use the partial index ``lgc_effects_release`` (``status = 'scheduled'``).
"""

from __future__ import annotations

from langgraph_cancel.ledger.sql import EFFECT_COLUMNS

#: The runs whose held calls the outbox leaves alone: a stop owns them.
_STOPPING = "('cancel_requested', 'cancelling', 'cancelled')"

# Held calls (scheduled, never dispatched) due for release, oldest first, unless
# their run is being stopped (the stop revokes them).
SELECT_DUE_HELD = f"""
SELECT {EFFECT_COLUMNS} FROM lgc_effects
WHERE status = 'scheduled' AND dispatched_at IS NULL AND release_at <= %(now)s
    AND (SELECT r.status FROM lgc_runs r WHERE r.run_id = lgc_effects.run_id)
        NOT IN {_STOPPING}
ORDER BY release_at, effect_id LIMIT %(limit)s"""

# Calls their provider holds whose window has passed: to record as permanent.
SELECT_PASSED_PROVIDER_HELD = f"""
SELECT {EFFECT_COLUMNS} FROM lgc_effects
WHERE status = 'scheduled' AND dispatched_at IS NOT NULL AND release_at <= %(now)s
ORDER BY release_at, effect_id LIMIT %(limit)s"""

# Calls the outbox released and nobody settled: the worker that sent them died (or
# is still waiting) since ``%(stale_before)s``.
SELECT_STALE_RELEASED = f"""
SELECT {EFFECT_COLUMNS} FROM lgc_effects
WHERE status = 'dispatched' AND owner LIKE 'outbox:%%' AND updated_at < %(stale_before)s
ORDER BY updated_at, effect_id LIMIT %(limit)s"""

__all__ = ["SELECT_DUE_HELD", "SELECT_PASSED_PROVIDER_HELD", "SELECT_STALE_RELEASED"]

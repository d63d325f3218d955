"""The names of the nodes ``add_cancellation`` adds to a graph.

They live below the graph layer so that a node can route to another by name
(``Command(goto=CANCEL_NODE)``) without importing the builder that adds it.
"""

from __future__ import annotations

#: The node every guarded node routes to once a stop is seen: it drains, settles,
#: reports and makes the run's one terminal transition.
CANCEL_NODE = "cancel"
#: The entry node that settles unknown outcomes before the graph goes on.
RECONCILE_NODE = "reconcile"

__all__ = ["CANCEL_NODE", "RECONCILE_NODE"]

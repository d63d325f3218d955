"""How one tool call runs safely: the effect protocol on ``ToolNode``'s tool-call seam.

This layer sits below the nodes, the graph wiring and the middleware, which all
use it: call identity (``identity``), answers from records (``answers``),
settling unknown outcomes (``settlement``), the per-call protocol (``steps``,
``protocol``, ``review``) and its two drivers (``drive``, ``drivers``), the
batch's shared ledger work (``batch``, ``group``, ``supervision``) and the
interceptor that puts it on the seam (``interceptor``).
"""

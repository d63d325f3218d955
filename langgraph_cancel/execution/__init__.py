"""How one tool call runs safely: the effect protocol on ``ToolNode``'s tool-call seam.

This layer sits below the nodes, the graph wiring and the middleware, which all
use it. The per-call protocol, one module per step: the entry and router
(``protocol``), what every step acts with (``context``), the cancel check
(``cancel_check``), approval where the call stands (``approval``, with the
review payloads in ``review``), the intent (``intent``), the dispatch
(``dispatch``) and its attempts (``attempts``), the outcome (``outcome``) and
the classification of a call that raised (``failure``), reads (``reads``),
malformed calls (``malformed``), and what the handler is watched for on its way
(``observed``). Around it: call identity (``identity``),
answers from records (``answers``), settling unknown outcomes
(``settlement``), the steps as values (``steps``) and their two drivers
(``drive``, ``drivers``), the batch's shared ledger work (``plan``, ``batch``,
``group``, ``supervision``), the interceptor that puts it on the seam
(``interceptor``), and the tools classified by name on their way to it (``served``).
"""

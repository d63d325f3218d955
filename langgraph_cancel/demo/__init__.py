"""The seed scenario's refund agent, shipped with the package for ``langgraph-cancel demo``.

* :mod:`langgraph_cancel.demo.graph`: the agent, a real LangGraph graph built from
  the package's public names, and the seed script its no-key model plays.
* :mod:`langgraph_cancel.demo.tools`: the agent's LangChain tools, each classified
  with ``effect(...)``.
* :mod:`langgraph_cancel.demo.services`: ``Providers``, the facade over the fake
  payments, email, orders, tickets, chat and policies of
  :mod:`langgraph_cancel.demo.providers` (one module each), which keep their truth in
  their own SQLite file and honour idempotency keys.
* :mod:`langgraph_cancel.demo.scenario`: where the demo presses stop, and how its
  report is checked against what the fake providers did.

``langgraph.json`` serves :data:`langgraph_cancel.demo.graph.graph` to ``langgraph dev``.
"""

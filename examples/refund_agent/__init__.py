"""The seed scenario's refund agent: its tools and the fake systems they touch.

* :mod:`examples.refund_agent.services`: payments, outbox, orders, tickets and
  chat, faked in their own SQLite file and honouring idempotency keys.
* :mod:`examples.refund_agent.tools`: the agent's LangChain tools, each
  classified with ``effect(...)``.
"""

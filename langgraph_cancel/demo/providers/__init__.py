"""The refund agent's fake external systems, one module per provider.

* :mod:`~langgraph_cancel.demo.providers.store`: the SQLite file they share, its
  transactions and the Stripe-style idempotency every mutating call goes through;
* :mod:`~langgraph_cancel.demo.providers.faults`: faults armed in that file;
* :mod:`~langgraph_cancel.demo.providers.schema`: the tables and the seed data;
* :mod:`~langgraph_cancel.demo.providers.payments`: refunds;
* :mod:`~langgraph_cancel.demo.providers.mail`: emails;
* :mod:`~langgraph_cancel.demo.providers.orders`: the order database;
* :mod:`~langgraph_cancel.demo.providers.tickets`: the support desk;
* :mod:`~langgraph_cancel.demo.providers.chat`: the chat channel;
* :mod:`~langgraph_cancel.demo.providers.policies`: the policy search;
* :mod:`~langgraph_cancel.demo.providers.errors`: what a provider refuses.

:class:`langgraph_cancel.demo.services.Providers` holds one of each over one file.
"""

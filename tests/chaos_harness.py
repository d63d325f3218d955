"""Chaos harness: random agent plans against the refund agent's fake providers.

A *plan* (:class:`Plan`) is a script for one thread: the model's turns, the
reviewer's answers, provider faults and the chaos to inject (a cancel, a
simulated crash inside a tool, or the invocation's asyncio task cancelled).
:class:`Runner` plays it on a real compiled graph on a memory, SQLite or
PostgreSQL saver, resumes it after every crash, answers every interrupt, sends a
new message and finally checks the invariants I1-I8 of ``docs/design.md``
against the providers' own truth (a separate SQLite file that counts every
request and every application per idempotency key).

The harness is split by concern; the suites import it from here:

- ``chaos_plans``: the plan vocabulary (:class:`Plan`, :class:`CallSpec`,
  :class:`Inject`, :class:`Crash`), the tools' names and kinds, call arguments;
- ``chaos_world``: the fake providers, the tools that reach them, the chaos hooks
  (:class:`World`);
- ``chaos_graph``: the scripted model, the compiled graph and the savers
  (:func:`open_saver`, :func:`db_url_of`);
- ``chaos_invariants``: the checks I1-I8;
- ``chaos_runner``: :class:`Runner` and :func:`kill_worker` (a process that blocks
  at a kill point to be SIGKILLed).
"""

from __future__ import annotations

from chaos_graph import build_graph, dangling_calls, db_url_of, open_saver, scripted_model
from chaos_invariants import (
    check_buckets_add_up,
    check_cancelled_run_starts_nothing,
    check_invariants,
    check_persisted_state_answers,
    check_resume_reconciles_first,
)
from chaos_plans import (
    CANCEL_TIMEOUT,
    IRREVERSIBLE_OPS,
    ORDERS,
    RELEASED,
    REVERSIBLE_OPS,
    TOOL_KINDS,
    TOOL_NAMES,
    TOOL_OPERATION,
    UNDO_PREFIX,
    CallSpec,
    Crash,
    Inject,
    Plan,
    call_args,
    edited_args,
)
from chaos_runner import MAX_STEPS, Runner, Step, kill_worker
from chaos_world import World

__all__ = [
    "CANCEL_TIMEOUT",
    "IRREVERSIBLE_OPS",
    "MAX_STEPS",
    "ORDERS",
    "RELEASED",
    "REVERSIBLE_OPS",
    "TOOL_KINDS",
    "TOOL_NAMES",
    "TOOL_OPERATION",
    "UNDO_PREFIX",
    "CallSpec",
    "Crash",
    "Inject",
    "Plan",
    "Runner",
    "Step",
    "World",
    "build_graph",
    "call_args",
    "check_buckets_add_up",
    "check_cancelled_run_starts_nothing",
    "check_invariants",
    "check_persisted_state_answers",
    "check_resume_reconciles_first",
    "dangling_calls",
    "db_url_of",
    "edited_args",
    "kill_worker",
    "open_saver",
    "scripted_model",
]

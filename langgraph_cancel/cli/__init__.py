"""``langgraph-cancel``: run the demo, and inspect, stop, settle and resume threads.

Every command that works on a database takes ``--db URL`` (``sqlite:///file.db``,
a file path, ``postgresql://...`` or ``memory://``; default
``$LANGGRAPH_CANCEL_DB``, else the SQLite file ``.langgraph-cancel.db`` in the
working directory) and ``--json``. Errors are one line on stderr and exit code
1 (a JSON object on stdout under ``--json``; set ``LANGGRAPH_CANCEL_DEBUG=1``
for a traceback).

Commands::

    demo [--cancel-at STEP]         the seed scenario, stopped mid-run, and its report
    status THREAD                   runs, lease and the three questions, from the database
    effects THREAD [--history]      every effect record (and its audit trail)
    report THREAD [--now]           the cancellation report
    cancel THREAD [--reason R] [--by WHO]
    compensate THREAD [--graph M:A] undo committed reversible effects
    resume THREAD [--graph M:A]     reconcile, then continue the thread from its checkpoint
    reconcile [THREAD | --all]      settle unknown and in-flight effects through reconcile hooks
    completion bash|zsh             a shell completion script

The package is split by concern: :mod:`~langgraph_cancel.cli.parser` (the
commands and their arguments, whose types are in
:mod:`~langgraph_cancel.cli.arguments`), :mod:`~langgraph_cancel.cli.app`
(``main`` and errors), :mod:`~langgraph_cancel.cli.render` (all output), and one module per command
group, imported only when one of its commands runs, so ``--help``,
``--version``, ``cancel``, ``status`` and ``effects`` never import LangChain.
"""

from langgraph_cancel.cli.app import main

__all__ = ["main"]

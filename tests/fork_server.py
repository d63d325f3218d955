"""The fork server the SIGKILL suites start their worker processes from.

Python 3.11's fork server ignores the parent's ``sys.path`` when it preloads (the
preload then fails silently and every worker pays the imports again), so it is
started with ``PYTHONPATH`` naming the tests and the repository. Each suite sets
its own preload on the ``forkserver`` context; the server is shared by whichever
suite starts it first.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def ensure_fork_server() -> None:
    """Start the fork server (if it is not running) with the tests on its path."""
    from multiprocessing import forkserver

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(HERE.parent), *([old] if old else [])]
    )
    try:
        forkserver.ensure_running()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old

"""``python -m langgraph_cancel.demo [--cancel-at STEP] [--json] ...``: the demo.

The same as ``langgraph-cancel demo``: the seed scenario, stop pressed mid-run,
and the cancellation report compared with the fake providers' truth.
"""

from __future__ import annotations

import sys

from langgraph_cancel.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["demo", *sys.argv[1:]]))

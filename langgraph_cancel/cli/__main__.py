"""``python -m langgraph_cancel.cli``: the ``langgraph-cancel`` command."""

from langgraph_cancel.cli.app import main

raise SystemExit(main())

"""``python -m benchmarks``: run the benchmark suite (see ``benchmarks/run.py``)."""

from benchmarks.run import main

raise SystemExit(main())

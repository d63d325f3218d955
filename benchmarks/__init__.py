"""Benchmarks of langgraph-cancel against plain LangGraph: ``python -m benchmarks``.

See ``benchmarks/README.md`` and ``benchmarks/run.py``; results land in
``benchmarks/results/latest.json``.
"""

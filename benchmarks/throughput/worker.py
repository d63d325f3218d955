"""A worker process of the throughput section, and the schema each variant's database
needs: warm up, wait for the start file, run, write what it measured."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.bound import BoundWriter
from benchmarks.throughput.constants import CALLS, WARMUP_RUNS


def _graph(
    variant: str,
    saver: Any,
    tool_ms: float = 0.0,
    calls: int = CALLS,
    writer: BoundWriter | None = None,
) -> Any:
    """The agent; with tools that take time, ours sends a batch's calls at once, as
    ``ToolNode`` does (its default sends side effects one at a time). ``writer``: the
    ``bound`` variant's durable writes around each call."""
    from benchmarks.agent import SIDE_EFFECT, build_graph, make_tool, scripted_model

    tool = make_tool(SIDE_EFFECT, tool_ms)
    return build_graph(
        [tool],
        scripted_model(calls),
        saver,
        effectful=variant == "effect",
        effect_concurrency=calls if tool_ms else 1,
        wrap_tool_call=None if writer is None else writer.wrap_tool_call,
    )


def _open_saver(variant: str, url: str) -> Any:
    if variant in ("plain", "bound"):
        from langgraph.checkpoint.postgres import PostgresSaver

        return PostgresSaver.from_conn_string(url)
    from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

    return PostgresCancelSaver.from_conn_string(url)


def setup_schema(variant: str, url: str) -> None:
    with _open_saver(variant, url) as saver:
        saver.setup()
    if variant == "bound":
        with BoundWriter.connect(url) as writer:
            writer.setup()


def worker_main(spec: dict[str, Any]) -> None:
    """One worker process: warm up, wait for the start file, run, report.

    The warm-up runs on a saver of its own, closed before the worker says it is
    ready: a backend reports its transaction counts when it exits (or up to a
    second later), so the warm-up's commits are in the parent's first reading
    and the measured runs' commits are in its last.
    """
    from langchain_core.messages import HumanMessage

    variant, url = spec["variant"], spec["url"]
    tool_ms = float(spec.get("tool_ms", 0.0))
    calls = int(spec.get("calls", CALLS))

    def run(graph: Any, writer: BoundWriter | None) -> None:
        thread_id = uuid.uuid4().hex
        if writer is not None:
            writer.start(thread_id)
        out = graph.invoke(
            {"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": thread_id}}
        )
        if writer is not None:
            writer.end()
        assert len(out["messages"]) == calls + 3, out["messages"]

    def bound_writer(stack: contextlib.ExitStack) -> BoundWriter | None:
        return stack.enter_context(BoundWriter.connect(url)) if variant == "bound" else None

    with contextlib.ExitStack() as stack:
        saver = stack.enter_context(_open_saver(variant, url))
        writer = bound_writer(stack)
        graph = _graph(variant, saver, tool_ms, calls, writer)
        for _ in range(WARMUP_RUNS):
            run(graph, writer)
    with contextlib.ExitStack() as stack:
        saver = stack.enter_context(_open_saver(variant, url))
        writer = bound_writer(stack)
        graph = _graph(variant, saver, tool_ms, calls, writer)
        Path(spec["ready"]).write_text("ready")
        go = Path(spec["go"])
        while not go.exists():
            time.sleep(0.005)
        cpu0 = time.process_time()
        started = time.time()
        for _ in range(spec["runs"]):
            run(graph, writer)
        ended = time.time()
        cpu = time.process_time() - cpu0
    Path(spec["result"]).write_text(
        json.dumps({"started": started, "ended": ended, "cpu_s": cpu, "runs": spec["runs"]})
    )

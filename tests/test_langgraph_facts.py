"""LangGraph behaviour the README's Limits rely on, checked against the installed version."""

from __future__ import annotations

import threading
from typing import Any, Literal, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph


class _State(TypedDict):
    steps: list[str]


class _HeldSaver(InMemorySaver):
    """An in-memory saver whose ``put`` waits for ``release`` (if given)."""

    def __init__(self, release: threading.Event | None) -> None:
        super().__init__()
        self.release = release

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if self.release is not None:
            self.release.wait(10)
        return super().put(config, checkpoint, metadata, new_versions)


@pytest.mark.parametrize("durability", ["async", "sync"])
def test_the_next_step_may_start_before_the_last_is_on_disk(
    durability: Literal["async", "sync"],
) -> None:
    # "async" (LangGraph's default): the model step's checkpoint is written while the
    # tool step runs, so a crash then loses the model's tool calls. "sync": never.
    release = threading.Event() if durability == "async" else None
    saver = _HeldSaver(release)
    seen: list[list[str]] = []

    def model(state: _State) -> dict[str, list[str]]:
        return {"steps": [*state["steps"], "model"]}

    def tools(state: _State) -> dict[str, list[str]]:
        latest = saver.get_tuple({"configurable": {"thread_id": "t"}})
        seen.append(list(latest.checkpoint["channel_values"].get("steps", [])) if latest else [])
        if release is not None:
            release.set()
        return {"steps": [*state["steps"], "tools"]}

    builder = StateGraph(_State)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_edge("model", "tools")
    builder.add_edge("tools", END)
    graph = builder.compile(checkpointer=saver)
    out = graph.invoke({"steps": []}, {"configurable": {"thread_id": "t"}}, durability=durability)
    assert out["steps"] == ["model", "tools"]
    on_disk_when_tools_ran = "model" in seen[0]
    assert on_disk_when_tools_ran is (durability == "sync")

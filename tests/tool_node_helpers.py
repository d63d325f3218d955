"""Helpers shared by the EffectToolNode tests: starting a graph, its tool answers, the
effects its ledger recorded."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage, ToolMessage

from graphs import config_for


def start(graph: Any, thread_id: str, text: str = "go", **kwargs: Any) -> dict[str, Any]:
    result: dict[str, Any] = graph.invoke(
        {"messages": [HumanMessage(text)]}, config_for(thread_id), **kwargs
    )
    return result


async def astart(graph: Any, thread_id: str, text: str = "go") -> dict[str, Any]:
    result: dict[str, Any] = await graph.ainvoke(
        {"messages": [HumanMessage(text)]}, config_for(thread_id)
    )
    return result


def tool_messages(messages: list[Any]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def effects_by_tool(saver: Any, thread_id: str) -> dict[str, Any]:
    return {e.tool: e for e in saver.ledger.effects(thread_id)}


def assert_no_duplicate_keys(saver: Any, thread_id: str) -> None:
    effects = saver.ledger.effects(thread_id)
    keys = [e.idempotency_key for e in effects]
    ids = [e.tool_call_id for e in effects]
    assert len(keys) == len(set(keys)), keys
    assert len(ids) == len(set(ids)), ids

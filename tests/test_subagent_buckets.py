"""Property: a stop at the parent accounts for every call of the task tree, once.

Hypothesis draws a parent agent's calls and its sub-agent's (every effect kind,
in one or two turns), and where stop is pressed on the parent's thread: during
one of the parent's calls, during one of the child's (the stop cascades to the
child run), or never. Whatever the draw, on every backend, the parent's report
holds each call the models asked for, of the parent and of the child, in
exactly one bucket; a child's call is marked with the child run; nothing the
report says did not run reached the provider, and everything it says is
permanent did.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graphs import (
    ExecutionLog,
    agent_builder,
    calls,
    config_for,
    counting_tool,
    new_thread,
    scripted,
)
from hypothesis_profiles import examples
from langgraph_cancel import EffectKind, EffectToolNode, add_cancellation, get_report
from langgraph_cancel.report import BUCKETS
from langgraph_cancel.subagents import child_config
from langgraph_cancel.types import TERMINAL_RUN_STATUSES
from module_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    db_url_fixture,
    log_fixture,
    providers_path_fixture,
    saver_fixture,
)

KINDS = (EffectKind.READ_ONLY, EffectKind.REVERSIBLE, EffectKind.IRREVERSIBLE)


@dataclasses.dataclass(frozen=True)
class Tree:
    """A drawn task tree: the parent's calls, the child's turns, where stop is pressed."""

    parent: tuple[EffectKind, ...]
    child: tuple[tuple[EffectKind, ...], ...]
    stop_at: int | None
    compensate_on_cancel: bool

    @property
    def calls(self) -> int:
        return len(self.parent) + sum(len(turn) for turn in self.child)


@st.composite
def trees(draw: st.DrawFn) -> Tree:
    kinds = st.sampled_from(KINDS)
    parent = tuple(draw(st.lists(kinds, max_size=3)))
    child = tuple(
        tuple(draw(st.lists(kinds, min_size=1, max_size=3))) for _ in range(draw(st.integers(1, 2)))
    )
    total = len(parent) + sum(len(turn) for turn in child)
    # Stop during one of the calls, or (the last choice) never.
    stop_at = draw(st.integers(0, total))
    return Tree(parent, child, stop_at if stop_at < total else None, draw(st.booleans()))


def _tools(log: ExecutionLog, prefix: str, stop: Any) -> dict[EffectKind, Any]:
    return {kind: counting_tool(log, f"{prefix}_{kind.value}", kind, before=stop) for kind in KINDS}


@settings(
    max_examples=examples(ci=15, dev=5),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tree=trees())
def test_a_stop_at_the_parent_accounts_for_every_call_of_the_tree_once(
    saver: Any, log: ExecutionLog, tree: Tree
) -> None:
    parent_thread = new_thread()
    child_thread = f"{parent_thread}-child"
    items = [f"{parent_thread}-i{n}" for n in range(tree.calls)]
    stop_item = None if tree.stop_at is None else items[tree.stop_at]

    def stop(item: str) -> None:
        if item == stop_item:
            saver.ledger.request_cancel(parent_thread, reason="stop", requested_by="property")

    parent_tools = _tools(log, "parent", stop)
    child_tools = _tools(log, "child", stop)
    numbered = iter(enumerate(items))

    def turn(kinds: tuple[EffectKind, ...], tools: dict[EffectKind, Any]) -> AIMessage:
        specs = []
        for kind in kinds:
            number, item = next(numbered)
            specs.append((tools[kind].name, item, f"call-{number}"))
        return calls(*specs)

    parent_turns = [turn(tree.parent, parent_tools)] if tree.parent else []
    child_turns = [turn(kinds, child_tools) for kinds in tree.child]
    child = add_cancellation(
        agent_builder(
            scripted(*child_turns, "child done"), EffectToolNode(list(child_tools.values()))
        ),
        compensate_on_cancel=tree.compensate_on_cancel,
    ).compile(checkpointer=saver)

    def delegate(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        out = child.invoke(
            {"messages": [HumanMessage("do it")]}, child_config(config, child_thread)
        )
        return {"messages": [AIMessage(f"child: {out['messages'][-1].content}")]}

    model = scripted(*parent_turns, "delegating")
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", EffectToolNode(list(parent_tools.values())))
    builder.add_node("delegate", delegate)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: "delegate"})
    builder.add_edge("tools", "agent")
    builder.add_edge("delegate", END)
    parent = add_cancellation(builder, compensate_on_cancel=tree.compensate_on_cancel).compile(
        checkpointer=saver
    )
    parent.invoke({"messages": [HumanMessage("go")]}, config_for(parent_thread))

    ledger = saver.ledger
    parent_run = ledger.latest_run(parent_thread)
    child_run = ledger.latest_run(child_thread)
    assert parent_run is not None and parent_run.terminal
    report = get_report(saver, parent_thread)
    # What the models asked for: each tool call in the parent's and the child's state.
    asked = [
        str(call["id"])
        for graph, thread in ((parent, parent_thread), (child, child_thread))
        for message in graph.get_state(config_for(thread)).values.get("messages", [])
        if isinstance(message, AIMessage)
        for call in message.tool_calls
    ]
    entries = report.entries()
    # Every call in exactly one bucket: the buckets add up to the calls asked for.
    assert sum(len(getattr(report, bucket)) for bucket in BUCKETS) == len(asked)
    assert sorted(entry.tool_call_id for entry in entries) == sorted(asked)
    recorded = ledger.effects(parent_thread) + ledger.effects(child_thread)
    assert sorted(entry.effect_id for entry in entries) == sorted(e.effect_id for e in recorded)
    for entry in entries:
        on_child = entry.tool.startswith("child_")
        assert (entry.child_run_id is not None) is on_child, entry
        if on_child:
            assert child_run is not None and entry.child_run_id == child_run.run_id
            assert entry.child_thread_id == child_thread
    # The child's permanent effects are the parent's: the report says what survived.
    for entry in report.permanent:
        assert log.applied_for_key(entry.tool, entry.idempotency_key), entry
    for entry in report.not_run + report.rejected:
        assert not log.applied_for_key(entry.tool, entry.idempotency_key), entry
    where = (
        "never"
        if tree.stop_at is None
        else "in the parent"
        if tree.stop_at < len(tree.parent)
        else "in the child"
    )
    event(f"stop pressed {where}")
    for bucket in BUCKETS:
        if getattr(report, bucket):
            event(f"a call {bucket}")
    if tree.stop_at is None:
        assert report.status == "completed"
        assert len(asked) == tree.calls
        return
    assert report.status == "cancelled" and report.orphans == 0
    assert report.dispatched_after_cancel == 0
    if child_run is not None:
        assert child_run.status in TERMINAL_RUN_STATUSES
        stopped_in_child = tree.stop_at >= len(tree.parent)
        if stopped_in_child:
            assert child_run.status.value == "cancelled" and child_run.observed_at is not None

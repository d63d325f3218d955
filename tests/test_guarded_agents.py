"""Which agents ``resume``, ``sweep --graph`` and ``Sweeper(graph=)`` run on a saver of
their own: graphs prepared with ``add_cancellation`` and ``create_agent`` agents with
``EffectMiddleware``, found however the agent is handed over; any other graph is refused.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from cli_util import one_line_error, run_main, sqlite_url
from langgraph_cancel import EffectKind, EffectToolNode, Ledger, add_cancellation, effect
from langgraph_cancel.agents import guarded_agent
from langgraph_cancel.checkpointers.memory import MemoryCancelSaver
from langgraph_cancel.errors import ConfigurationError
from langgraph_cancel.sweeper import Sweeper
from langgraph_cancel.testing.fake_model import ScriptedChatModel

agents = pytest.importorskip("langchain.agents")
from langchain.agents.middleware import (  # noqa: E402
    AgentMiddleware,
    HumanInTheLoopMiddleware,
    ToolCallLimitMiddleware,
)

from langgraph_cancel.middleware import EffectMiddleware  # noqa: E402


def _tools() -> list[BaseTool]:
    @effect(EffectKind.IRREVERSIBLE, requires_approval=False)
    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    @effect(EffectKind.READ_ONLY)
    @tool
    def lookup(order_id: str) -> str:
        """Look an order up."""
        return f"order {order_id}"

    return [refund, lookup]


def _model() -> ScriptedChatModel:
    return ScriptedChatModel([AIMessage("done")], on_exhausted="repeat_last")


def _builder(tool_node: Any) -> StateGraph[Any]:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [AIMessage("done")]})
    builder.add_node("tools", tool_node)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    builder.add_edge("tools", "agent")
    return builder


def _create_agent(middleware: list[AgentMiddleware[Any, Any, Any]], **options: Any) -> Any:
    return agents.create_agent(_model(), _tools(), middleware=middleware, **options)


# ------------------------------------------------------------------- add_cancellation
def test_an_add_cancellation_graph_is_found_as_builder_compiled_or_made() -> None:
    builder = add_cancellation(_builder(EffectToolNode(_tools())), compensate_on_cancel=True)
    for given in (builder, builder.compile(), lambda: builder.compile()):
        agent = guarded_agent(given)
        assert agent is not None and agent.graph is builder and agent.middleware is None
        assert agent.settings is builder.cancellation
    prepared = guarded_agent(builder)
    assert prepared is not None
    saver = MemoryCancelSaver()
    assert prepared.compile_on(saver).checkpointer is saver


# ---------------------------------------------------------------------- create_agent
@pytest.mark.parametrize(
    "others",
    [
        pytest.param((), id="alone"),
        pytest.param(("hitl",), id="after-hitl"),
        pytest.param(("limit", "hitl"), id="after-two"),
    ],
)
def test_a_create_agent_agent_is_found_by_its_effect_middleware(others: tuple[str, ...]) -> None:
    middleware = EffectMiddleware(compensate_on_cancel=True)
    made: dict[str, AgentMiddleware[Any, Any, Any]] = {
        "hitl": HumanInTheLoopMiddleware({"refund": True}),
        "limit": ToolCallLimitMiddleware(run_limit=5),
    }
    before = [made[name] for name in others]
    graph = _create_agent([*before, middleware])
    for given in (graph, lambda: graph):
        agent = guarded_agent(given)
        assert agent is not None and agent.middleware is middleware and agent.graph is graph
        assert agent.settings.compensate_on_cancel
        # The agent's tools, with their hooks, though none has been called yet.
        assert set(agent.settings.tools) == {"refund", "lookup"}
    # The middleware's own settings are left as they were.
    assert middleware.settings.tools == {}
    # Placed first, before the others, it is found as well.
    first = EffectMiddleware()
    found = guarded_agent(_create_agent([first, *[made[name] for name in others]]))
    assert found is not None and found.middleware is first


def test_a_create_agent_agent_compiles_on_another_saver_as_it_was_made() -> None:
    own = MemoryCancelSaver()
    graph = _create_agent([EffectMiddleware()], checkpointer=own, name="refunds")
    agent = guarded_agent(graph)
    assert agent is not None
    other = MemoryCancelSaver()
    compiled = agent.compile_on(other)
    assert compiled.checkpointer is other and compiled.name == "refunds"
    assert set(compiled.nodes) == set(graph.nodes)
    assert graph.checkpointer is own  # the agent handed over is not changed


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: _builder(ToolNode(_tools())), id="plain-builder"),
        pytest.param(lambda: _builder(ToolNode(_tools())).compile(), id="plain-graph"),
        pytest.param(lambda: _create_agent([]), id="create-agent-without-middleware"),
        pytest.param(
            lambda: _create_agent([ToolCallLimitMiddleware(run_limit=5)]),
            id="create-agent-other-middleware",
        ),
        pytest.param(_tools, id="a-list-of-tools"),
    ],
)
def test_any_other_graph_is_not_an_agent_the_package_guards(make: Any) -> None:
    assert guarded_agent(make()) is None


def test_the_sweeper_refuses_a_graph_nothing_guards() -> None:
    plain = _builder(ToolNode(_tools())).compile()
    with pytest.raises(ConfigurationError, match="create_agent agent with EffectMiddleware"):
        Sweeper(MemoryCancelSaver(), graph=plain)
    sweeper = Sweeper(MemoryCancelSaver(), graph=_create_agent([EffectMiddleware()]))
    assert set(sweeper.settings.tools) >= {"refund", "lookup"}


def test_resume_refuses_a_graph_nothing_guards(tmp_path: Path) -> None:
    (tmp_path / "plain_agent.py").write_text(
        textwrap.dedent(
            """
            from langchain_core.messages import AIMessage
            from langgraph.graph import END, START, MessagesState, StateGraph

            builder = StateGraph(MessagesState)
            builder.add_node("agent", lambda state: {"messages": [AIMessage("done")]})
            builder.add_edge(START, "agent")
            builder.add_edge("agent", END)
            graph = builder.compile()
            """
        )
    )
    db = sqlite_url(tmp_path / "agent.db")
    with Ledger.from_url(db) as ledger:
        ledger.start_run("t-1")
    proc = run_main(["resume", "t-1", "--db", db, "--graph", "plain_agent.py:graph"], tmp_path)
    error = one_line_error(proc)
    assert error.endswith(
        "--graph must be prepared with add_cancellation(builder), or be a create_agent "
        "agent with EffectMiddleware"
    ), error

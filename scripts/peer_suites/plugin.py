"""The pytest plugin that puts langgraph-cancel under LangGraph's and LangChain's own tests.

``scripts/peer-suites`` runs the peers' test files unchanged, with this plugin
loaded first (``-p plugin``). Before any test module is imported it swaps the drop-in
in, according to ``LGC_PEER_MODE``:

``toolnode-classified``
    ``langgraph.prebuilt.ToolNode`` (and its other import paths) is an
    ``EffectToolNode`` whose tools are classified ``irreversible`` with
    ``requires_approval=False``: the strictest path that runs unasked (an intent
    written before each dispatch, one side effect at a time, the outcome recorded).
    A tool a test's ``wrap_tool_call`` serves is classified so too, by name
    (``effects=``), as the user who wrote the wrapper would.
``toolnode-unclassified``
    The same ``EffectToolNode``, the tools as the test wrote them: nobody classified
    them, so each needs approval. A test that fails here may differ only by that.
``create-agent``
    ``langchain.agents.create_agent`` adds ``EffectMiddleware`` to every agent (given
    the agent's ``HumanInTheLoopMiddleware`` as ``approval=``, as the README says),
    and classifies the agent's tools as in ``toolnode-classified`` (a tool a test's
    middleware adds to a request and serves too, by name: ``effects=``).
``checkpointers-threaded``
    LangGraph's async graph tests with our sync savers (``SqliteCancelSaver``,
    ``PostgresCancelSaver``) where they take an async one (the ``sqlite_aio`` and
    ``postgres_aio`` parameters): LangGraph's own sync savers refuse async graphs, ours
    serve them from worker threads.
``postgres-saver`` and ``sqlite-saver``
    The saver packages' own tests (``langgraph-checkpoint-postgres``,
    ``langgraph-checkpoint-sqlite``), which build LangGraph's savers by hand (on a
    connection, a pool, a pipeline), with ``PostgresSaver``, ``AsyncPostgresSaver``,
    ``SqliteSaver`` and ``AsyncSqliteSaver`` replaced by ours where the tests import
    them from; the PostgreSQL tests on the server ``LANGGRAPH_CANCEL_TEST_PG_DSN``
    names, in a database of the pass's own.
``checkpointers``
    LangGraph's own graph tests (Pregel, interrupts, subgraphs, time travel, state
    updates) with its test checkpointers swapped for ours: every SQLite and
    PostgreSQL saver the tests build (plain, encrypted, pipelined, pooled, async) is
    ``SqliteCancelSaver``, ``PostgresCancelSaver`` or their async twins, on the
    PostgreSQL server ``LANGGRAPH_CANCEL_TEST_PG_DSN`` names, and the ``memory``
    fixture's saver is ``MemoryCancelSaver`` under LangGraph's immutability checks.
    The tests run on the savers ``LGC_PEER_SAVERS`` chooses (``DEFAULT_SAVERS``: each
    class once); tests on other savers (the pending-sends migration one, none at
    all, a Redis cache) are left out.

Each test's outcome is written to the JSON file ``LGC_PEER_RESULTS`` names, with
whether langgraph-cancel asked for an approval during it (an interrupt of its
review, or ``ApprovalRequiredError``), which the runner needs to judge the
unclassified pass.
"""

from __future__ import annotations

import json
import os
import threading
import time
import tomllib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool

MODES = (
    "toolnode-classified",
    "toolnode-unclassified",
    "create-agent",
    "checkpointers",
    "checkpointers-threaded",
    "postgres-saver",
    "sqlite-saver",
)
#: The parameters of LangGraph's saver fixtures that build one of our savers.
OUR_SAVERS = frozenset(
    {
        "memory", "sqlite", "sqlite_aes", "sqlite_aio",
        "postgres", "postgres_pipe", "postgres_pool",
        "postgres_aio", "postgres_aio_pipe", "postgres_aio_pool",
    }
)  # fmt: skip
#: The ones the checkpointers pass runs unless ``LGC_PEER_SAVERS`` names others (``all``:
#: every one): each of our five classes once, the sync PostgreSQL saver on a pool as
#: many workers run it (``memory`` serves the sync and the async tests). The rest
#: build the same classes on a pipeline, a pool or an encrypting serializer.
DEFAULT_SAVERS = frozenset({"memory", "sqlite", "postgres_pool", "sqlite_aio", "postgres_aio"})
#: The async fixtures' parameters the threaded pass gives our sync savers.
THREADED_SAVERS = frozenset({"sqlite_aio", "postgres_aio"})
_SAVER_FIXTURES = ("sync_checkpointer", "async_checkpointer")

#: Whether the running test asked for an approval.
_approval_asked: list[bool] = [False]
#: A test that runs away (a loop whose messages grow each turn) is stopped here, with
#: the results so far written, before it takes the machine's memory.
#: The exit code of a run stopped so (the runner then runs the tests not yet run).
RUNAWAY_EXIT_CODE = 86
MEMORY_LIMIT_BYTES = int(os.environ.get("LGC_PEER_MEMORY_LIMIT_MB", "2048")) * 1024 * 1024


def classified(tool: BaseTool | Callable[..., Any] | dict[str, Any]) -> Any:
    """``tool`` classified irreversible, running without approval (a dict, a provider's
    built-in tool, is left as it is: it never runs in the process)."""
    from langgraph_cancel import EffectKind, effect

    if isinstance(tool, dict):
        return tool
    base = tool if isinstance(tool, BaseTool) else as_tool(tool)
    return effect(EffectKind.IRREVERSIBLE, base, requires_approval=False)


class EveryName(Mapping[str, Any]):
    """``effects=`` for a suite whose every tool is classified: whatever tool a test's
    wrapper serves (or its middleware adds to a request), by any name, is classified
    as ``classified`` classifies the tools it is given. A user lists the names their
    wrapper serves; the peers' tests name theirs in their bodies."""

    def __getitem__(self, name: str) -> Any:
        from langgraph_cancel import EffectKind, effect

        return effect(EffectKind.IRREVERSIBLE, requires_approval=False)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _install_tool_node(*, classify: bool) -> None:
    import langgraph.prebuilt
    import langgraph.prebuilt.chat_agent_executor
    import langgraph.prebuilt.tool_node

    from langgraph_cancel import EffectToolNode

    class PeerToolNode(EffectToolNode):
        """``EffectToolNode`` under the name the peers' tests use."""

        def __init__(self, tools: Sequence[Any], *args: Any, **kwargs: Any) -> None:
            if classify:
                tools = [classified(tool) for tool in tools]
                kwargs.setdefault("effects", EveryName())
            super().__init__(tools, *args, **kwargs)

    PeerToolNode.__name__ = PeerToolNode.__qualname__ = "ToolNode"
    langgraph.prebuilt.ToolNode = PeerToolNode  # type: ignore[misc]
    langgraph.prebuilt.tool_node.ToolNode = PeerToolNode  # type: ignore[misc]
    setattr(langgraph.prebuilt.chat_agent_executor, "ToolNode", PeerToolNode)  # noqa: B010


def _install_create_agent() -> None:
    import langchain.agents
    import langchain.agents.factory
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    from langgraph_cancel.middleware import EffectMiddleware

    original = langchain.agents.factory.create_agent

    def create_agent(model: Any, tools: Any = None, *args: Any, **kwargs: Any) -> Any:
        middleware = list(kwargs.pop("middleware", None) or ())
        hitl = next((m for m in middleware if isinstance(m, HumanInTheLoopMiddleware)), None)
        for each in middleware:
            own_tools = getattr(each, "tools", None)
            if own_tools:
                each.tools = [classified(tool) for tool in own_tools]
        middleware.append(
            EffectMiddleware(approval=hitl if hitl is not None else True, effects=EveryName())
        )
        if tools is not None:
            tools = [classified(tool) for tool in tools]
        return original(model, tools, *args, middleware=middleware, **kwargs)

    create_agent.__doc__ = original.__doc__
    langchain.agents.create_agent = create_agent
    langchain.agents.factory.create_agent = create_agent


def _test_server(pass_name: str) -> str:
    """The PostgreSQL server ``LANGGRAPH_CANCEL_TEST_PG_DSN`` names, which ``pass_name``
    needs."""
    dsn = os.environ.get("LANGGRAPH_CANCEL_TEST_PG_DSN", "")
    if not dsn:
        raise pytest.UsageError(
            f"the {pass_name} pass needs PostgreSQL: set LANGGRAPH_CANCEL_TEST_PG_DSN "
            "(./scripts/test starts a server and sets it)"
        )
    return dsn


def _server_root(dsn: str) -> str:
    """``dsn`` without its database, as LangGraph's test fixtures want it: they append
    the name of the database each test creates."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql") or parts.query or parts.fragment:
        raise pytest.UsageError(
            "LANGGRAPH_CANCEL_TEST_PG_DSN must be a postgresql:// URL without options "
            f"for the peer suites, not {dsn!r}"
        )
    return urlunsplit((parts.scheme, parts.netloc, "/", "", ""))


def _install_savers(config: pytest.Config, *, threaded: bool) -> None:
    """Make LangGraph's test fixtures build our savers, on our PostgreSQL server
    (``threaded``: our sync savers where its async tests take an async saver).

    The fixtures (``tests/conftest_checkpointer.py``) look their saver classes and
    server up as module globals when a test asks for one, so replacing the globals
    once the module is imported is enough.
    """
    import importlib

    from langgraph_cancel.checkpointers.postgres import (
        AsyncPostgresCancelSaver,
        PostgresCancelSaver,
    )
    from langgraph_cancel.checkpointers.sqlite import AsyncSqliteCancelSaver, SqliteCancelSaver

    root = _server_root(_test_server("checkpointers"))
    fixtures = importlib.import_module("tests.conftest_checkpointer")
    for name, ours in (
        ("PostgresSaver", PostgresCancelSaver),
        ("AsyncPostgresSaver", AsyncPostgresCancelSaver),
        ("SqliteSaver", SqliteCancelSaver),
        ("AsyncSqliteSaver", AsyncSqliteCancelSaver),
        ("MemorySaverAssertImmutable", _memory_saver_asserting(fixtures)),
        ("DEFAULT_POSTGRES_URI", root),
    ):
        setattr(fixtures, name, ours)
    # A test may take a PostgreSQL store beside the saver: LangGraph's own, on our server.
    setattr(importlib.import_module("tests.conftest_store"), "DEFAULT_POSTGRES_URI", root)  # noqa: B010
    if threaded:
        # The async fixture calls the factories it imported by name: replace them there.
        conftest = importlib.import_module("tests.conftest")
        if conftest not in config.pluginmanager.get_plugins():
            raise pytest.UsageError("tests/conftest.py is not loaded as tests.conftest")
        setattr(conftest, "_checkpointer_sqlite_aio", _threaded_sqlite)  # noqa: B010
        setattr(conftest, "_checkpointer_postgres_aio", _threaded_postgres(root))  # noqa: B010


def _memory_saver_asserting(fixtures: Any) -> type[Any]:
    """``MemoryCancelSaver`` under LangGraph's test subclass of ``InMemorySaver``, which
    checks that a saved checkpoint is never changed afterwards: the ``memory`` fixture's
    saver, with our ledger."""
    from langgraph_cancel.checkpointers.memory import MemoryCancelSaver

    asserting: type[Any] = fixtures.MemorySaverAssertImmutable
    return type("MemoryCancelSaverAssertImmutable", (asserting, MemoryCancelSaver), {})


def _install_saver_classes(config: pytest.Config, *, postgres: bool) -> None:
    """Make the saver packages' own tests build our savers.

    Their modules import LangGraph's classes by name (``from
    langgraph.checkpoint.postgres import PostgresSaver``), so the classes are replaced
    in the modules they are imported from before any test module is. Ours are imported
    first, so they subclass LangGraph's own. The PostgreSQL tests get the server
    without a database (they create one per test) and a database of the pass's own for
    the tests that take ``DEFAULT_URI`` (the conftest empties its tables before each
    test), dropped at the end.
    """
    import importlib

    if not postgres:
        import langgraph.checkpoint.sqlite
        import langgraph.checkpoint.sqlite.aio

        from langgraph_cancel.checkpointers.sqlite import (
            AsyncSqliteCancelSaver,
            SqliteCancelSaver,
        )

        setattr(langgraph.checkpoint.sqlite, "SqliteSaver", SqliteCancelSaver)  # noqa: B010
        setattr(langgraph.checkpoint.sqlite.aio, "AsyncSqliteSaver", AsyncSqliteCancelSaver)  # noqa: B010
        return
    import uuid

    import langgraph.checkpoint.postgres
    import langgraph.checkpoint.postgres.aio
    import psycopg

    from langgraph_cancel.checkpointers.postgres import (
        AsyncPostgresCancelSaver,
        PostgresCancelSaver,
    )

    setattr(langgraph.checkpoint.postgres, "PostgresSaver", PostgresCancelSaver)  # noqa: B010
    setattr(langgraph.checkpoint.postgres.aio, "AsyncPostgresSaver", AsyncPostgresCancelSaver)  # noqa: B010
    dsn = _test_server("postgres-saver")
    root = _server_root(dsn)
    database = f"lgc_peer_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")

    def drop() -> None:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")

    config.add_cleanup(drop)
    conftest = importlib.import_module("tests.conftest")
    setattr(conftest, "DEFAULT_POSTGRES_URI", root)  # noqa: B010
    setattr(conftest, "DEFAULT_URI", root + database)  # noqa: B010


@asynccontextmanager
async def _threaded_sqlite() -> AsyncIterator[Any]:
    """Our sync SQLite saver where LangGraph's async tests take an async one: its async
    methods run the sync ones in a worker thread."""
    from langgraph_cancel.checkpointers.sqlite import SqliteCancelSaver

    with SqliteCancelSaver.from_conn_string(":memory:") as saver:
        saver.setup()
        yield saver


def _threaded_postgres(root: str) -> Callable[[], AbstractAsyncContextManager[Any]]:
    """Our sync PostgreSQL saver where LangGraph's async tests take an async one, on a
    database of its own on the server ``root`` names, dropped afterwards."""
    import uuid

    import psycopg

    from langgraph_cancel.checkpointers.postgres import PostgresCancelSaver

    @asynccontextmanager
    async def saver_on_a_fresh_database() -> AsyncIterator[Any]:
        database = f"test_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(root, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {database}")
        try:
            with PostgresCancelSaver.from_conn_string(root + database) as saver:
                saver.setup()
                yield saver
        finally:
            with psycopg.connect(root, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE {database}")

    return saver_on_a_fresh_database


def chosen_savers(setting: str | None = None) -> frozenset[str]:
    """The saver parameters ``LGC_PEER_SAVERS`` (or ``setting``) names: comma-separated,
    or ``all``; unset, ``DEFAULT_SAVERS``."""
    text = (os.environ.get("LGC_PEER_SAVERS", "") if setting is None else setting).strip()
    if not text:
        return DEFAULT_SAVERS
    if text == "all":
        return OUR_SAVERS
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(names - OUR_SAVERS)
    if unknown:
        raise pytest.UsageError(
            f"LGC_PEER_SAVERS names no saver of ours: {', '.join(unknown)} "
            f"(choose from {', '.join(sorted(OUR_SAVERS))}, or all)"
        )
    return names


def _on_saver(item: pytest.Item, savers: frozenset[str]) -> bool:
    """Whether the test builds one of ``savers`` (and no Redis cache, which needs a
    server this project does not start)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("cache") == "redis":
        return False
    return any(params.get(name) in savers for name in _SAVER_FIXTURES)


def _watch_approvals() -> None:
    import langgraph_cancel.execution.approval as asking
    from langgraph_cancel.errors import ApprovalRequiredError

    ask = getattr(asking, "interrupt")  # noqa: B009 - the name it calls, replaced below

    def interrupt(value: Any, *args: Any, **kwargs: Any) -> Any:
        _approval_asked[0] = True
        return ask(value, *args, **kwargs)

    setattr(asking, "interrupt", interrupt)  # noqa: B010
    refuse = ApprovalRequiredError.__init__

    def refused(self: ApprovalRequiredError, *args: Any, **kwargs: Any) -> None:
        _approval_asked[0] = True
        refuse(self, *args, **kwargs)

    setattr(ApprovalRequiredError, "__init__", refused)  # noqa: B010


class Recorder:
    """Collects each test's outcome, deselects what needs an outside service."""

    def __init__(
        self, results: Path, deselect: dict[str, str], *, savers: frozenset[str] | None
    ) -> None:
        self.results = results
        self.deselect = deselect
        #: The checkpointers pass keeps only the tests that build one of these savers.
        self.savers = savers
        # After a run that had to be stopped, the runner starts another for the tests
        # not yet run: what the earlier one recorded stays.
        self.outcomes: dict[str, dict[str, Any]] = (
            json.loads(results.read_text()) if results.exists() else {}
        )
        self.running: str | None = None
        self.lock = threading.Lock()
        threading.Thread(target=self._watch_memory, name="lgc-peer-memory", daemon=True).start()

    def _watch_memory(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        statm = Path("/proc/self/statm")
        if not statm.exists():
            return
        while True:
            time.sleep(0.2)
            resident = int(statm.read_text().split()[1]) * page
            if resident > MEMORY_LIMIT_BYTES:
                with self.lock:
                    if self.running is not None:
                        self.outcomes[self.running] = {
                            "outcome": "failed",
                            "summary": f"stopped: more than {MEMORY_LIMIT_BYTES >> 20} MB "
                            "resident (a run that does not end)",
                            "approval_asked": _approval_asked[0],
                        }
                    self._write()
                os._exit(RUNAWAY_EXIT_CODE)

    def _write(self) -> None:
        self.results.write_text(json.dumps(self.outcomes, indent=1, sort_keys=True))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        kept, dropped = [], []
        for item in items:
            if item.nodeid in self.outcomes:
                dropped.append(item)
                continue
            reason = next(
                (why for match, why in self.deselect.items() if match in item.nodeid), None
            )
            if reason is None and self.savers is not None and not _on_saver(item, self.savers):
                reason = "runs on none of the chosen savers of langgraph-cancel"
            if reason is None:
                kept.append(item)
            else:
                dropped.append(item)
                self.outcomes[item.nodeid] = {"outcome": "deselected", "reason": reason}
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        _approval_asked[0] = False
        self.running = item.nodeid
        try:
            return (yield)
        finally:
            with self.lock:
                self.running = None
                entry = self.outcomes.setdefault(item.nodeid, {"outcome": "passed"})
                entry["approval_asked"] = _approval_asked[0]
                self._write()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.outcomes.setdefault(report.nodeid, {"outcome": "passed"})
        if report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
        elif report.failed:
            entry["outcome"] = "failed" if report.when == "call" else "error"
            entry["summary"] = _summary(report)

    def pytest_sessionfinish(self) -> None:
        with self.lock:
            self._write()


def _summary(report: pytest.TestReport) -> str:
    """Where the test failed (the file and line of the crash) and what it said."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or str(report.longrepr)
    where = f"{Path(crash.path).name}:{crash.lineno}: " if crash is not None else ""
    return where + " ".join(text.split())[:300]


#: The names the saver packages' tests import LangGraph's savers by, per pass.
_REPLACED = {
    "postgres-saver": ("PostgresSaver", "AsyncPostgresSaver"),
    "sqlite-saver": ("SqliteSaver", "AsyncSqliteSaver"),
}


def pytest_collection_finish(session: pytest.Session) -> None:
    """In the saver passes, refuse to run a test module that holds LangGraph's own
    saver class under its name (imported some way the replacement missed)."""
    names = _REPLACED.get(os.environ.get("LGC_PEER_MODE", ""), ())
    modules = {id(item.module): item.module for item in session.items if hasattr(item, "module")}
    for module in modules.values():
        for name in names:
            found = getattr(module, name, None)
            if found is not None and not found.__module__.startswith("langgraph_cancel."):
                raise pytest.UsageError(f"{module.__name__}.{name} is LangGraph's, not ours")


def pytest_configure(config: pytest.Config) -> None:
    """Swap the drop-in in before the peers' test modules are imported."""
    mode = os.environ.get("LGC_PEER_MODE", "")
    if mode not in MODES:
        raise pytest.UsageError(f"LGC_PEER_MODE must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "create-agent":
        _install_create_agent()
    elif mode in ("checkpointers", "checkpointers-threaded"):
        _install_savers(config, threaded=mode == "checkpointers-threaded")
    elif mode in ("postgres-saver", "sqlite-saver"):
        _install_saver_classes(config, postgres=mode == "postgres-saver")
    else:
        _install_tool_node(classify=mode == "toolnode-classified")
    _watch_approvals()
    deselect_file = os.environ.get("LGC_PEER_DESELECT")
    deselect: dict[str, str] = {}
    if deselect_file:
        for entry in tomllib.loads(Path(deselect_file).read_text()).get("deselect", []):
            deselect[entry["test"]] = entry["reason"]
    results = Path(os.environ["LGC_PEER_RESULTS"])
    savers = {"checkpointers": chosen_savers(), "checkpointers-threaded": THREADED_SAVERS}.get(mode)
    config.pluginmanager.register(Recorder(results, deselect, savers=savers), "lgc-peer-recorder")

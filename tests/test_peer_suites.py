"""The peer-suite runner's judgement of a failure against its allowlist, and the savers
its checkpointers pass runs LangGraph's tests on."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

PEER_SUITES = Path(__file__).resolve().parent.parent / "scripts" / "peer_suites"
RUNNER = PEER_SUITES / "run.py"


def _runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peer_suites_run", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


ENTRIES = """
[[allow]]
test = "tests/test_a.py::test_race"
passes = ["toolnode-classified"]
when = "memory_assert.py:"
reason = "a race of the peer's own"

[[allow]]
test = "tests/test_a.py::test_deliberate"
passes = ["toolnode-classified"]
reason = "on purpose"
"""


def test_an_entry_with_when_allows_only_that_failure() -> None:
    run = _runner()
    allowed = run.allowlist(ENTRIES)
    race = "tests/test_a.py::test_race[memory-nested]"
    assert (
        run.allowed_as(allowed, "toolnode-classified", race, "memory_assert.py:48: AssertionError")
        == "allowed"
    )
    # The same test failing anywhere else is a failure the allowlist does not cover.
    assert (
        run.allowed_as(
            allowed, "toolnode-classified", race, "test_a.py:12: DID NOT RAISE ValidationError"
        )
        is None
    )
    assert run.allowed_as(allowed, "create-agent", race, "memory_assert.py:48: x") is None
    deliberate = "tests/test_a.py::test_deliberate"
    assert run.allowed_as(allowed, "toolnode-classified", deliberate, "anything") == "allowed"


def test_an_unclassified_failure_is_an_approval_only_where_its_classified_twin_is_clear() -> None:
    run = _runner()
    race = "tests/test_a.py::test_race[memory-nested]"
    asked = {"outcome": "failed", "approval_asked": True, "summary": "DID NOT RAISE"}
    unclassified = run.PeerPass("toolnode-unclassified", run.PREBUILT, "unclassified")

    def judged(twin: dict[str, Any], entry: dict[str, Any] = asked) -> Any:
        return run.tally(unclassified, {race: entry}, {race: twin}, run.allowlist(ENTRIES))

    assert judged({"outcome": "passed"}).approvals == [race]
    # The twin lost the peer's own race, which the allowlist allows there.
    lost_race = {"outcome": "failed", "summary": "memory_assert.py:48: AssertionError"}
    assert judged(lost_race).approvals == [race]
    # The twin failed for a reason nobody allowed: the failure here is not cleared.
    other = {"outcome": "failed", "summary": "test_a.py:12: AssertionError"}
    assert judged(other).failed and not judged(other).approvals
    assert judged({}).failed  # not run in the classified pass
    # No approval was asked here: the twin's state does not matter.
    assert judged({"outcome": "passed"}, {**asked, "approval_asked": False}).failed
    # A difference the allowlist names for this pass too is counted as deliberate first.
    deliberate = "tests/test_a.py::test_deliberate"
    both = ENTRIES.replace(
        'passes = ["toolnode-classified"]\nreason = "on purpose"',
        'passes = ["toolnode-classified", "toolnode-unclassified"]\nreason = "on purpose"',
    )
    assert both != ENTRIES
    counted = run.tally(
        unclassified,
        {deliberate: asked},
        {deliberate: {"outcome": "failed", "summary": "anything"}},
        run.allowlist(both),
    )
    assert counted.allowed == [deliberate] and not counted.approvals


def test_the_allowlist_reads_and_names_every_pass_it_covers() -> None:
    run = _runner()
    names = {peer.name for peer in run.PASSES}
    entries = run.allowlist()
    assert entries and all(entry.peer_pass in names for entry in entries)


def _plugin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peer_suites_plugin", PEER_SUITES / "plugin.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checkpointers_pass_chooses_its_savers() -> None:
    plugin = _plugin()
    assert plugin.chosen_savers("") == plugin.DEFAULT_SAVERS
    assert plugin.DEFAULT_SAVERS <= plugin.OUR_SAVERS
    assert plugin.THREADED_SAVERS <= plugin.OUR_SAVERS
    assert plugin.chosen_savers("all") == plugin.OUR_SAVERS
    assert plugin.chosen_savers(" sqlite, postgres_pipe ") == {"sqlite", "postgres_pipe"}
    assert "memory" in plugin.DEFAULT_SAVERS
    with pytest.raises(pytest.UsageError, match="memory_migrate_sends"):
        plugin.chosen_savers("sqlite,memory_migrate_sends")


def test_the_memory_fixtures_saver_is_ours_under_langgraphs_checks() -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from langgraph_cancel.checkpointers.memory import MemoryCancelSaver

    checked: list[str] = []

    class AssertImmutable(InMemorySaver):
        """Stands for LangGraph's ``MemorySaverAssertImmutable``: checks each put."""

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            checked.append(checkpoint["id"])
            return super().put(config, checkpoint, metadata, new_versions)

    fixtures = SimpleNamespace(MemorySaverAssertImmutable=AssertImmutable)
    saver_class = _plugin()._memory_saver_asserting(fixtures)
    saver = saver_class()
    assert isinstance(saver, AssertImmutable) and isinstance(saver, MemoryCancelSaver)
    saver.setup()
    assert saver.ledger.start_run("t-1").thread_id == "t-1"
    config: Any = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
    saver.put(config, empty_checkpoint(), {"step": -1}, {})
    assert checked and saver.get_tuple(config) is not None
    saver.delete_thread("t-1")
    assert saver.get_tuple(config) is None and saver.ledger.runs("t-1") == []


def test_the_checkpointers_pass_keeps_only_tests_on_a_chosen_saver() -> None:
    plugin = _plugin()

    def item(**params: str) -> SimpleNamespace:
        return SimpleNamespace(callspec=SimpleNamespace(params=params))

    chosen = frozenset({"sqlite", "postgres_aio"})
    assert plugin._on_saver(item(sync_checkpointer="sqlite", durability="sync"), chosen)
    assert plugin._on_saver(item(async_checkpointer="postgres_aio"), chosen)
    assert not plugin._on_saver(item(sync_checkpointer="postgres_pipe"), chosen)
    assert not plugin._on_saver(item(sync_checkpointer="memory"), chosen)
    assert not plugin._on_saver(item(sync_checkpointer="sqlite", cache="redis"), chosen)
    assert not plugin._on_saver(SimpleNamespace(), chosen)  # no parameters: no saver


def test_langgraphs_fixtures_get_the_server_without_a_database() -> None:
    plugin = _plugin()
    root = plugin._server_root("postgresql://postgres@127.0.0.1:5432/lgc_test")
    assert root == "postgresql://postgres@127.0.0.1:5432/"
    with pytest.raises(pytest.UsageError, match="without options"):
        plugin._server_root("postgresql://postgres@127.0.0.1:5432/db?sslmode=disable")


def test_the_saver_passes_refuse_a_module_holding_langgraphs_saver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from langgraph_cancel.checkpointers.sqlite import AsyncSqliteCancelSaver, SqliteCancelSaver

    plugin = _plugin()

    def session(**names: Any) -> Any:
        module = ModuleType("tests.test_probe")
        module.__dict__.update(names)
        return SimpleNamespace(items=[SimpleNamespace(module=module)])

    monkeypatch.setenv("LGC_PEER_MODE", "sqlite-saver")
    plugin.pytest_collection_finish(
        session(SqliteSaver=SqliteCancelSaver, AsyncSqliteSaver=AsyncSqliteCancelSaver)
    )
    with pytest.raises(pytest.UsageError, match=r"test_probe\.SqliteSaver is LangGraph's"):
        plugin.pytest_collection_finish(session(SqliteSaver=SqliteSaver))
    # Other passes do not replace the classes, so do not look.
    monkeypatch.setenv("LGC_PEER_MODE", "checkpointers")
    plugin.pytest_collection_finish(session(SqliteSaver=SqliteSaver))


def test_every_pass_runs_files_of_its_suite() -> None:
    runner = _runner()
    names = [peer.name for peer in runner.PASSES]
    assert len(names) == len(set(names))
    assert set(names) == set(_plugin().MODES)
    for peer in runner.PASSES:
        assert peer.suite.files and all(f.startswith("tests/") for f in peer.suite.files)

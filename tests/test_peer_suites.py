"""The peer-suite runner's judgement of a failure against its allowlist."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

RUNNER = Path(__file__).resolve().parent.parent / "scripts" / "peer_suites" / "run.py"


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


def test_the_allowlist_reads_and_names_every_pass_it_covers() -> None:
    run = _runner()
    names = {peer.name for peer in run.PASSES}
    entries = run.allowlist()
    assert entries and all(entry.peer_pass in names for entry in entries)

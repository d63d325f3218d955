"""Run LangGraph's and LangChain's own tests against the drop-ins and the savers.

Usage (through ``scripts/peer-suites``, which prepares the virtualenv)::

    python scripts/peer_suites/run.py [--pass NAME ...] [--keep]

For the installed versions of ``langgraph-prebuilt``, ``langchain``, ``langgraph``,
``langgraph-checkpoint-postgres`` and ``langgraph-checkpoint-sqlite`` it takes their
sdists from the package index (``pip download --no-binary :all: --no-deps``, kept in
``$LGC_PEER_CACHE``, default ``${XDG_CACHE_HOME:-~/.cache}/langgraph-cancel/peer-suites``,
and reused from there), unpacks their ``tests/`` (and the ``pyproject.toml`` that
configures pytest for them) into a temporary directory, and runs seven passes
(see ``plugin.py``):

* ``toolnode-classified``: the ToolNode tests, ``EffectToolNode`` in place of
  ``ToolNode``, every tool classified;
* ``toolnode-unclassified``: the same tests, the tools as the tests wrote them; a
  test may fail here only where langgraph-cancel asked for an approval, and only
  if it passes in the classified pass (or fails there only as the allowlist allows),
  which is why ``--pass toolnode-unclassified`` runs the classified pass too;
* ``create-agent``: LangChain's create_agent tool, HITL and middleware tests with
  ``EffectMiddleware`` added to every agent;
* ``checkpointers``: LangGraph's own graph tests (from the ``langgraph`` sdist) on our
  savers, on the PostgreSQL server ``LANGGRAPH_CANCEL_TEST_PG_DSN`` names;
* ``checkpointers-threaded``: its async graph tests on our sync savers;
* ``postgres-saver`` and ``sqlite-saver``: the saver packages' own tests (from the
  ``langgraph-checkpoint-postgres`` and ``langgraph-checkpoint-sqlite`` sdists) on our
  savers.

It prints each pass's counts and fails when a test fails that ``allowlist.toml``
does not list (each entry says why the difference is deliberate).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: The exit code of a pytest run the plugin stopped (a test that ran away).
STOPPED_RUNAWAY = 86

TOOLNODE_TESTS = [
    "tests/test_tool_node.py",
    "tests/test_on_tool_call.py",
    "tests/test_tool_node_interceptor_unregistered.py",
    "tests/test_injected_state_not_required.py",
    "tests/test_tool_node_validation_error_filtering.py",
    "tests/test_tool_call_transformer.py",
    "tests/test_react_agent.py",
]
#: Every create_agent test: its tools, middleware (human-in-the-loop among them),
#: injection, structured output, streaming and sub-agents.
AGENT_TESTS = ["tests/unit_tests/agents"]
#: LangGraph's graph tests that run on its test checkpointers (the fixtures
#: ``sync_checkpointer`` and ``async_checkpointer``).
GRAPH_TESTS = [
    "tests/test_pregel.py",
    "tests/test_pregel_async.py",
    "tests/test_interruption.py",
    "tests/test_interrupt_state.py",
    "tests/test_strict_resume.py",
    "tests/test_subgraph_persistence.py",
    "tests/test_subgraph_persistence_async.py",
    "tests/test_time_travel.py",
    "tests/test_time_travel_async.py",
    "tests/test_large_cases.py",
    "tests/test_large_cases_async.py",
    "tests/test_pydantic.py",
    "tests/test_checkpoint_migration.py",
    "tests/test_delta_channel_exit_mode.py",
    "tests/test_delta_channel_fork.py",
    "tests/test_delta_channel_parallel_order.py",
    "tests/test_delta_channel_subgraph.py",
    "tests/test_delta_channel_to_plain.py",
    "tests/test_delta_channel_update_state.py",
]


#: The PostgreSQL saver package's tests of its savers (its store tests are left out:
#: the package does not replace LangGraph's stores).
POSTGRES_SAVER_TESTS = [
    "tests/test_sync.py",
    "tests/test_async.py",
    "tests/test_prune.py",
    "tests/test_delta_pagination.py",
    "tests/test_delta_plain_value_seed.py",
    "tests/test_conformance_delta.py",
]
#: The SQLite saver package's tests of its savers (not of its stores, nor their TTL).
SQLITE_SAVER_TESTS = [
    "tests/test_sqlite.py",
    "tests/test_aiosqlite.py",
    "tests/test_delta_channel_migration.py",
    "tests/test_delta_parent_walk.py",
    "tests/test_get_delta_channel_history.py",
    "tests/test_writes_task_path_migration.py",
    "tests/test_conformance_delta.py",
]


@dataclass(frozen=True, slots=True)
class Suite:
    """A peer's sdist and the test files taken from it."""

    distribution: str
    files: list[str]

    @property
    def version(self) -> str:
        """The installed version: the one whose tests are run."""
        return version(self.distribution)

    @property
    def sdist_name(self) -> str:
        """The sdist's file name on the index."""
        return f"{self.distribution.replace('-', '_')}-{self.version}.tar.gz"


@dataclass(frozen=True, slots=True)
class PeerPass:
    """One run of a suite in one mode."""

    name: str
    suite: Suite
    description: str


@dataclass(slots=True)
class Tally:
    """What a pass came to."""

    passed: int = 0
    skipped: int = 0
    deselected: int = 0
    failed: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    open: list[str] = field(default_factory=list)
    approvals: list[str] = field(default_factory=list)


PREBUILT = Suite("langgraph-prebuilt", TOOLNODE_TESTS)
LANGCHAIN = Suite("langchain", AGENT_TESTS)
LANGGRAPH = Suite("langgraph", GRAPH_TESTS)
CHECKPOINT_POSTGRES = Suite("langgraph-checkpoint-postgres", POSTGRES_SAVER_TESTS)
CHECKPOINT_SQLITE = Suite("langgraph-checkpoint-sqlite", SQLITE_SAVER_TESTS)
PASSES = [
    PeerPass("toolnode-classified", PREBUILT, "ToolNode tests, EffectToolNode, tools classified"),
    PeerPass("toolnode-unclassified", PREBUILT, "ToolNode tests, EffectToolNode, unclassified"),
    PeerPass("create-agent", LANGCHAIN, "create_agent tests, EffectMiddleware added"),
    PeerPass("checkpointers", LANGGRAPH, "graph tests, our memory, SQLite and PostgreSQL savers"),
    PeerPass(
        "checkpointers-threaded",
        LANGGRAPH,
        "async graph tests, our sync SQLite and PostgreSQL savers in threads",
    ),
    PeerPass(
        "postgres-saver",
        CHECKPOINT_POSTGRES,
        "the saver's own tests, PostgresCancelSaver and AsyncPostgresCancelSaver",
    ),
    PeerPass(
        "sqlite-saver",
        CHECKPOINT_SQLITE,
        "the saver's own tests, SqliteCancelSaver and AsyncSqliteCancelSaver",
    ),
]


def cache_dir() -> Path:
    """Where the sdists are kept between runs (outside the work tree)."""
    explicit = os.environ.get("LGC_PEER_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "langgraph-cancel" / "peer-suites"


def sdist(suite: Suite) -> Path:
    """The suite's sdist, downloaded once."""
    cache = cache_dir()
    path = cache / suite.sdist_name
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    print(f"[peer-suites] downloading the sdist of {suite.distribution}=={suite.version}")
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--no-binary", ":all:", "--no-deps", "--dest", str(cache),
            f"{suite.distribution}=={suite.version}",
        ],
        check=True,
    )  # fmt: skip
    if not path.exists():
        raise SystemExit(f"[peer-suites] pip download did not leave {path}")
    return path


def unpack(suite: Suite, into: Path) -> Path:
    """The suite's ``tests/`` and ``pyproject.toml``, without its package sources (the
    installed package is the one under test)."""
    target = into / suite.distribution
    with tarfile.open(sdist(suite)) as archive:
        members = []
        for member in archive.getmembers():
            parts = Path(member.name).parts
            if len(parts) >= 2 and (parts[1] == "tests" or parts[1:] == ("pyproject.toml",)):
                member.name = str(Path(*parts[1:]))
                members.append(member)
        archive.extractall(target, members=members, filter="data")
    return target


def deselections(suite: Suite) -> Path:
    """The TOML file of tests left out (an outside service; failing without the
    drop-ins too), with why."""
    return HERE / "deselect.toml"


def run_pass(peer: PeerPass, root: Path, results: Path) -> int:
    """Run one pass's pytest; its outcomes land in ``results``."""
    env = {
        **os.environ,
        "LGC_PEER_MODE": peer.name,
        "LGC_PEER_RESULTS": str(results),
        "LGC_PEER_DESELECT": str(deselections(peer.suite)),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    command = [
        sys.executable, "-m", "pytest", "-p", "plugin", "-p", "no:cacheprovider",
        "--rootdir", str(root), "-c", str(root / "pyproject.toml"),
        "-o", "addopts=", "--strict-markers", "-q", "--no-header", "-rN",
        "--timeout", "120", *peer.suite.files,
    ]  # fmt: skip
    log = results.with_suffix(".log")
    recorded = -1
    with log.open("w") as out:
        while True:
            completed = subprocess.run(
                command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT
            )
            # The plugin stopped a test that ran away: go on with the others, as long
            # as each run gets further.
            if completed.returncode != STOPPED_RUNAWAY or not results.exists():
                return completed.returncode
            now = len(json.loads(results.read_text()))
            if now <= recorded:
                return completed.returncode
            recorded = now


@dataclass(frozen=True, slots=True)
class Allowed:
    """One pass's share of an ``allowlist.toml`` entry.

    Attributes:
        peer_pass: The pass it covers.
        test: The node id (without parameters: every parametrisation).
        open: A known defect, not a deliberate difference.
        when: Text the failure's summary must contain (where it failed, what it
            said); empty: any failure.
    """

    peer_pass: str
    test: str
    open: bool = False
    when: str = ""


def allowlist(text: str | None = None) -> list[Allowed]:
    """The entries of ``allowlist.toml`` (or of ``text``), one per pass each names."""
    data = tomllib.loads(text if text is not None else (HERE / "allowlist.toml").read_text())
    return [
        Allowed(name, entry["test"], bool(entry.get("open", False)), str(entry.get("when", "")))
        for entry in data.get("allow", [])
        if entry.get("reason")
        for name in entry["passes"]
    ]


def allowed_as(allowed: list[Allowed], name: str, test: str, summary: str = "") -> str | None:
    """``"allowed"`` or ``"open"`` when ``test`` failing in pass ``name`` (as ``summary``
    says) is on the allowlist, else None."""
    for entry in allowed:
        if (
            name == entry.peer_pass
            and (test == entry.test or test.startswith(f"{entry.test}["))
            and entry.when in summary
        ):
            return "open" if entry.open else "allowed"
    return None


def _clear_when_classified(allowed: list[Allowed], test: str, twin: dict[str, Any]) -> bool:
    """Whether ``test`` is clear in the classified pass (``twin``, its outcome there):
    passed, or failed only as the allowlist allows (a deliberate difference or a race
    of the peer's own, not an open defect), so its unclassified failure, where an
    approval was asked, is that approval's doing."""
    if twin.get("outcome") == "passed":
        return True
    if twin.get("outcome") != "failed":
        return False
    summary = twin.get("summary", "")
    return allowed_as(allowed, "toolnode-classified", test, summary) == "allowed"


def tally(
    peer: PeerPass,
    outcomes: dict[str, Any],
    classified: dict[str, Any] | None,
    allowed: list[Allowed] | None = None,
) -> Tally:
    """Count a pass, judging each failure (against ``allowed``, default the allowlist's
    entries)."""
    allowed = allowlist() if allowed is None else allowed
    result = Tally()
    for test, entry in sorted(outcomes.items()):
        outcome = entry["outcome"]
        if outcome == "passed":
            result.passed += 1
        elif outcome == "skipped":
            result.skipped += 1
        elif outcome == "deselected":
            result.deselected += 1
        elif (
            verdict := allowed_as(allowed, peer.name, test, entry.get("summary", ""))
        ) is not None:
            (result.open if verdict == "open" else result.allowed).append(test)
        elif (
            classified is not None
            and entry.get("approval_asked")
            and _clear_when_classified(allowed, test, classified.get(test, {}))
        ):
            result.approvals.append(test)
        else:
            result.failed.append(f"{test}: {entry.get('summary', outcome)}")
    return result


def describe(peer: PeerPass) -> str:
    """The pass's description; the checkpointers pass names the savers it ran on."""
    if peer.name != "checkpointers":
        return peer.description
    from plugin import chosen_savers

    return f"{peer.description}: {', '.join(sorted(chosen_savers()))}"


def main() -> int:
    """Run the passes, print their counts, exit 1 on a failure not allowed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pass", dest="passes", action="append", choices=[p.name for p in PASSES])
    parser.add_argument("--keep", action="store_true", help="keep the unpacked tests and logs")
    options = parser.parse_args()
    wanted = set(options.passes or [p.name for p in PASSES])
    if "toolnode-unclassified" in wanted:
        # Its failures are judged against the classified pass's outcomes.
        wanted.add("toolnode-classified")
    chosen = [p for p in PASSES if p.name in wanted]
    work = Path(tempfile.mkdtemp(prefix="lgc-peer-suites-"))
    roots: dict[str, Path] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    bad = False
    try:
        for peer in chosen:
            if peer.suite.distribution not in roots:
                roots[peer.suite.distribution] = unpack(peer.suite, work)
            results = work / f"{peer.name}.json"
            code = run_pass(peer, roots[peer.suite.distribution], results)
            if not results.exists():
                print(f"[peer-suites] {peer.name}: pytest exited {code} with no results:")
                print(results.with_suffix(".log").read_text()[-4000:])
                bad = True
                continue
            outcomes[peer.name] = json.loads(results.read_text())
            classified = (
                outcomes.get("toolnode-classified")
                if peer.name == "toolnode-unclassified"
                else None
            )
            counts = tally(peer, outcomes[peer.name], classified)
            failed = (
                len(counts.failed) + len(counts.allowed) + len(counts.open) + len(counts.approvals)
            )
            print(
                f"[peer-suites] {peer.name} ({peer.suite.distribution} {peer.suite.version}, "
                f"{describe(peer)}): {counts.passed} passed, {failed} failed "
                f"({len(counts.approvals)} approval interrupts, {len(counts.allowed)} deliberate, "
                f"{len(counts.open)} open, {len(counts.failed)} not allowed), "
                f"{counts.skipped} skipped, {counts.deselected} deselected"
            )
            for test in counts.open:
                print(f"[peer-suites]   OPEN {test} (allowlist.toml says why)")
            for line in counts.failed:
                print(f"[peer-suites]   NOT ALLOWED {line}")
            if code not in (0, 1) and not counts.failed:
                print(f"[peer-suites] {peer.name}: pytest exited {code}")
                print(results.with_suffix(".log").read_text()[-4000:])
                bad = True
            bad = bad or bool(counts.failed)
    finally:
        if options.keep:
            print(f"[peer-suites] kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"[peer-suites] {'FAILED' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The package's layers: a module imports only from its own layer or the ones below.

``docs/architecture.md`` draws the same table. Every import counts, function-local
ones included (an import deferred for start-up time is still a dependency); only
imports under ``if TYPE_CHECKING:`` are left out, since they never run. A name taken
from the package root (``from langgraph_cancel import add_cancellation``) counts as
an import of the module the root loads it from on first use. A new module must be
placed in a layer here before it can pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import langgraph_cancel

PACKAGE = "langgraph_cancel"
PACKAGE_DIR = Path(langgraph_cancel.__file__).parent
#: Where each public name of the package root comes from (loaded on first use).
EXPORTS: dict[str, str] = langgraph_cancel._EXPORTS

#: Bottom to top. A module belongs to the layer of the longest prefix naming it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "vocabulary",
        (
            "",
            "errors",
            "types",
            "urls",
            "workers",
            "process",
            "progress",
            "effects",
            "hooks",
            "ordering",
        ),
    ),
    (
        "storage",
        (
            "ledger",
            "ledgers",
            "limits",
            "report",
            "checkpointers",
            "compensation",
            "window",
            "offloop",
        ),
    ),
    ("runtime", ("runtime", "subagents", "api")),
    ("execution", ("execution",)),
    ("nodes", ("nodes",)),
    ("graph", ("graph", "lifecycle", "thread_state")),
    (
        "integrations",
        (
            "middleware",
            "agents",
            "recovery",
            "sweeper",
            "sweep_effects",
            "sweep_pass",
            "sweep_summary",
            "sweep_threads",
            "outbox",
        ),
    ),
    ("operations", ("metrics", "follow", "telemetry", "testing")),
    ("applications", ("demo",)),
    ("command line", ("cli", "demo.__main__")),
)


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of a module of the package (``""`` is the package root)."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            names_it = module == prefix or (prefix and module.startswith(prefix + "."))
            if names_it and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    if best is None:
        raise LookupError(f"{PACKAGE}.{module} is in no layer: place it in LAYERS")
    return best[1]


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def runtime_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module relative to the package) of each import of the package that runs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str]] = []
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in type_only or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            names = [EXPORTS.get(alias.name, PACKAGE) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                found.append((node.lineno, name.removeprefix(PACKAGE).removeprefix(".")))
    yield from sorted(found)


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for module, _ in modules():
        try:
            layer_of(module)
        except LookupError as exc:
            unplaced.append(str(exc))
    assert not unplaced, "\n".join(unplaced)


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = []
    for module, path in modules():
        own = layer_of(module)
        for line, imported in runtime_imports(path):
            target = layer_of(imported)
            if target > own:
                upward.append(
                    f"{path.relative_to(PACKAGE_DIR.parent)}:{line}: {module or PACKAGE} "
                    f"({LAYERS[own][0]}) imports {imported or PACKAGE} ({LAYERS[target][0]})"
                )
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from langgraph_cancel.cli import render\n"
        "def late():\n"
        "    from langgraph_cancel.graph import add_cancellation\n"
        "from langgraph_cancel import Ledger, __version__\n"
    )
    found = list(runtime_imports(source))
    assert found == [(5, "graph"), (6, ""), (6, "ledger")]
    assert layer_of("graph") > layer_of("ledger.core")
    with pytest.raises(LookupError):
        layer_of("no_such_module")


def test_the_architecture_page_draws_these_layers() -> None:
    page = (PACKAGE_DIR.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {
        line.split("|")[1].strip(): line
        for line in page.splitlines()
        if line.startswith("| ") and line.count("|") >= 4
    }
    for name, prefixes in LAYERS:
        assert name in rows, name
        for prefix in prefixes:
            assert f"`{prefix or PACKAGE}`" in rows[name], (name, prefix)

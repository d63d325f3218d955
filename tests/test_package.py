"""The package's top level: every public name resolves, none of them imported eagerly;
the lower bounds of its requirements, as the README states them."""

from __future__ import annotations

import subprocess
import sys

import pytest

import langgraph_cancel
from cli_util import cli_env


def test_every_public_name_resolves() -> None:
    for name in langgraph_cancel.__all__:
        assert getattr(langgraph_cancel, name) is not None, name
    assert set(langgraph_cancel.__all__) <= set(dir(langgraph_cancel))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'EffectNode'"):
        _ = langgraph_cancel.EffectNode


def test_star_import_gives_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from langgraph_cancel import *", namespace)
    assert {"EffectToolNode", "Ledger", "add_cancellation", "request_cancel"} <= set(namespace)


def test_importing_the_package_imports_no_langgraph() -> None:
    probe = (
        "import sys, langgraph_cancel, langgraph_cancel.errors, langgraph_cancel.urls\n"
        "print(sorted(m for m in ('langgraph', 'langchain_core', 'pydantic') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=cli_env(), capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
    from langgraph_cancel.cli.config import version

    assert version() == langgraph_cancel.__version__


#: How the README names each requirement whose lower bound it states.
README_NAMES = {
    "langgraph": "LangGraph",
    "langgraph-prebuilt": "langgraph-prebuilt",
    "langchain": "LangChain",
    "langgraph-checkpoint-postgres": "langgraph-checkpoint-postgres",
    "langgraph-checkpoint-sqlite": "langgraph-checkpoint-sqlite",
    "psycopg": "psycopg",
    "pydantic": "pydantic",
}


def _lower_bounds() -> dict[str, str]:
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    project = tomllib.loads(
        (Path(langgraph_cancel.__file__).parents[1] / "pyproject.toml").read_text()
    )["project"]
    lines = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        lines.extend(line for line in extra if not line.startswith("langgraph-cancel"))
    bounds: dict[str, str] = {}
    for line in lines:
        requirement = Requirement(line)
        for spec in requirement.specifier:
            if spec.operator == ">=":
                bounds[requirement.name] = spec.version
    return bounds


def test_the_readme_states_the_lower_bounds_pyproject_declares() -> None:
    from pathlib import Path

    readme = " ".join(
        (Path(langgraph_cancel.__file__).parents[1] / "README.md").read_text().split()
    )
    bounds = _lower_bounds()
    stated = {name: f"{shown} {bounds[name]}" for name, shown in README_NAMES.items()}
    assert {name: text for name, text in stated.items() if text not in readme} == {}

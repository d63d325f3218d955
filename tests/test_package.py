"""The package's top level: every public name resolves, none of them imported eagerly."""

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

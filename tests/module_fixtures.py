"""Fixtures for test modules that share one database per backend across their tests.

Import them into a test module (``from module_fixtures import db_url_fixture,
...``: pytest registers the fixtures it finds in a module's namespace, under their
``name=``). Its ``db_url`` then overrides conftest's per-test one with a
module-scoped database, and ``saver`` is opened once on it. Tests stay apart by
using threads of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from graphs import ExecutionLog, backend_params, module_database, open_saver
from langgraph_cancel.demo import tools as refund_tools
from langgraph_cancel.demo.services import Providers


@pytest.fixture(name="providers_path")
def providers_path_fixture(tmp_path: Path) -> Iterator[str]:
    """The providers' SQLite file (refund agent systems + the execution log)."""
    path = str(tmp_path / "providers.db")
    Providers(path)
    refund_tools.set_providers_path(path)
    try:
        yield path
    finally:
        refund_tools.set_providers_path(None)


@pytest.fixture(name="log")
def log_fixture(providers_path: str) -> ExecutionLog:
    """What the test tools did, in the providers' file."""
    return ExecutionLog(providers_path)


@pytest.fixture(name="db_url", scope="module", params=backend_params())
def db_url_fixture(request: pytest.FixtureRequest) -> Iterator[str]:
    """memory, SQLite, PostgreSQL: one database per module (tests use their own threads)."""
    with module_database(request) as url:
        yield url


@pytest.fixture(name="saver", scope="module")
def saver_fixture(db_url: str) -> Iterator[Any]:
    """The cancel-aware saver on the module's database."""
    with open_saver(db_url) as saver:
        yield saver

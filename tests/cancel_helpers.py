"""Helpers shared by the cancellation protocol tests (``test_cancel*.py``).

Import the fixture into a test module (``from cancel_helpers import
url_ledgers_fixture``: pytest registers the fixtures it finds in a module's
namespace, under their ``name=``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from graphs import config_for
from langgraph_cancel import CancellationReport

TIMEOUT = 60.0


@pytest.fixture(name="url_ledgers")
def url_ledgers_fixture() -> Iterator[list[str]]:
    """URLs given to the API in this test; their process-wide ledgers are closed after it."""
    urls: list[str] = []
    yield urls
    from langgraph_cancel.ledgers import forget_url

    for url in urls:
        forget_url(url)


def state_report(graph: Any, thread_id: str) -> CancellationReport:
    values = graph.get_state(config_for(thread_id)).values
    return CancellationReport.model_validate(values["cancellation_report"])

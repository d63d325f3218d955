"""Hypothesis profiles of the property and fuzz suites: ``ci`` and ``dev``.

``ci`` (the default under ``CI=true``, which ``.ci/run`` sets): derandomized,
so every CI run tries the same examples, and more of them. ``dev`` (the
default elsewhere): random, fewer examples, failures remembered in a
directory under the system's temporary directory (not in the work tree).
Choose one explicitly with ``HYPOTHESIS_PROFILE=ci|dev``; ``LGC_EXAMPLES=N`` runs
N examples per test instead (a longer soak).

A test states its budget as ``examples(ci=..., dev=...)``: its examples are
whole agent runs, far more expensive than Hypothesis' usual inputs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=100,
    print_blob=True,
    suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=25,
    print_blob=True,
    database=DirectoryBasedExampleDatabase(
        str(Path(tempfile.gettempdir()) / "langgraph-cancel-hypothesis")
    ),
    suppress_health_check=_SLOW_OK,
)


def in_ci() -> bool:
    """True under ``CI=true`` (or ``1``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "").strip() or ("ci" if in_ci() else "dev")
settings.load_profile(PROFILE)


def examples(*, ci: int, dev: int) -> int:
    """A test's number of examples under the loaded profile (``LGC_EXAMPLES=N`` overrides)."""
    forced = os.environ.get("LGC_EXAMPLES", "").strip()
    if forced:
        return int(forced)
    return ci if PROFILE == "ci" else dev


__all__ = ["PROFILE", "examples", "in_ci"]

"""The documentation says what the code does: the README's Quickstart runs, the design's
lifecycle tables are the state machines of ``langgraph_cancel.types``, and every page
the README links to exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli_util import cli_env
from langgraph_cancel.types import EFFECT_TRANSITIONS, RUN_TRANSITIONS, EffectStatus, RunStatus

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _table_after(text: str, marker: str) -> dict[str, set[str]]:
    """``| from | to |`` rows of the first table after ``marker``: names, comma-separated."""
    rows: dict[str, set[str]] = {}
    lines = text[text.index(marker) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| from | to |"))
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        sources, targets = (cell.strip() for cell in line.strip("|").split("|"))
        names = set(re.findall(r"`([a-z_]+)`", targets))
        for source in re.findall(r"`([a-z_]+)`", sources):
            rows[source] = names
    return rows


def test_readme_quickstart_runs(tmp_path: Path) -> None:
    block = re.search(r"```python\n(.*?)```", _section(README.read_text(), "Quickstart"), re.S)
    assert block is not None, "the Quickstart has no python block"
    script = tmp_path / "quickstart.py"
    script.write_text(block.group(1))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # What the comment in the block says it prints.
    assert done.stdout == "completed 1 issue_refund is permanent; 0 steps not run\n"
    assert (tmp_path / "agent.db").is_file()


def test_design_effect_lifecycle_is_the_code() -> None:
    documented = _table_after(DESIGN.read_text(), "Every allowed transition")
    actual = {s.value: {t.value for t in targets} for s, targets in EFFECT_TRANSITIONS.items()}
    assert documented == actual
    assert set(documented) == {s.value for s in EffectStatus}


def test_design_run_lifecycle_is_the_code() -> None:
    documented = _table_after(DESIGN.read_text(), "**Run lifecycle**")
    actual = {s.value: {t.value for t in targets} for s, targets in RUN_TRANSITIONS.items()}
    assert documented == actual
    assert set(documented) == {s.value for s in RunStatus}


@pytest.mark.parametrize(
    "page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_relative_links_resolve(page: Path) -> None:
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_no_page_cites_a_missing_design_file() -> None:
    cited = []
    for folder in ("langgraph_cancel", "tests", "benchmarks", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".md") or path == Path(__file__).resolve():
                continue
            if "DESIGN.md" in path.read_text():
                cited.append(os.fspath(path.relative_to(ROOT)))
    assert cited == [], f"cite docs/design.md instead: {cited}"

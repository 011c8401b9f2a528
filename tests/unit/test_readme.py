"""The README stays short and points into the manual: at most 150 lines, the two set-up commands,
and a link to every page of docs/ (each of which exists)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 150


def test_the_two_set_up_commands_are_there_as_they_run() -> None:
    local = (
        "python3 -m venv .venv && .venv/bin/pip install '.[worker]' && "
        ".venv/bin/orchestrate up inventory/local.yaml"
    )
    assert local in README
    assert "bash scripts/test.sh" in README
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()  # what CI runs


def test_every_link_resolves_and_every_page_of_the_manual_is_linked() -> None:
    targets = {m.group(1) for m in LINK.finditer(README) if "://" not in m.group(1)}
    missing = [t for t in sorted(targets) if not (ROOT / t).exists()]
    assert missing == []
    # benchmarks.md and containers.md only include bench/README.md and docker/README.md.
    included = {"docs/benchmarks.md": "bench/README.md", "docs/containers.md": "docker/README.md"}
    for page in sorted((ROOT / "docs").glob("*.md")):
        name = str(page.relative_to(ROOT))
        assert included.get(name, name) in targets, f"README links no {name}"

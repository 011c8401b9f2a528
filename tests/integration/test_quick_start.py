"""The quick start as README.md and docs/getting-started.md write it: `orchestrate up
inventory/local.yaml` from the repository, for a user whose home holds no earlier run, trains
the bundled example to its target, exits 0 and leaves the exported model where they say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env

REPO = Path(__file__).resolve().parents[2]
COMMAND = ".venv/bin/orchestrate up inventory/local.yaml"


@pytest.mark.tf
def test_the_quick_start_trains_the_bundled_example_as_the_docs_say(tmp_path: Path) -> None:
    for page in ("README.md", "docs/getting-started.md"):
        assert COMMAND in (REPO / page).read_text(encoding="utf-8"), page
    home = tmp_path / "home"
    home.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--state-dir", str(tmp_path / "state"),
         *COMMAND.split()[1:]],
        cwd=REPO, env=clean_env(HOME=str(home)), capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    said = result.stdout + result.stderr
    assert re.search(r"job shapes succeeded at step 300; val_loss \S+ val_accuracy \S+", said), said
    assert (home / "orchestrate" / "shapes" / "export" / "model.keras").is_file()

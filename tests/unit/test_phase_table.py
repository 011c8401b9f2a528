"""scripts/phase_table.py: the table at the end of scripts/test.sh, from a real phase log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import phase_log

REPO = Path(__file__).resolve().parents[2]


def test_lanes_are_summed_and_a_cut_line_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "phases.jsonl"
    monkeypatch.setenv(phase_log.PHASE_LOG_VARIABLE, str(log))
    start = 1_000_000.0
    phase_log.record("setup", "apt packages", start, start + 50)
    phase_log.record("test", "tf", start + 100, start + 400)
    phase_log.record("test", "tf", start + 400, start + 460)
    phase_log.record("test", "-", start + 100, start + 110)
    phase_log.record("cluster", "Slurm cluster started", start + 120, start + 150)
    with log.open("a") as file:
        file.write('{"kind": "test", "na')  # a writer killed mid-line

    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "phase_table.py"), str(log), str(start)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip

    lines = result.stdout.splitlines()[2:]
    rows = {line.split("  ")[0].strip(): line.split()[-3:] for line in lines}
    assert rows["apt packages"] == ["0", "50", "50"]
    assert rows["lane tf: 2 tests, 360 s in tests"] == ["100", "460", "360"]
    assert rows["tests of no lane (any free worker): 1 tests, 10 s in tests"] == [
        "100",
        "110",
        "10",
    ]
    assert rows["Slurm cluster started"] == ["120", "150", "30"]
    # The script's own phases come first, the lanes after the clusters.
    names = list(rows)
    assert (
        names.index("apt packages")
        < names.index("Slurm cluster started")
        < names.index("lane tf: 2 tests, 360 s in tests")
    )


def test_without_the_variable_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(phase_log.PHASE_LOG_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    with phase_log.phase("cluster", "nothing"):
        pass
    assert list(tmp_path.iterdir()) == []

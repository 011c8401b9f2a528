"""scripts/phase_table.py: the table at the end of scripts/test.sh, from a real phase log."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import phase_log
from tests.lanecpu import CPUACCT, LaneCpu

REPO = Path(__file__).resolve().parents[2]
START = 1_000_000.0


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The phase log that phase_log.record writes to in this test."""
    path = tmp_path / "phases.jsonl"
    monkeypatch.setenv(phase_log.PHASE_LOG_VARIABLE, str(path))
    return path


def table_of(log: Path) -> str:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "phase_table.py"), str(log), str(START)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def test_lanes_are_summed_and_a_cut_line_is_left_out(log: Path) -> None:
    start = START
    phase_log.record("setup", "apt packages", start, start + 50)
    phase_log.record("test", "tf", start + 100, start + 400)
    phase_log.record("test", "tf", start + 400, start + 460)
    phase_log.record("test", "-", start + 100, start + 110)
    phase_log.record("cluster", "Slurm cluster started", start + 120, start + 150)
    with log.open("a") as file:
        file.write('{"kind": "test", "na')  # a writer killed mid-line

    lines = table_of(log).splitlines()[2:]
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


def test_each_tests_cpu_is_summed_per_lane_and_the_costliest_are_named(log: Path) -> None:
    phase_log.record("test", "tf", START, START + 50, test="a.py::cheap", cpu=3.0)
    phase_log.record("test", "tf", START + 50, START + 90, test="a.py::dear", cpu=70.4)
    phase_log.record("test", "netns", START, START + 30, test="b.py::middle", cpu=20.0)

    shown = table_of(log)
    assert "lane tf: 2 tests, 90 s in tests, 73 s of CPU" in shown
    most = shown.split("--- the 3 tests that took the most CPU, of 3\n")[1].splitlines()
    assert [line.split()[-1] for line in most[1:]] == ["a.py::dear", "b.py::middle", "a.py::cheap"]
    assert most[1].split()[:3] == ["70", "40", "tf"]


@pytest.mark.root
@pytest.mark.skipif(not CPUACCT.is_dir(), reason="no cgroup v1 cpuacct hierarchy on this machine")
def test_a_tests_cpu_counts_a_process_that_detached(tmp_path: Path) -> None:
    lane = LaneCpu()
    lane.join("unit-test")
    group = lane.cgroup
    assert group is not None and group.is_dir()
    done = tmp_path / "done"
    # A grandchild in a session of its own, as a minder or a detached supervisor is: it spends
    # half a second of CPU after its parent has exited.
    burn = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    began = time.process_time()\n"
        "    while time.process_time() - began < 0.5: pass\n"
        "    open(sys.argv[1], 'w').close()\n"
        "    os._exit(0)\n"
    )
    try:
        before = lane.used()
        subprocess.run([sys.executable, "-c", burn, str(done)], check=True)
        deadline = time.monotonic() + 30
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        used = lane.used()
        assert before is not None and used is not None
        assert used - before >= 0.5
    finally:
        lane.leave()
    assert not group.exists()
    assert lane.used() is None

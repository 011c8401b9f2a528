"""The agent's `watch` (issue 31): the wait between two polls ends the moment a watched worker
exits, at once for one that ended already, and at its timeout otherwise. Real processes: a
stand-in supervisor whose command line names its run directory, as the agent's does."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from orchestrator.machines.remote import agent


def supervisor(run_dir: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run_dir)])
    (run_dir / "pid").write_text(str(process.pid))
    (run_dir / "worker.pid").write_text(str(process.pid))
    deadline = time.monotonic() + 10  # until its exec: before it, /proc shows pytest's argv
    while not agent._is_our_supervisor(process.pid, str(run_dir)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return process


def test_a_watched_exit_ends_the_wait_at_once(tmp_path: Path) -> None:
    process = supervisor(tmp_path)
    answers: list[tuple[dict[str, object], float]] = []

    def watch() -> None:
        answer = agent.cmd_watch({"run_dirs": [str(tmp_path)], "timeout": 30})
        answers.append((answer, time.monotonic()))

    try:
        thread = threading.Thread(target=watch)
        thread.start()
        time.sleep(0.3)
        assert not answers  # still waiting: the worker runs
        process.kill()
        killed = time.monotonic()
        process.wait()
        thread.join(timeout=20)
    finally:
        process.kill()
    ((answer, at),) = answers
    assert answer == {"changed": True}
    assert at - killed < 10  # long before the 30 s timeout


def test_an_ended_worker_is_told_at_once_and_a_running_one_waits_out_the_timeout(
    tmp_path: Path,
) -> None:
    ended, running = tmp_path / "ended", tmp_path / "running"
    ended.mkdir()
    running.mkdir()
    (ended / "exit.json").write_text("{}")
    process = supervisor(running)
    try:
        assert agent.cmd_watch({"run_dirs": [str(ended)], "timeout": 30}) == {"changed": True}
        start = time.monotonic()
        assert agent.cmd_watch({"run_dirs": [str(running)], "timeout": 0.3}) == {"changed": False}
        assert time.monotonic() - start >= 0.3
    finally:
        process.kill()
        process.wait()

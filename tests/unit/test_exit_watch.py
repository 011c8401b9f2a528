"""The agent's `watch` (issue 31): the wait between two polls ends the moment a watched worker
exits, at once for one that ended already, and at its timeout otherwise. Real processes: a
stand-in supervisor whose command line names its run directory, as the agent's does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from orchestrator.hostside import control, protocol
from orchestrator.machines.hostclient import HostAgent
from orchestrator.machines.runner import LocalRunner
from tests.fakes.backend import FakeBackend


def supervisor(run_dir: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run_dir)])
    (run_dir / "pid").write_text(str(process.pid))
    (run_dir / "worker.pid").write_text(str(process.pid))
    deadline = time.monotonic() + 10  # until its exec: before it, /proc shows pytest's argv
    while not control.is_our_minder(process.pid, str(run_dir)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return process


def test_a_watched_exit_ends_the_wait_at_once(tmp_path: Path) -> None:
    process = supervisor(tmp_path)
    answers: list[tuple[dict[str, object], float]] = []

    def watch() -> None:
        answer = control.cmd_watch({"run_dirs": [str(tmp_path)], "timeout": 30})
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
        assert control.cmd_watch({"run_dirs": [str(ended)], "timeout": 30}) == {"changed": True}
        start = time.monotonic()
        assert control.cmd_watch({"run_dirs": [str(running)], "timeout": 0.3}) == {"changed": False}
        assert time.monotonic() - start >= 0.3
    finally:
        process.kill()
        process.wait()


def test_a_line_on_the_session_wakes_a_long_watch_and_the_session_goes_on(tmp_path: Path) -> None:
    """The real agent program in a real session: a watch of a running worker for 30 s ends as
    soon as the controller writes a `wake` line (down's stop request), answers that it was
    woken, and the session then answers the next request (the wake itself gets no answer)."""
    process = supervisor(tmp_path)
    session = HostAgent(LocalRunner("here"), sys.executable).session()
    answers: list[tuple[dict[str, object], float]] = []

    def watch() -> None:
        answer = session.request({"verb": "watch", "run_dirs": [str(tmp_path)], "timeout": 30}, 35)
        answers.append((answer, time.monotonic()))

    try:
        assert "home" in session.request({"verb": "info"}, 30)  # the program has started
        thread = threading.Thread(target=watch)
        thread.start()
        time.sleep(0.5)
        assert not answers  # the worker runs: the watch waits
        woke = time.monotonic()
        session.notify({"verb": "wake"})
        thread.join(timeout=20)
        ((answer, at),) = answers
        assert answer == {"changed": False, "woken": True}
        assert at - woke < 5  # long before the watch's 30 s
        session.notify({"verb": "wake"})  # a late wake, after the watch ended: no answer
        assert "home" in session.request({"verb": "info"}, 10)  # and no answer out of step
    finally:
        session.close()
        process.kill()
        process.wait()


def test_a_wake_already_sent_ends_the_watch_that_follows_it_at_once(tmp_path: Path) -> None:
    """The wake written just after the watch request (both in the agent's input at once)."""
    process = supervisor(tmp_path)
    read, write = os.pipe()
    os.write(write, b'{"verb": "wake"}\n')
    lines = protocol.RequestLines.serving = protocol.RequestLines(read)
    try:
        assert next(iter(lines)) == '{"verb": "wake"}'  # read: nothing pending now
        os.write(write, b'{"verb": "wake"}\n')
        start = time.monotonic()
        answer = control.cmd_watch({"run_dirs": [str(tmp_path)], "timeout": 30})
        assert answer == {"changed": False, "woken": True}
        assert time.monotonic() - start < 5
        os.close(write)  # and the end of input wakes it too
        protocol.RequestLines.serving = protocol.RequestLines(read)
        assert control.cmd_watch({"run_dirs": [str(tmp_path)], "timeout": 30})["woken"] is True
    finally:
        protocol.RequestLines.serving = None
        os.close(read)
        process.kill()
        process.wait()


def test_the_polling_wait_ends_when_woken_and_lasts_its_timeout_otherwise() -> None:
    """Backend.wait_for_change's default (Slurm, hosts that cannot push): the poll's sleep,
    which the stop flag's look (`woken`) ends within a tick."""
    backend = FakeBackend()
    flag = threading.Event()
    threading.Timer(0.2, flag.set).start()
    start = time.monotonic()
    assert backend.wait_for_change([], 30, flag.is_set) is False
    assert 0.2 <= time.monotonic() - start < 5
    start = time.monotonic()
    assert backend.wait_for_change([], 0.3) is False
    assert time.monotonic() - start >= 0.3


def test_a_process_seen_first_gets_its_cpu_share_over_its_life() -> None:
    assert control.average_percent(1.0, 4.0) == 25.0
    assert control.average_percent(3.0, 2.0) == 150.0  # two threads busy
    assert control.average_percent(1.0, 0.0) == 0.0

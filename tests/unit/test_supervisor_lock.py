"""A supervisor starting while `status` looks at its run's lock (held_elsewhere takes it for an
instant) still gets it: FileLock.wait tries again for a while. A real holder in another
process holds it past that."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from orchestrator.engine.supervision.locks import FileLock

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def holder(path: Path, seconds: float) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_lock_held_for_an_instant_is_acquired_once_let_go(tmp_path: Path) -> None:
    path = tmp_path / "state" / "run.lock"
    path.parent.mkdir(mode=0o700)
    brief = holder(path, 0.3)
    lock = FileLock(path)
    assert not lock.acquire()  # what the supervisor did before: it gave up at once
    assert lock.wait(5.0)
    lock.release()
    brief.wait(10)


def test_a_lock_held_longer_than_the_patience_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state" / "run.lock"
    path.parent.mkdir(mode=0o700)
    long = holder(path, 30)
    try:
        started = time.monotonic()
        assert not FileLock(path).wait(0.5)
        assert 0.5 <= time.monotonic() - started < 5
        assert FileLock(path).held_elsewhere()
    finally:
        long.kill()
        long.wait(10)

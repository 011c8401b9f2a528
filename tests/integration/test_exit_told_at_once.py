"""A worker's exit is told by its host the moment it happens, not at the supervisor's next poll
(issue 31): with the poll interval set far above it, a SIGKILLed worker is still seen at once."""

from __future__ import annotations

import os
import signal
import time

from tests.conftest import Cli
from tests.integration.test_supervision import make_job, worker_pid

INTERVAL = 60  # seconds between the supervisor's polls: far longer than the whole test


def test_sigkilled_worker_is_seen_long_before_the_next_poll(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, {}, STEPS=60)
    up = cli.popen("up", "--skip-checks", "--interval", str(INTERVAL), "inv.yaml")
    try:
        pid = worker_pid(cli, "beta")
        time.sleep(0.5)  # past the supervisor's first poll of the running workers
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        out, err = up.communicate(timeout=INTERVAL)  # the second attempt's end is told too
    finally:
        up.kill()
    reaper.append(cli.record()["run_id"])
    assert up.returncode == 0, (out, err)
    assert "killed by SIGKILL; restarting the cluster (1/3)" in out, (out, err)
    assert "succeeded at step 60 after 1 restart(s)" in err, (out, err)
    seen_after = cli.status()["last_restart"]["at"] - killed_at
    assert 0 <= seen_after < INTERVAL / 6, seen_after

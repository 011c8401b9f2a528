"""A worker's exit is told by its host the moment it happens, not at the supervisor's next poll
(issue 31): with the poll interval set far above it, a SIGKILLed worker is still seen at once."""

from __future__ import annotations

import time
from typing import Any

from tests.conftest import Cli, snapshot_when, suspend_workers
from tests.integration.test_supervision import make_job, stepping

INTERVAL = 60  # seconds between the supervisor's polls: far longer than the whole test


def polled(status: dict[str, Any]) -> bool:
    """The supervisor's poll saw every worker launched: then it waits in its watch."""
    return bool(status["workers"]) and all(w["pid"] for w in status["workers"])


def test_sigkilled_worker_is_seen_long_before_the_next_poll(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, {}, STEPS=60)
    up = cli.popen("up", "--skip-checks", "--interval", str(INTERVAL), "inv.yaml")
    try:
        # beta held from its first step (its pid cannot be gone before the kill), past the
        # supervisor's first poll of the launched workers.
        (beta,) = suspend_workers([stepping(cli, "beta")])
        snapshot_when(cli, polled, timeout=60)
        killed_at = time.time()
        beta.kill()
        out, err = up.communicate(timeout=INTERVAL)  # the second attempt's end is told too
    finally:
        up.kill()
    reaper.append(cli.record()["run_id"])
    assert up.returncode == 0, (out, err)
    assert "killed by SIGKILL; restarting the cluster (1/3)" in out, (out, err)
    assert "succeeded at step 60 after 1 restart(s)" in err, (out, err)
    seen_after = cli.status()["last_restart"]["at"] - killed_at
    assert 0 <= seen_after < INTERVAL / 6, seen_after


def test_down_wakes_the_long_watch_and_the_supervisor_stops_the_workers(
    cli: Cli, reaper: list[str]
) -> None:
    """The wait between two polls is one watch per machine for the whole interval (60 s here):
    `down`'s stop request wakes it at once, so the supervisor itself carries the request out
    over its sessions (it says so in up's output) instead of `down` giving up on it after its
    pickup timeout and stopping the workers from its own shell."""
    make_job(cli, {}, STEPS=100_000)
    up = cli.popen("up", "--skip-checks", "--interval", str(INTERVAL), "inv.yaml")
    try:
        reaper.append(cli.status_when(bool, timeout=30)["run_id"])
        snapshot_when(cli, polled, timeout=60)  # the supervisor waits in its watch
        asked = time.monotonic()
        down = cli("down", check=True)
        took = time.monotonic() - asked
        out, err = up.communicate(timeout=INTERVAL)
    finally:
        up.kill()
    assert "stopping the workers for 'orchestrate down'" in out + err, (out, err, down.stdout)
    assert "the run was stopped by 'orchestrate down'" in err, (out, err)
    assert took < INTERVAL / 4, took  # not a watch's whole length

"""job.linger on real processes with real TensorFlow (local simulation): the next `up` of the
bundled example starts its workers from the standbys the last run left lingering (the same
pids) and trains to its target; a changed job.env discards them for a cold start saying why in
the worker's log; `down` of a finished run leaves no process behind."""

from __future__ import annotations

import re
from typing import Any

import psutil
import pytest

from tests.conftest import Cli, local_tf_inventory

pytestmark = pytest.mark.tf

STEPS = 20  # per run: each `up` trains STEPS more from the last one's checkpoint


def leftovers(cli: Cli) -> list[str]:
    """Live processes of this test's job: standbys and workers name their directories."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        command = " ".join(process.info["cmdline"] or [])
        if str(cli.cwd) in command and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(f"{process.pid}: {command}")
    return found


def up(cli: Cli, reaper: list[str], steps: int, **job: Any) -> dict[str, Any]:
    local_tf_inventory(cli, steps=steps, checkpoint_every=STEPS, warm_restarts=True, **job)
    result = cli("up", "--skip-checks", "inv.yaml", timeout=300)
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 0, result.stderr
    assert f"succeeded at step {steps}" in result.stderr
    return {**cli.status(), "said": result.stderr}


def logs(cli: Cli) -> str:
    return cli("tail", "-n", "400", check=True).stdout


def test_the_next_up_takes_the_lingering_standbys_and_a_changed_env_starts_cold(
    cli: Cli, reaper: list[str]
) -> None:
    first = up(cli, reaper, STEPS, linger=120)
    # Listed by `status`, not as workers: one per slot, lingering, with its memory.
    lingering = {s["name"]: s for s in first["standbys"]}
    assert set(lingering) == {"chief", "other"}, first["standbys"]
    # The end of `up` said so, and the run's goodput (issue 44), from the hosts' own listing.
    # (Their memory "so far" while they still import TensorFlow.)
    warm = re.search(r"^2 standbys of chief, other kept warm for the next `up` \(([\d.]+ \w+)"
                     r"(?: so far, importing TensorFlow)?, (\w+); `orchestrate down` frees "
                     r"them\)$", first["said"], re.M)  # fmt: skip
    assert warm, first["said"]
    assert re.search(r"^goodput \d+ %: .*start-up \d+ %", first["said"], re.M), first["said"]
    assert all(s["lingering"] and s["run_id"] == first["run_id"] for s in lingering.values())
    assert all(0 < s["left_s"] <= 120 for s in lingering.values())
    assert all(s["rss_bytes"] > 50 << 20 for s in lingering.values())  # a Python, TF or soon
    assert not {w["pid"] for w in first["workers"]} & {s["worker_pid"] for s in first["standbys"]}
    # Where the next run finds them: {job}/standby/{name}, 0700 like runs/, every file 0600.
    root = cli.cwd / "work" / "shapes" / "standby"
    assert sorted(p.name for p in root.iterdir()) == ["chief", "other"]
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))

    # The same job, environment and interpreter: the standbys become the workers and train on.
    second = up(cli, reaper, 2 * STEPS, linger=120)
    assert second["run_id"] != first["run_id"]
    assert [w["pid"] for w in second["workers"]] == [
        lingering["chief"]["worker_pid"],
        lingering["other"]["worker_pid"],
    ]
    assert [w["step"] for w in second["workers"]] == [2 * STEPS, 2 * STEPS]
    text = logs(cli)
    assert f"the standby run {first['run_id']} left lingering" in text
    assert f"restored checkpoint at step {STEPS}" in text
    left_by_second = {s["worker_pid"] for s in second["standbys"]}
    assert len(left_by_second) == 2

    # job.env changed: what TensorFlow's import saw differs, so they are not used.
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "SHAPES_NOTE": "edited"}
    third = up(cli, reaper, 3 * STEPS, linger=120, env=env)
    assert not {w["pid"] for w in third["workers"]} & left_by_second
    assert not any(psutil.pid_exists(pid) and _alive(pid) for pid in left_by_second)
    assert "the standby's environment differs from this run's" in logs(cli)
    assert [w["step"] for w in third["workers"]] == [3 * STEPS, 3 * STEPS]
    assert len(third["standbys"]) == 2

    # `down` of the finished run discards its lingering standbys: nothing is left.
    cli("down", check=True)
    assert leftovers(cli) == []
    assert cli.status()["standbys"] == []
    # linger: 0 at a run's end: every other test here runs so ($ORCHESTRATE_LINGER=0, see
    # conftest) and finds no process of its run left; the key itself: test_standby_decisions.


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

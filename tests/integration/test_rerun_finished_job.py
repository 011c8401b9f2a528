"""A finished job run again (issue 56), through the real CLI with real TensorFlow on two local
workers: `up` of the same inventory says there is nothing to train, starts no worker and makes no
run (status still shows the run that trained); `up --fresh` moves the checkpoints aside, loses
none of them, and trains again from step 0 to the target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Cli, local_tf_inventory

pytestmark = pytest.mark.tf

WIDE = {"ORCHESTRATE_WIDTH": "400"}  # one message on one line, whatever the path's length


def run_ids(cli: Cli) -> set[str]:
    runs = cli.cwd / ".orchestrate" / "runs"
    return {p.stem for p in runs.glob("*.json") if not p.name.endswith(".status.json")}


def listed_checkpoints(directory: Path) -> str:
    return (directory / "checkpoint").read_text().splitlines()[0]


def test_a_finished_job_trains_nothing_again_and_fresh_starts_over(
    cli: Cli, reaper: list[str]
) -> None:
    local_tf_inventory(cli, steps=20)
    cli("up", "inv.yaml", check=True, timeout=300)
    trained = cli.record()["run_id"]
    reaper.append(trained)
    before = cli.status()
    assert (before["run_id"], before["state"]) == (trained, "succeeded")
    assert [(w["step"], w["checkpoint_step"]) for w in before["workers"]] == [(20, 20), (20, 20)]
    assert before["workers"][0]["loss"] is not None
    job = cli.cwd / "work" / "shapes"
    checkpoints = job / "checkpoints"
    worker_runs = sorted(p.name for p in (job / "runs").iterdir())

    again = cli("up", "inv.yaml", timeout=120, env=WIDE)
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip() == (
        f"job shapes: ckpt-20 already reaches steps: 20: nothing to train (the checkpoints in "
        f"{checkpoints} on chief; raise job.steps, or 'orchestrate up --fresh' starts over from "
        "step 0, setting them aside)"
    )
    assert run_ids(cli) == {trained}  # no new run record
    assert sorted(p.name for p in (job / "runs").iterdir()) == worker_runs  # no worker started
    after = cli.status()
    assert after["run_id"] == trained and after["state"] == "succeeded"
    assert [(w["step"], w["loss"]) for w in after["workers"]] == [
        (w["step"], w["loss"]) for w in before["workers"]
    ]

    fresh = cli("up", "--fresh", "inv.yaml", timeout=300, env=WIDE)
    assert fresh.returncode == 0, fresh.stderr
    (aside,) = job.glob("checkpoints.set-aside-*")
    moved = sorted(p.name for p in aside.iterdir())
    said = f"--fresh: set aside {len(moved)} file(s) of {checkpoints} on chief: moved to {aside}"
    assert said in fresh.stderr
    assert listed_checkpoints(aside) == 'model_checkpoint_path: "ckpt-20"'
    (events,) = job.glob("tensorboard.set-aside-*")  # the old curves are not drawn over
    assert any(events.rglob("events.out.tfevents.*")), sorted(events.rglob("*"))
    assert f"--fresh: set aside the TensorBoard events of {job / 'tensorboard'} on chief" in (
        fresh.stderr
    )
    assert {"ckpt-20.index", "checkpoint"} <= set(moved)
    assert "job shapes succeeded at step 20" in fresh.stderr
    restarted = cli.record()["run_id"]
    reaper.append(restarted)
    assert run_ids(cli) == {trained, restarted}
    chief_run = job / "runs" / restarted / "attempt-0" / "chief"
    progress = json.loads((chief_run / "progress.json").read_text())
    assert (progress["start_step"], progress["step"]) == (0, 20)  # from no checkpoint
    assert "restored checkpoint" not in (chief_run / "worker.log").read_text()
    assert listed_checkpoints(checkpoints) == 'model_checkpoint_path: "ckpt-20"'
    assert cli.status()["run_id"] == restarted

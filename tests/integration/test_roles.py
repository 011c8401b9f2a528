"""Roles on real local processes: a tutorial-style ParameterServerStrategy script (a chief, two
workers, one ps, `keras: legacy`) run unchanged; the ps's SIGKILL restarts the whole cluster
from the latest checkpoint, and the chief's exit 0 ends the run with the others stopped. An
evaluator host beside a two-worker MultiWorkerMirroredStrategy task job (`python -m
worker.evaluate --watch`): its SIGKILL is not the training's, it is started again alone and
evaluates the final checkpoint."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import (
    REPO,
    Cli,
    first_run_dir,
    free_ports,
    local_inventory,
    local_tf_inventory,
    progress_in,
    suspend_workers,
    wait_for,
)

pytestmark = pytest.mark.tf

SCRIPTS = REPO / "tests" / "scripts"
ROLES = {"chief": "chief", "worker-0": "worker", "worker-1": "worker", "ps-0": "ps"}


def ps_inventory(cli: Cli, **job: Any) -> Path:
    ports = free_ports(len(ROLES))
    settings = {
        "name": "ps_fit",
        "script": str(SCRIPTS / "ps_fit.py"),
        "strategy": "parameter-server",
        "keras": "legacy",
        "steps": 20,
        "stall_timeout": 90,
        "restart_backoff": 0,
        "env": {"TF_CPP_MIN_LOG_LEVEL": "2", "FIRST_RUN_DELAY": "2"},
        **job,
    }
    hosts = [
        f"name: {name}, role: {role}, address: localhost, port: {port}"
        for (name, role), port in zip(ROLES.items(), ports, strict=True)
    ]
    return local_inventory(cli, hosts, settings)


def latest_checkpoint(cli: Cli) -> str:
    state = (cli.cwd / "work" / "ps_fit" / "checkpoints" / "checkpoint").read_text()
    return state.splitlines()[0].split('"')[1]


def by_name(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(w for w in status["workers"] if w["name"] == name)


def hold_the_chief(cli: Cli, job: str, at: int) -> psutil.Process:
    """The chief held (psutil suspend) as soon as its own progress file (no CLI in between: a
    `status` poll can take longer than the rest of the run on a busy machine, and the pid it
    gave was gone by then) reports a checkpoint at step `at` or later; the caller resumes it."""
    job_root = cli.cwd / "work" / job
    wait_for(lambda: (progress_in(first_run_dir(job_root, "chief")).get("checkpoint_step")
                      or 0) >= at, timeout=180, what=f"a checkpoint at step {at}",
             interval=0.05)  # fmt: skip
    (chief,) = suspend_workers([first_run_dir(job_root, "chief")])
    return chief


def pid_of(cli: Cli, job: str, name: str) -> int:
    """A worker's pid in the first attempt, from its run directory (it serves until stopped)."""
    run_dir = first_run_dir(cli.cwd / "work" / job, name)
    assert run_dir is not None, name
    return int((run_dir / "worker.pid").read_text())


def kill_a_worker_under_a_held_chief(cli: Cli, reaper: list[str], job: str, at: int) -> int:
    """Once the chief's checkpoint reached step `at`: the chief held while worker-1 is
    SIGKILLed and seen started again by itself, then let go; the chief's pid."""
    chief = hold_the_chief(cli, job, at)  # the training waits at the point of the kill
    try:
        reaper.append(cli.record()["run_id"])
        lost = pid_of(cli, job, "worker-1")
        os.kill(lost, signal.SIGKILL)
        # A serving task writes no progress: it shows "running" once its chief has stepped
        # (issue 54; "starting" before), and "starting" while its chief has not.
        cli.status_when(lambda s: by_name(s, "worker-1")["pid"] not in (None, lost)
                        and by_name(s, "worker-1")["state"] in ("starting", "running"),
                        timeout=120)  # fmt: skip
    finally:
        chief.resume()
    return chief.pid


def test_a_ps_script_keeps_its_chief_through_a_lost_worker_restarts_after_its_ps_and_ends(
    cli: Cli, reaper: list[str]
) -> None:
    """One run, three losses' worth of assertions: worker-1's SIGKILL restarts it alone while
    the chief (same pid) trains on; the ps's SIGKILL restarts the cluster from the checkpoint;
    the chief's exit 0 ends the run with the others stopped, at exactly the target step."""
    ps_inventory(cli, steps=30)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    try:
        chief_pid = kill_a_worker_under_a_held_chief(cli, reaper, "ps_fit", at=5)
        # The ps's loss at a known point: before the chief's last epoch, the chief held.
        chief = hold_the_chief(cli, "ps_fit", at=15)
        try:
            status = cli.status()
            assert status["attempt"] == 0 and by_name(status, "chief")["pid"] == chief_pid
            assert chief.pid == chief_pid
            assert status["restarted_alone"] == [
                "worker worker-1 restarted (1 of 6), the chief continued"]  # fmt: skip
            assert {w["name"]: w["role"] for w in status["workers"]} == ROLES
            os.kill(pid_of(cli, "ps_fit", "ps-0"), signal.SIGKILL)
        finally:
            chief.resume()
        out, err = up.communicate(timeout=300)
    finally:
        up.kill()
    assert up.returncode == 0, f"{out}\n{err}"
    assert "worker worker-1 restarted (1 of 6), the chief continued: worker-1" in out
    assert "ps-0" in out and "killed by SIGKILL; restarting the cluster (1/3)" in out
    assert "the chief finished: stopping" in out
    status = cli.status()
    assert status["state"] == "succeeded" and status["attempt"] == 1
    assert status["last_restart"]["worker"] == "ps-0" and status["restarts"] == 1
    states = {w["name"]: (w["state"], w["reason"]) for w in status["workers"]}
    assert states["chief"][0] == "succeeded"
    for name in ("worker-0", "worker-1", "ps-0"):
        assert states[name] == ("stopped", "stopped after the chief finished"), states
    assert latest_checkpoint(cli) == "ckpt-30"  # the chief's last checkpoint, at the target
    log = next((cli.cwd / "work" / "ps_fit" / "runs").glob("*/attempt-1/chief/worker.log"))
    resumed = [line for line in log.read_text().splitlines() if line.startswith("starting at")]
    assert resumed and resumed[0] != "starting at step 0", resumed  # from the checkpoint
    assert "chief done at step 30" in log.read_text()


def test_the_built_in_loop_under_parameter_server_keeps_its_chief_through_a_lost_worker(
    cli: Cli, reaper: list[str]
) -> None:
    """The bundled example (a `task:` job) under `strategy: parameter-server`: the chief's
    ClusterCoordinator trains on through worker-1's SIGKILL (restarted alone at its address),
    with checkpoints, evaluation and progress as under MultiWorkerMirrored, to exactly its
    target in the first attempt."""
    ports = free_ports(len(ROLES))
    hosts = [f"name: {name}, role: {role}, address: localhost, port: {port}"
             for (name, role), port in zip(ROLES.items(), ports, strict=True)]  # fmt: skip
    local_inventory(cli, hosts, {
        "name": "shapes", "task": "worker.examples.shapes:task", "strategy": "parameter-server",
        "steps": 200, "checkpoint_every": 50, "eval_every": 100, "log_every": 10,
        "stall_timeout": 120, "env": {"TF_CPP_MIN_LOG_LEVEL": "2"},
    })  # fmt: skip
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    try:
        chief_pid = kill_a_worker_under_a_held_chief(cli, reaper, "shapes", at=50)
        out, err = up.communicate(timeout=300)
    finally:
        up.kill()
    assert up.returncode == 0, f"{out}\n{err}"
    assert "worker worker-1 restarted (1 of 6), the chief continued: worker-1" in out
    status = cli.status()
    assert (status["state"], status["attempt"], status["restarts"]) == ("succeeded", 0, 0), (
        status["last_restart"],
        out,
    )
    chief = by_name(status, "chief")
    assert (chief["step"], chief["checkpoint_step"]) == (200, 200)
    assert chief["val_accuracy"] is not None  # the final evaluation, on the chief
    runs = cli.cwd / "work" / "shapes" / "runs"
    log = next(runs.glob("*/attempt-0/chief/worker.log")).read_text()
    assert "worker: finished at step 200" in log and "eval step 200" in log
    assert log.count("worker: first step done") == 1  # one chief process, never restarted
    assert next(runs.glob("*/attempt-0/worker-1-restart1/worker.log"))
    chief_dir = next(runs.glob("*/attempt-0/chief"))
    assert int((chief_dir / "worker.pid").read_text()) == chief_pid  # the same chief throughout
    assert (cli.cwd / "work" / "shapes" / "checkpoints" / "ckpt-200.index").exists()


def test_an_evaluator_beside_a_task_job_restarts_alone_and_evaluates_the_final_checkpoint(
    cli: Cli, reaper: list[str]
) -> None:
    path = local_tf_inventory(cli, steps=60, checkpoint_every=20, stall_timeout=120)
    (port,) = free_ports(1)
    text = path.read_text().replace("job:", f"  - {{name: judge, role: evaluator, address: "
                                    f"localhost, port: {port}}}\njob:", 1)  # fmt: skip
    path.write_text(text)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    try:
        status = cli.status_when(
            lambda s: any(w["name"] == "judge" and w["pid"] for w in s["workers"]), timeout=120
        )
        reaper.append(status["run_id"])
        judge = next(w for w in status["workers"] if w["name"] == "judge")
        assert judge["role"] == "evaluator"
        os.kill(judge["pid"], signal.SIGKILL)  # while the workers still start or train
        out, err = up.communicate(timeout=300)
    finally:
        up.kill()
    assert up.returncode == 0, f"{out}\n{err}"
    assert "the evaluator judge failed (killed by SIGKILL); starting it again alone (1/3)" in out
    status = cli.status()
    assert status["state"] == "succeeded" and status["restarts"] == 0  # the training's: none
    states = {w["name"]: (w["role"], w["state"]) for w in status["workers"]}
    assert states == {"chief": ("worker", "succeeded"), "other": ("worker", "succeeded"),
                      "judge": ("evaluator", "succeeded")}  # fmt: skip
    run = next((cli.cwd / "work" / "shapes" / "runs").glob("*/attempt-0"))
    progress = json.loads((run / "judge-restart1" / "progress.json").read_text())
    assert progress["eval_step"] == 60 and progress["evaluated"] >= 1  # the final checkpoint
    assert progress["val_loss"] is not None

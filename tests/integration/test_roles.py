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

import pytest

from tests.conftest import REPO, Cli, free_ports, local_inventory, local_tf_inventory

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


def test_ps_script_survives_the_loss_of_its_ps_and_ends_with_the_chief(
    cli: Cli, reaper: list[str]
) -> None:
    ps_inventory(cli)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    try:
        status = cli.status_when(
            lambda s: any(w["name"] == "chief" and (w["checkpoint_step"] or 0) >= 5
                          for w in s["workers"]),
            timeout=180,
        )  # fmt: skip
        reaper.append(status["run_id"])
        assert {w["name"]: w["role"] for w in status["workers"]} == ROLES
        ps = next(w for w in status["workers"] if w["name"] == "ps-0")
        os.kill(ps["pid"], signal.SIGKILL)
        out, err = up.communicate(timeout=300)
    finally:
        up.kill()
    assert up.returncode == 0, f"{out}\n{err}"
    assert "ps-0" in out and "killed by SIGKILL; restarting the cluster (1/3)" in out
    assert "the chief finished: stopping" in out
    status = cli.status()
    assert status["state"] == "succeeded" and status["attempt"] == 1
    assert status["last_restart"]["worker"] == "ps-0"
    states = {w["name"]: (w["state"], w["reason"]) for w in status["workers"]}
    assert states["chief"][0] == "succeeded"
    for name in ("worker-0", "worker-1", "ps-0"):
        assert states[name] == ("stopped", "stopped after the chief finished"), states
    assert latest_checkpoint(cli) == "ckpt-20"  # the chief's last checkpoint, at the target
    log = next((cli.cwd / "work" / "ps_fit" / "runs").glob("*/attempt-1/chief/worker.log"))
    resumed = [line for line in log.read_text().splitlines() if line.startswith("starting at")]
    assert resumed and resumed[0] != "starting at step 0", resumed  # from the checkpoint


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

"""The bundled example trained by two local workers through the real CLI: real TensorFlow,
real MultiWorkerMirroredStrategy over localhost gRPC, real checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tensorflow as tf

from tests.conftest import (
    PACED,
    Cli,
    free_ports,
    local_tf_inventory,
    run_processes,
    serve_tensorboard,
    wait_for,
)

pytestmark = pytest.mark.tf


def checkpoint_step(directory: Path) -> int:
    latest = tf.train.latest_checkpoint(str(directory))
    assert latest is not None, f"no checkpoint in {directory}"
    return int(tf.train.load_variable(latest, "step/.ATTRIBUTES/VARIABLE_VALUE"))


def test_two_workers_train_then_resume(cli: Cli, reaper: list[str]) -> None:
    local_tf_inventory(cli, steps=40)
    cli("up", "inv.yaml", check=True, timeout=300)
    reaper.append(cli.record()["run_id"])
    status = cli.status()
    assert status["state"] == "succeeded"
    assert [(w["state"], w["step"], w["checkpoint_step"]) for w in status["workers"]] == [
        ("succeeded", 40, 40),
        ("succeeded", 40, 40),
    ]
    checkpoints = cli.cwd / "work" / "shapes" / "checkpoints"
    assert checkpoint_step(checkpoints) == 40
    first_loss = status["workers"][0]["loss"]

    local_tf_inventory(cli, steps=80)
    cli("up", "inv.yaml", check=True, timeout=300)
    logs = cli("tail", "-n", "200", check=True).stdout
    assert "chief | worker: restored checkpoint at step 40" in logs
    assert "other | worker: restored checkpoint at step 40" in logs
    assert checkpoint_step(checkpoints) == 80
    resumed = cli.status()
    assert [w["step"] for w in resumed["workers"]] == [80, 80]
    assert resumed["workers"][0]["loss"] < first_loss  # it kept learning, not restarting

    # TensorBoard on the chief's events, read in place; Ctrl-C stops it and leaves nothing.
    served = serve_tensorboard(cli, free_ports(1)[0])
    assert {"loss", "accuracy", "steps_per_sec", "learning_rate"} <= set(served["scalars"])
    assert {"inputs/sample", "inputs/grid"} <= set(served["images"])
    assert "/work/shapes/tensorboard" in served["stdout"]

    # Same steps again: already there, so nothing starts and the trained run stays the one
    # status shows (issue 56; tests/integration/test_rerun_finished_job.py has --fresh).
    trained = cli.record()["run_id"]
    again = cli("up", "inv.yaml", check=True, timeout=300)
    assert "ckpt-80 already reaches steps: 80: nothing to train" in " ".join(again.stderr.split())
    assert cli.record()["run_id"] == trained


def test_a_users_worker_py_cannot_replace_orchestrates_and_their_modules_import(
    cli: Cli, reaper: list[str]
) -> None:
    """Issue 56: a `worker.py` of the user's beside the inventory (the workers' directory)
    replaced orchestrate's worker package and the job failed; the user's own task module there
    must still import. The first attempt's workers are standbys that took the launch."""
    (cli.cwd / "worker.py").write_text("raise SystemExit('the user worker.py was imported')\n")
    (cli.cwd / "my_task.py").write_text(
        "from worker.examples import shapes\n\n\ndef task():\n    return shapes.task()\n"
    )
    local_tf_inventory(cli, steps=20, task="my_task:task", warm_restarts=True)
    result = cli("up", "inv.yaml", timeout=300)
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 0, result.stderr
    assert "job shapes succeeded at step 20" in result.stderr
    assert "the user worker.py" not in cli("tail", "-n", "200", check=True).stdout


def test_status_while_training_and_down_in_the_middle(cli: Cli, reaper: list[str]) -> None:
    # Paced (PACED): it trains on while the test reads it through the CLI; standbys: below.
    local_tf_inventory(cli, steps=100_000, warm_restarts=True, **PACED)
    cli("up", "--detach", "inv.yaml", check=True)
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    running = wait_for(
        lambda: (
            (s := cli.status())["state"] == "running"
            and all((w["step"] or 0) >= 20 for w in s["workers"])
            and s
        ),
        timeout=120,
    )
    for worker in running["workers"]:
        assert worker["state"] == "running" and worker["pid"] and worker["loss"] is not None
        assert worker["rss_bytes"] > 50 * 2**20  # a TensorFlow process, measured by psutil
        assert worker["uptime"] > 0
    table = cli("status", check=True).stdout
    assert "chief" in table and "running" in table
    # At 80 columns (issue 56): nothing wider, the worker, its state and the step whole.
    narrow = cli("status", check=True, env={"ORCHESTRATE_WIDTH": "80"}).stdout.splitlines()
    assert max(map(len, narrow)) <= 80, narrow
    rows = [line for line in narrow if line.startswith("│ chief") or line.startswith("│ other")]
    assert len(rows) == 2 and all("running" in row for row in rows), narrow
    assert "/100000" in "\n".join(narrow) and "…" not in "\n".join(narrow), narrow
    record = json.loads((cli.cwd / ".orchestrate" / "runs" / f"{run_id}.json").read_text())
    assert [w["name"] for w in record["workers"]] == ["chief", "other"]
    # Two supervisors and their workers (the first attempt's standbys, which `up` started
    # before its checks: `python -m worker.standby`); beside them, once both stepped, each
    # slot's standby for a restart (a supervisor and a Python importing TensorFlow) may start.
    commands = {p.pid: p.cmdline() for p in run_processes(run_id)}
    assert len([c for c in commands.values() if "supervise" in c]) == 2, commands
    assert {w["pid"] for w in running["workers"]} <= set(commands)
    assert all("worker.standby" in commands[w["pid"]] for w in running["workers"]), commands

    down = cli("down", "--grace", "10", check=True)
    assert "chief: stopped" in down.stdout and "other: stopped" in down.stdout
    assert run_processes(run_id) == []
    assert cli.status()["state"] == "stopped"

"""The evaluator task beside a real training: `python -m worker.evaluate --watch`.

Two local workers train the bundled example through the real CLI (real TensorFlow, real
MultiWorkerMirroredStrategy over localhost gRPC, a checkpoint every 10 steps, 30 steps) while an
evaluator runs beside them as a plain process, started before the checkpoint directory exists
(the supervisor's side of starting it, its SIGKILL and its restart alone are tested with the
roles, tests/integration/test_roles.py). The evaluator with --steps 30 evaluates checkpoints and
the final one, then exits 0 by itself, with the one-shot evaluator's metrics for the final
checkpoint; one started on the finished directory evaluates only the newest checkpoint (the older
ones skipped) and ends on SIGTERM with 0.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, Cli, clean_env, local_tf_inventory, val_scalars, wait_for

pytestmark = pytest.mark.tf

TASK = "worker.examples.shapes:task"
# What the controller gives the evaluator host: TensorFlow's convention, a task of its own. A
# cluster built from it would wait for these addresses forever: none of them is listening.
EVALUATOR_TF_CONFIG = json.dumps({
    "cluster": {"worker": ["localhost:1", "localhost:2"]},
    "task": {"type": "evaluator", "index": 0},
})  # fmt: skip


def evaluator(run_dir: Path, checkpoints: Path, steps: int, *flags: str) -> subprocess.Popen[str]:
    run_dir.mkdir(parents=True)
    env = clean_env(
        TF_CONFIG=EVALUATOR_TF_CONFIG,
        ORCHESTRATE_RUN_DIR=str(run_dir),
        ORCHESTRATE_PROGRESS_FILE=str(run_dir / "progress.json"),
    )
    with open(run_dir / "worker.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.evaluate", "--watch", "--task", TASK,
             "--checkpoint-dir", str(checkpoints), "--steps", str(steps), "--poll", "0.3", *flags],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def progress(run_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((run_dir / "progress.json").read_text()))
    except FileNotFoundError:
        return {}


def last_json(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "worker.log").read_text().strip().splitlines()[-1]))


def test_an_evaluator_beside_a_two_worker_training(
    cli: Cli, reaper: list[str], tmp_path: Path
) -> None:
    job = cli.cwd / "work" / "shapes"
    checkpoints = job / "checkpoints"
    watcher_dir, late_dir = tmp_path / "watcher", tmp_path / "late"
    # Started before the training: the checkpoint directory does not exist yet.
    watcher = evaluator(watcher_dir, checkpoints, 30)
    processes = [watcher]
    try:
        local_tf_inventory(cli, steps=30, checkpoint_every=10)
        cli("up", "inv.yaml", check=True, timeout=300)
        reaper.append(cli.record()["run_id"])
        assert cli.status()["state"] == "succeeded"
        assert watcher.wait(timeout=90) == 0  # by itself: it evaluated the final checkpoint
        # Started on the finished directory (ckpt-10, 20, 30 kept) with a later final step,
        # while the one-shot evaluator runs.
        late = evaluator(late_dir, checkpoints, 1000, "--tensorboard-dir", str(tmp_path / "tb"))
        processes.append(late)
        metrics = check_final(job, watcher_dir)
        check_late(late, late_dir, tmp_path / "tb", metrics)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)


def check_final(job: Path, watcher_dir: Path) -> dict[str, Any]:
    """The watcher's final evaluation, in its output, progress, history and TensorBoard, equals
    the one-shot evaluator's for the final checkpoint; returns the one-shot's metrics."""
    final = last_json(watcher_dir)
    assert (final["outcome"], final["checkpoint"], final["step"]) == ("final", "ckpt-30", 30)
    state = progress(watcher_dir)
    assert state["role"] == "evaluator" and state["step"] == state["eval_step"] == 30
    assert state["val_loss"] == final["val_loss"] and state["target_steps"] == 30
    evaluated, skipped = state["evaluated"], state["skipped"]
    assert evaluated >= 1 and evaluated + skipped <= 3  # three checkpoints were written

    # TensorBoard: the training's own events beside the evaluator's `eval` run.
    scalars = val_scalars(job / "tensorboard" / "eval")
    steps = [step for step, _ in scalars["val_loss"]]
    assert len(steps) == evaluated and steps[-1] == 30 and steps == sorted(set(steps))
    assert scalars["val_loss"][-1][1] == pytest.approx(final["val_loss"], rel=1e-6)
    # The dashboard's curve: one history line per evaluation.
    history = (watcher_dir / "progress-history.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in history] == steps

    # The same metrics as the one-shot evaluator for the final checkpoint.
    one_shot = subprocess.run(
        [sys.executable, "-m", "worker.evaluate", "--task", TASK,
         "--checkpoint-dir", str(job / "checkpoints")],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert one_shot.returncode == 0, one_shot.stderr
    metrics = json.loads(one_shot.stdout)
    assert metrics["checkpoint"] == "ckpt-30" and metrics["examples"] == final["examples"]
    assert final["val_loss"] == pytest.approx(metrics["val_loss"], rel=1e-9)
    assert final["val_accuracy"] == pytest.approx(metrics["val_accuracy"], abs=1e-12)
    return dict(metrics)


def check_late(
    late: subprocess.Popen[str], late_dir: Path, tensorboard: Path, metrics: dict[str, Any]
) -> None:
    """Only the newest is evaluated, the two older ones counted as skipped; SIGTERM ends it
    with 0 (nothing newer to evaluate first)."""
    wait_for(lambda: progress(late_dir).get("eval_step") == 30, 90, "the late evaluation")
    late.send_signal(signal.SIGTERM)
    assert late.wait(timeout=30) == 0
    ended = last_json(late_dir)
    assert (ended["outcome"], ended["evaluated"], ended["skipped"]) == ("stopped", 1, 2)
    assert ended["val_loss"] == pytest.approx(metrics["val_loss"], rel=1e-9)
    assert [s for s, _ in val_scalars(tensorboard)["val_loss"]] == [30]

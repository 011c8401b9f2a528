"""After training: evaluation while training, the exported model, a checkpoint restored for use.

Two local workers train the bundled example through the real CLI (real TensorFlow, real
MultiWorkerMirroredStrategy over localhost gRPC), twice: 30 steps exporting a .keras model, then
resumed to 50 steps exporting an inference SavedModel, evaluating every 10 steps throughout, then
once more with nothing to train, exporting the final weights as .keras again. The
bundled eval split has 1001 examples, so the two workers' shards differ in size and neither fills
its last batch: the evaluation must count each example exactly once anyway.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, Cli, clean_env, local_tf_inventory, val_scalars
from worker.examples import shapes
from worker.restore import restore_model

pytestmark = pytest.mark.tf

TASK = "worker.examples.shapes:task"


def evaluate(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.evaluate", "--task", TASK, *flags],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def final_evaluation(cli: Cli, steps: int) -> tuple[float, float]:
    """The run's final val_loss and val_accuracy, the same on both workers (a global reduction)."""
    status = cli.status()
    assert status["state"] == "succeeded"
    values = {(w["step"], w["val_loss"], w["val_accuracy"]) for w in status["workers"]}
    assert len(values) == 1, status["workers"]
    ((step, loss, accuracy),) = values
    assert step == steps and loss > 0 and 0 < accuracy <= 1
    return loss, accuracy


def test_evaluate_export_and_restore(cli: Cli, reaper: list[str]) -> None:
    # Here, not at the top: each pytest process that collects this module (every lane, the
    # quiet run) would pay TensorFlow's import, about 3 s of CPU, for a test it may not run.
    import tensorflow as tf

    job = cli.cwd / "work" / "shapes"
    checkpoints = job / "checkpoints"
    images, _ = shapes.make_images(32, seed=7)  # neither training nor eval data

    local_tf_inventory(cli, steps=30, eval_every=10, export="keras")
    up = cli("up", "inv.yaml", check=True, timeout=300)
    reaper.append(cli.record()["run_id"])
    assert f"exported model: {job / 'export'}\n" in up.stderr  # where, said at the end of `up`
    loss_30, accuracy_30 = final_evaluation(cli, 30)
    logs = cli("tail", "-n", "100", check=True).stdout
    assert "chief | worker: evaluating 1001 examples in 16 steps every 10 steps" in logs
    # Every worker evaluates (collectively), and each evaluation counts every example once.
    for worker in ("chief", "other"):
        assert logs.count(f"{worker} | eval step ") == 3
        assert logs.count(f"{worker} | worker: exported") == (worker == "chief")
    assert "examples 1001 " in logs and "examples 1000 " not in logs
    # The .keras export predicts what the final checkpoint, restored by the helper, predicts.
    assert sorted(p.name for p in (job / "export").iterdir()) == ["model.keras"]
    exported = tf.keras.models.load_model(job / "export" / "model.keras")
    restored = restore_model(TASK, str(checkpoints))
    np.testing.assert_allclose(exported(images), restored(images), rtol=1e-5, atol=1e-5)
    # A local chief's export is read in place; --to copies it like a remote one.
    assert cli("pull-export", check=True).stdout.strip() == str(job / "export")
    pulled = cli("pull-export", "--to", "pulled", check=True)
    assert "copied 1 file(s)" in pulled.stderr
    assert (cli.cwd / "pulled" / "model.keras").read_bytes() == (
        job / "export" / "model.keras"
    ).read_bytes()

    # Resumed: evaluation goes on at 40 and 50; the export is replaced by a SavedModel.
    local_tf_inventory(cli, steps=50, eval_every=10, export="saved_model")
    cli("up", "inv.yaml", check=True, timeout=300)
    loss_50, accuracy_50 = final_evaluation(cli, 50)
    assert loss_50 < loss_30
    scalars = val_scalars(job / "tensorboard")
    assert [step for step, _ in scalars["val_accuracy"]] == [10, 20, 30, 40, 50]
    assert [step for step, _ in scalars["val_loss"]] == [10, 20, 30, 40, 50]
    assert scalars["val_accuracy"][2][1] == pytest.approx(accuracy_30)
    assert scalars["val_accuracy"][-1][1] == pytest.approx(accuracy_50)
    assert scalars["val_loss"][-1][1] == pytest.approx(loss_50, rel=1e-6)

    assert sorted(p.name for p in (job / "export").iterdir()) == ["saved_model"]
    served = tf.saved_model.load(str(job / "export" / "saved_model"))
    restored = restore_model(TASK, str(checkpoints))
    np.testing.assert_allclose(served.serve(images), restored(images), rtol=1e-5, atol=1e-5)
    earlier = restore_model(TASK, str(checkpoints), "ckpt-30")
    assert not np.allclose(earlier(images), restored(images))  # a checkpoint is really chosen

    check_worker_evaluate(checkpoints, loss_50, accuracy_50)

    # A finished job started again with another export: no training, the same final weights.
    local_tf_inventory(cli, steps=50, export="keras")
    cli("up", "inv.yaml", check=True, timeout=300)
    assert "already at step 50" in cli("tail", "-n", "5", check=True).stdout
    assert sorted(p.name for p in (job / "export").iterdir()) == ["model.keras"]
    exported = tf.keras.models.load_model(job / "export" / "model.keras")
    np.testing.assert_allclose(exported(images), restored(images), rtol=1e-5, atol=1e-5)


def check_worker_evaluate(checkpoints: Path, loss: float, accuracy: float) -> None:
    """The use phase on one process agrees with the cluster's final evaluation; a checkpoint
    that is not there is a one-line error naming the ones that are."""
    result = evaluate("--checkpoint-dir", str(checkpoints))
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert (metrics["checkpoint"], metrics["step"], metrics["examples"]) == ("ckpt-50", 50, 1001)
    assert metrics["val_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert metrics["val_loss"] == pytest.approx(loss, rel=1e-5)

    bad = evaluate("--checkpoint-dir", str(checkpoints), "--checkpoint", "ckpt-45")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip() == (
        f"worker.evaluate: no checkpoint 'ckpt-45' in {checkpoints}; "
        "available: ckpt-30, ckpt-40, ckpt-50"
    )

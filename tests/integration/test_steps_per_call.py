"""--steps-per-call K on a real two-worker MultiWorkerMirroredStrategy cluster on localhost.

The same seed and data give the same training whether the steps run one per tf.function call or
ten per call: the loss the chief logs at each log step and every weight of the final checkpoint
agree within 1e-6 relative. About 30 s on two CPU cores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.integration.test_worker_training import STEP_LINE, finish, start_cluster

pytestmark = pytest.mark.tf

STEPS = 60
RTOL = 1e-6


def train(tmp_path: Path, steps_per_call: int) -> tuple[Path, str]:
    root = tmp_path / f"k{steps_per_call}"
    checkpoints = root / "checkpoints"
    processes = start_cluster(
        root,
        "--steps", str(STEPS), "--log-every", "10", "--checkpoint-every", "20",
        "--checkpoint-dir", str(checkpoints), "--steps-per-call", str(steps_per_call),
        "--seed", "7",
    )  # fmt: skip
    results = [finish(process) for process in processes]
    for code, out, err in results:
        assert code == 0, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    return checkpoints, results[0][1]


def logged_losses(tensorboard: Path) -> dict[int, float]:
    import tensorflow as tf

    losses = {}
    for path in sorted(tensorboard.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "loss":
                    losses[event.step] = float(tf.make_ndarray(value.tensor))
    return losses


def weights(checkpoints: Path) -> dict[str, np.ndarray]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(checkpoints))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name.endswith("VARIABLE_VALUE")  # model weights, optimizer slots, step
    }


def test_ten_steps_per_call_trains_exactly_like_one(tmp_path: Path) -> None:
    one, _ = train(tmp_path, 1)
    ten, ten_out = train(tmp_path, 10)

    # Logs and checkpoints at the same steps, multiples of K.
    assert [int(s) for s, *_ in STEP_LINE.findall(ten_out)] == [10, 20, 30, 40, 50, 60]
    assert "worker: first step done" in ten_out
    for step in (20, 40, 60):
        assert f"worker: saved checkpoint at step {step}" in ten_out
    assert sorted(p.name for p in ten.glob("ckpt-*.index")) == [
        "ckpt-20.index", "ckpt-40.index", "ckpt-60.index"
    ]  # fmt: skip

    losses_one = logged_losses(one.parent / "tensorboard")
    losses_ten = logged_losses(ten.parent / "tensorboard")
    assert sorted(losses_one) == sorted(losses_ten) == [10, 20, 30, 40, 50, 60]
    for step, loss in losses_one.items():
        assert losses_ten[step] == pytest.approx(loss, rel=RTOL), step
    assert losses_one[60] < losses_one[10]  # it trained

    final_one, final_ten = weights(one), weights(ten)
    # Keras 3 models keep their weights under the optimizer's _trainable_variables here.
    assert sum("_trainable_variables" in name for name in final_one) == 6  # 3 kernels, 3 biases
    assert sorted(final_one) == sorted(final_ten)
    for name, value in final_one.items():
        np.testing.assert_allclose(final_ten[name], value, rtol=RTOL, atol=0, err_msg=name)

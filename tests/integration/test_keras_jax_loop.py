"""The built-in loop on Keras 3/JAX (job.keras: jax with job.task, issue 57; worker/jaxloop.py),
with real JAX processes from a jax-only install (.venv-jax: no TensorFlow, so any TensorFlow
import on this path fails the run): the bundled example trains on two local workers, one is
SIGKILLed mid-run, the cluster restarts whole and resumes at the step of the chief's latest
checkpoint, succeeds with identical final weights on both workers, evaluates, exports a
model.keras that loads back, and the killed worker is named as the first failure."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Cli, first_run_dir, free_ports, local_inventory, progress_in, wait_for
from tests.jaxonly import jax_only_python

pytestmark = pytest.mark.tf

JOB = "shapes"
WORKERS = ("worker-0", "worker-1")
STEPS = 200
EVERY = 20  # checkpoints
# 512 a step (256 a worker): about 20 steps/s on a loaded 2-core machine, so a kill after the
# second checkpoint lands mid-run without a delay written into the loop.
BATCH = 512
DIGEST = re.compile(r"worker: final weights sha256 ([0-9a-f]{64})")


def jax_loop_inventory(cli: Cli, python: str) -> Path:
    ports = free_ports(len(WORKERS))
    hosts = [f"name: {name}, address: localhost, port: {port}, python: {python}"
             for name, port in zip(WORKERS, ports, strict=True)]  # fmt: skip
    job = {"name": JOB, "task": "worker.examples.shapes:task", "keras": "jax", "steps": STEPS,
           "checkpoint_every": EVERY, "log_every": EVERY, "eval_every": 100, "batch_size": BATCH,
           "seed": 7, "export": "keras", "max_restarts": 2, "restart_backoff": 0,
           "env": {"TF_CPP_MIN_LOG_LEVEL": "2"}}  # fmt: skip
    return local_inventory(cli, hosts, job)


def test_the_bundled_example_trains_on_jax_survives_a_killed_worker_and_resumes(
    cli: Cli, reaper: list[str]
) -> None:
    python = jax_only_python()
    no_tf = subprocess.run([python, "-c", "import tensorflow"], capture_output=True, check=False)
    assert no_tf.returncode != 0, "the jax-only install has TensorFlow: the test proves nothing"
    inventory = jax_loop_inventory(cli, python)
    up = cli.popen("up", str(inventory), "--skip-checks")
    root = cli.cwd / "work" / JOB
    try:
        wait_for((cli.cwd / ".orchestrate" / "current").exists, 60, "the run's id")
        reaper.append((cli.cwd / ".orchestrate" / "current").read_text().strip())

        def saved_twice() -> bool:
            return (progress_in(first_run_dir(root, "worker-0")).get("checkpoint_step") or 0) >= (
                2 * EVERY
            )

        wait_for(saved_twice, timeout=180, what="the chief's second checkpoint")
        victim = first_run_dir(root, "worker-1")
        assert victim is not None
        os.kill(int((victim / "worker.pid").read_text()), signal.SIGKILL)
        _, err = up.communicate(timeout=240)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, err
    assert f"job {JOB} succeeded" in err
    restarts = cli.record()["restarts"]
    assert [(r["worker"], r["kind"], r["attempt"]) for r in restarts] == [
        ("worker-1", "killed", 0)
    ], restarts
    killed_at = progress_in(first_run_dir(root, "worker-0"))
    assert killed_at["step"] < STEPS, "the kill came after the run ended: it tested nothing"
    latest = killed_at["checkpoint_step"]  # the chief's latest checkpoint when the peer died
    digests = {}
    for name in WORKERS:
        resumed = first_run_dir(root, name, attempt=1)
        assert resumed is not None
        assert progress_in(resumed)["start_step"] == latest, name
        log = (resumed / "worker.log").read_text()
        assert f"restored checkpoint ckpt-{latest}" in log, log[-2000:]
        assert f"eval step {STEPS} val_loss" in log and "examples 1001" in log, log[-2000:]
        digests[name] = DIGEST.findall(log)
    assert digests["worker-0"] == digests["worker-1"] and len(digests["worker-0"]) == 1, digests

    status = cli.status()
    assert status["state"] == "succeeded"
    assert [(w["step"], w["checkpoint_step"]) for w in status["workers"]] == [(STEPS, STEPS)] * 2
    assert status["workers"][0]["val_accuracy"] > 0.5  # four classes: it learned
    assert [w["devices"] for w in status["workers"]] == [["/device:CPU:0"]] * 2
    checkpoints = sorted(p.name for p in (root / "checkpoints").glob("ckpt-*"))
    assert f"ckpt-{STEPS}.npz" in checkpoints, checkpoints
    # The controller reads the chief's NumPy checkpoints as TensorFlow's: nothing left to train.
    again = cli("up", str(inventory), "--skip-checks", check=True, timeout=120)
    assert f"ckpt-{STEPS} already reaches steps: {STEPS}: nothing to train" in " ".join(
        again.stderr.split()
    )

    # The chief's export loads back, in the jax-only install, with the weights both ended with.
    model = root / "export" / "model.keras"
    loaded = subprocess.run(
        [python, "-c", LOAD_AND_DIGEST, str(model)], capture_output=True, text=True,
        env={**os.environ, "KERAS_BACKEND": "jax"}, timeout=120, check=False,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == digests["worker-0"], loaded.stdout


LOAD_AND_DIGEST = """
import hashlib, sys
import keras, numpy as np
digest = hashlib.sha256()
for weight in keras.saving.load_model(sys.argv[1]).get_weights():
    digest.update(np.ascontiguousarray(weight, dtype=np.float32).tobytes())
print(digest.hexdigest())
"""

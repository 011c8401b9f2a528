"""Keras 3 on JAX across local workers (job.keras: jax, issue 57), with real JAX processes: a
model.fit script written as Keras' distribution guide writes one (tests/scripts/fit_keras3_jax.py)
trains on two workers, survives a SIGKILL of one of them (the survivor, left in gloo's
collective, is stopped; the cluster restarts whole and resumes from BackupAndRestore), ends
with bit-identical weights on both, and the killed worker is named as the first failure.

The workers run from the jax-only install (.venv-jax, tests/jaxonly.py: JAX and Keras 3, no
TensorFlow), as a JAX user's hosts do; the controller from this venv. .venv has no JAX: TensorFlow
imports it whenever it is installed, and every TensorFlow process of the suite paid for it.
`orchestrate local --keras jax` and its check of the saved inventory: test_keras_jax_only.py.

In the tf lane: CPU-bound worker processes, as the TensorFlow ones."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.conftest import (
    REPO,
    Cli,
    first_run_dir,
    free_ports,
    local_inventory,
    progress_in,
    wait_for,
)
from tests.jaxonly import jax_only_python

pytestmark = pytest.mark.tf

SCRIPT = REPO / "tests" / "scripts" / "fit_keras3_jax.py"
JOB = "fit_keras3_jax"
WORKERS = ("worker-0", "worker-1")
STEPS_PER_EPOCH = 8  # 256 examples, half each, 16 a batch
SAVE_EVERY = 4


def jax_inventory(cli: Cli, **job: object) -> Path:
    ports = free_ports(len(WORKERS))
    python = json.dumps(jax_only_python())
    hosts = [f"name: {name}, address: localhost, port: {port}, python: {python}"
             for name, port in zip(WORKERS, ports, strict=True)]  # fmt: skip
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "EPOCHS": "4", "SAVE_EVERY": str(SAVE_EVERY)}
    settings = {"name": JOB, "script": str(SCRIPT), "keras": "jax",
                "env": {**env, **job.pop("env", {})}, **job}  # type: ignore[dict-item]  # fmt: skip
    return local_inventory(cli, hosts, settings)


def finals(cli: Cli, attempt: int) -> dict[str, dict[str, object]]:
    """Each worker's checksum.json of `attempt`: its weights' digest, its process id and the
    TF_CONFIG it saw."""
    root = cli.cwd / "work" / JOB / "runs"
    return {path.parent.name: json.loads(path.read_text())
            for path in sorted(root.glob(f"*/attempt-{attempt}/*/checksum.json"))}  # fmt: skip


def test_keras3_fit_on_jax_survives_a_killed_worker_and_resumes(
    cli: Cli, reaper: list[str]
) -> None:
    # A backup inside the second epoch: BackupAndRestore keeps the epoch, so the restart
    # resumes at epoch 2, which its log shows. Both workers hold after it until the kill: the
    # next backup, at the second epoch's end, comes 1.2 s later, less than a busy machine may
    # take to see the first one.
    backed_up = STEPS_PER_EPOCH + SAVE_EVERY
    release = cli.cwd / "release-after-the-kill"
    hold = {"HOLD_FROM_STEP": str(backed_up), "HOLD_UNTIL": str(release)}
    inventory = jax_inventory(cli, max_restarts=2, restart_backoff=0,
                              env={"STEP_DELAY": "0.3", **hold})  # fmt: skip
    up = cli.popen("up", str(inventory), "--skip-checks")
    root = cli.cwd / "work" / JOB
    try:
        reaper.append(wait_for(lambda: _current(cli), timeout=60, what="the run's id"))

        def both_backed_up() -> bool:
            return all((progress_in(first_run_dir(root, name)).get("checkpoint_step") or 0)
                       >= backed_up for name in WORKERS)  # fmt: skip

        wait_for(both_backed_up, timeout=240, what="a backup in the second epoch on both")
        victim, survivor = (first_run_dir(root, name) for name in ("worker-1", "worker-0"))
        assert victim is not None and survivor is not None
        left = psutil.Process(int((survivor / "worker.pid").read_text()))
        os.kill(int((victim / "worker.pid").read_text()), signal.SIGKILL)
        release.touch()
        _, err = up.communicate(timeout=300)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, err
    assert f"job {JOB} succeeded" in err
    restarts = cli.record()["restarts"]
    assert [(r["worker"], r["kind"], r["attempt"]) for r in restarts] == [
        ("worker-1", "killed", 0)
    ], restarts
    assert not _alive(left), "the survivor of attempt 0 was left running"  # stopped, not hung
    assert finals(cli, 0) == {}  # neither finished in the attempt that lost a worker
    done = finals(cli, 1)
    assert sorted(done) == list(WORKERS), done
    assert len({d["sha256"] for d in done.values()}) == 1, f"the weights differ: {done}"
    assert [d["process"] for d in done.values()] == [0, 1]
    assert {d["tf_config"] for d in done.values()} == {None}  # a JAX cluster: no TF_CONFIG
    resumed = first_run_dir(root, "worker-1", attempt=1)
    assert resumed is not None
    log = (resumed / "worker.log").read_text()
    assert "Epoch 2/4" in log and "Epoch 1/4" not in log, log[-2000:]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _current(cli: Cli) -> str | None:
    try:
        return (cli.cwd / ".orchestrate" / "current").read_text().strip() or None
    except OSError:
        return None

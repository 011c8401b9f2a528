"""Users' own tf.keras 2 scripts as `script:` jobs on the local two-worker simulation, and the
failures TensorFlow users meet, each produced for real and explained with the fix.

The scripts (tests/scripts/) are written in the style of TensorFlow's multi-worker tutorials.
"In sync" means bit-identical weights: each worker writes a digest of its variables at the end.
Everything is tiny (a few steps of a two-layer model): TensorFlow's start-up is the cost.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, Cli, clean_env, free_ports, local_inventory, local_tf_inventory

pytestmark = pytest.mark.tf

SCRIPTS = REPO / "tests" / "scripts"


def script_inventory(cli: Cli, script: str, *, hosts: int = 2, **job: Any) -> Path:
    ports = free_ports(hosts)
    settings = {
        "name": Path(script).stem,
        "script": str(SCRIPTS / script),
        "env": {"TF_CPP_MIN_LOG_LEVEL": "2", **job.pop("env", {})},
        **job,
    }
    entries = [f"name: worker-{i}, address: localhost, port: {p}" for i, p in enumerate(ports)]
    return local_inventory(cli, entries, settings)


def checksums(cli: Cli, job: str) -> dict[str, str]:
    found = sorted((cli.cwd / "work" / job / "runs").glob("*/attempt-*/*/checksum.json"))
    return {path.parent.name: json.loads(path.read_text())["sha256"] for path in found}


def assert_trained_in_sync(cli: Cli, job: str, workers: int = 2) -> None:
    sums = checksums(cli, job)
    assert len(sums) == workers, sums
    assert len(set(sums.values())) == 1, f"the workers' weights differ: {sums}"


def test_custom_loop_with_keras2_metrics_trains_in_sync_under_legacy(cli: Cli) -> None:
    result = cli("local", str(SCRIPTS / "ctl_keras2.py"), "--keras", "legacy",
                 "--workdir", "./work", "--skip-checks", timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert 'keras: "legacy"' in result.stderr  # the inventory it built is shown
    assert "job ctl_keras2 succeeded" in result.stderr
    assert_trained_in_sync(cli, "ctl_keras2")
    status = cli.status()
    assert [w["step"] for w in status["workers"]] == [8, 8]  # worker.report() from the script


def test_fit_with_backup_and_restore_trains_in_sync_under_legacy(cli: Cli) -> None:
    inventory = script_inventory(cli, "fit_mwms.py", keras="legacy")
    check = cli("check", "--json", str(inventory), check=True)
    keras = [f for f in json.loads(check.stdout) if f["check"] == "keras"]
    assert [f["status"] for f in keras] == ["ok", "ok"]
    assert "tf_keras 2.21" in keras[0]["detail"]
    result = cli("up", str(inventory), timeout=240)
    assert result.returncode == 0, result.stderr
    assert_trained_in_sync(cli, "fit_mwms")
    # keras_progress() in its callbacks (issue 56): the steps, loss and saves of model.fit
    assert "job fit_mwms succeeded at step 8" in result.stderr
    status = cli("status", "--json", check=True).stdout
    workers = json.loads(status)["workers"]
    assert [(w["step"], w["target_steps"]) for w in workers] == [(8, 8), (8, 8)], workers
    assert all(w["loss"] is not None for w in workers), workers
    # The chief's saves are its own; worker-1 sees them in the shared directory as they land,
    # which may be after its own epoch's end (an epoch late, or never for the last one).
    assert workers[0]["checkpoint_step"] == 8, workers
    assert workers[1]["checkpoint_step"] in (None, 4, 8), workers
    assert json.loads(status)["goodput"]["goodput"] is not None  # start-up told from training
    checkpoints = cli.cwd / "work" / "fit_mwms" / "checkpoints"
    assert (checkpoints / "saved" / "model.keras").is_file()  # the chief's save
    run_dir = next((cli.cwd / "work" / "fit_mwms" / "runs").glob("*/attempt-0/worker-1"))
    assert not list(run_dir.glob("write-dir-*")), "worker-1 left its temporary save behind"


def test_fit_under_keras3_fails_at_once_naming_the_legacy_setting(cli: Cli) -> None:
    inventory = script_inventory(cli, "fit_mwms.py", max_restarts=3, restart_backoff=0)
    result = cli("up", "--skip-checks", str(inventory), timeout=240)
    assert result.returncode == 1
    assert "set job.keras: legacy" in result.stderr
    assert "after 0 restart(s)" in result.stderr
    status = cli.status()
    assert status["restarts"] == 0
    assert "set job.keras: legacy" in status["outcome"]
    failed = [w for w in status["workers"] if w["state"] == "failed"]
    assert failed and failed[0]["failure_kind"] == "keras api"
    assert "job.keras: legacy" in failed[0]["hint"]
    shown = cli("status").stdout
    assert "what to do:" in shown and "job.keras: legacy" in shown


def test_mirrored_fit_on_one_host_under_legacy(cli: Cli) -> None:
    result = cli("local", str(SCRIPTS / "fit_mirrored.py"), "-n", "1", "--keras", "legacy",
                 "--workdir", "./work", "--skip-checks", timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert_trained_in_sync(cli, "fit_mirrored", workers=1)
    assert "replicas 2" in cli("tail", "-n", "200").stdout


def load_export(code: str) -> str:
    """Run `code` in a fresh Python with tf.keras 2 (as a user would load the export)."""
    env = clean_env(TF_USE_LEGACY_KERAS="1")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=240, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_builtin_loop_under_legacy_and_a_checkpoint_of_the_other_keras_refused(cli: Cli) -> None:
    inventory = local_tf_inventory(cli, steps=20, keras="legacy", checkpoint_every=10,
                                   export="keras")  # fmt: skip
    first = cli("up", "--skip-checks", str(inventory), timeout=240)
    assert first.returncode == 0, first.stderr
    marker = cli.cwd / "work" / "shapes" / "checkpoints" / "keras.json"
    assert json.loads(marker.read_text())["module"] == "tf_keras"
    # The export works under tf.keras 2 too: the full model as a SavedModel directory...
    export = cli.cwd / "work" / "shapes" / "export"
    model = str(export / "model")
    loaded = load_export(
        f"import tf_keras; print(tf_keras.models.load_model({model!r}).count_params())"
    )
    assert loaded.isdigit() and int(loaded) > 0
    # ...and an inference SavedModel (the finished job exports again without training).
    local_tf_inventory(cli, steps=20, keras="legacy", checkpoint_every=10, export="saved_model")
    assert cli("up", "--skip-checks", str(inventory), timeout=240).returncode == 0
    saved = str(export / "saved_model")
    signatures = load_export(
        f"import tensorflow as tf; print(len(tf.saved_model.load({saved!r}).signatures))"
    )
    assert int(signatures) >= 1
    local_tf_inventory(cli, steps=30, checkpoint_every=10, max_restarts=2)  # Keras 3 now
    second = cli("up", "--skip-checks", str(inventory), timeout=240)
    assert second.returncode == 1
    assert "written with job.keras: legacy" in second.stderr
    assert cli.status()["restarts"] == 0  # a usage error: never retried


def test_busy_port_is_named_with_the_fix(cli: Cli) -> None:
    inventory = script_inventory(cli, "ctl_keras2.py", keras="legacy", max_restarts=0)
    port = int(inventory.read_text().split("port: ")[1].split("}")[0])
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", port))
        holder.listen()
        result = cli("up", "--skip-checks", str(inventory), timeout=240)
    assert result.returncode == 1
    assert "Could not start gRPC server" in result.stderr or "port" in result.stderr
    assert "holds the worker's TensorFlow port" in result.stderr


def test_killed_peer_is_reported_as_the_first_failure(cli: Cli) -> None:
    inventory = script_inventory(cli, "ctl_keras2.py", keras="legacy", max_restarts=0,
                                 env={"EPOCHS": "50", "STEP_DELAY": "0.2"})  # fmt: skip
    up = cli.popen("up", str(inventory), "--skip-checks")
    try:
        status = cli.status_when(
            lambda s: all((w["step"] or 0) >= 2 for w in s["workers"]), timeout=120
        )
        victim = next(w for w in status["workers"] if w["name"] == "worker-1")
        os.kill(victim["pid"], signal.SIGKILL)
        _, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 1, err
    assert "the worker that failed first: worker-1" in err
    assert "SIGKILL" in err and "OOM killer" in err


def test_a_script_that_leaves_early_is_blamed_not_its_waiting_peer(cli: Cli) -> None:
    # worker-1 waits for its peer before its first step: start_timeout is that limit.
    inventory = script_inventory(cli, "early_exit.py", start_timeout=8, max_restarts=3)
    result = cli("up", "--skip-checks", str(inventory), timeout=240)
    assert result.returncode == 1
    assert "the worker that failed first: worker-0" in result.stderr
    assert "exited (code 0) while worker-1 still waited for it" in result.stderr
    assert "after 0 restart(s)" in result.stderr
    assert "MultiWorkerMirroredStrategy first" in result.stderr


def test_a_script_that_never_creates_the_strategy_never_joined(cli: Cli) -> None:
    # Both workers exit 0, each having trained alone: no success (issue 28).
    inventory = script_inventory(cli, "no_strategy.py", max_restarts=3)
    result = cli("up", "--skip-checks", str(inventory), timeout=240)
    assert result.returncode == 1, result.stderr
    assert (
        "never joined the cluster: does the script create MultiWorkerMirroredStrategy "
        "before any other TensorFlow op?" in result.stderr
    )
    assert "after 0 restart(s)" in result.stderr
    status = cli.status()  # the first to exit is the cause; its peer may be stopped first
    assert "left early" in {w["failure_kind"] for w in status["workers"]}
    assert "never joined the cluster" in status["outcome"]


def test_a_one_worker_script_without_the_strategy_succeeds(cli: Cli) -> None:
    inventory = script_inventory(cli, "no_strategy.py", hosts=1)
    result = cli("up", "--skip-checks", str(inventory), timeout=240)
    assert result.returncode == 0, result.stderr
    assert "job no_strategy succeeded at step 3" in result.stderr


def test_keras3_fit_reports_its_progress_through_the_callback(cli: Cli) -> None:
    inventory = script_inventory(cli, "fit_keras3_alone.py", hosts=1)
    result = cli("up", "--skip-checks", str(inventory), timeout=240)
    assert result.returncode == 0, result.stderr
    assert "job fit_keras3_alone succeeded at step 8" in result.stderr
    (worker,) = cli.status()["workers"]
    assert (worker["step"], worker["target_steps"], worker["checkpoint_step"]) == (8, 8, 8)
    assert worker["loss"] is not None and worker["val_loss"] is not None, worker
    assert "keras 3." in cli("tail", "-n", "50", check=True).stdout


def test_a_failures_excerpt_leaves_tensorflows_start_up_noise_out(cli: Cli) -> None:
    # TF_CPP_MIN_LOG_LEVEL as a user has it (unset: 0), so TensorFlow prints its CUDA lines.
    inventory = script_inventory(cli, "fails_after_import.py", hosts=1, max_restarts=0,
                                 env={"TF_CPP_MIN_LOG_LEVEL": "0"})  # fmt: skip
    result = cli("up", "--skip-checks", str(inventory), timeout=240)
    assert result.returncode == 1, result.stderr
    assert "ValueError: bad batch shape at step 5" in result.stderr
    logs = cli("tail", "-n", "50", check=True).stdout
    assert "cudart_stub.cc" in logs or "cpu_feature_guard" in logs  # the noise was there
    for noise in ("cudart_stub.cc", "cpu_feature_guard", "oneDNN", "cuInit", "InitializeLog"):
        assert noise not in result.stderr, result.stderr


def test_missing_user_module_points_at_files_and_is_not_retried(cli: Cli) -> None:
    inventory = script_inventory(cli, "missing_module.py", max_restarts=3)
    result = cli("up", "--skip-checks", str(inventory), timeout=120)
    assert result.returncode == 1
    assert "cannot import 'shapes_helpers'" in result.stderr
    assert "shapes_helpers.py" in result.stderr and "job.files:" in result.stderr
    assert cli.status()["restarts"] == 0


def test_out_of_memory_points_at_the_memory_settings(cli: Cli) -> None:
    inventory = script_inventory(cli, "out_of_memory.py", max_restarts=0)
    result = cli("up", "--skip-checks", str(inventory), timeout=120)
    assert result.returncode == 1
    assert "MemoryError" in result.stderr
    assert "ran out of memory" in result.stderr and "batch_size" in result.stderr
    status = cli("status").stdout
    assert "what to do: the worker ran out of memory" in textwrap.dedent(status)

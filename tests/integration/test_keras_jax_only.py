"""Issue 57's promise to a Keras 3 user: a script written as Keras' distribution guide writes one
(keras.distribution.initialize() from the environment, DataParallel, BackupAndRestore:
tests/scripts/fit_keras3_jax.py), installed with `pip install '.[jax]'` only (no TensorFlow
anywhere), runs unchanged on two local workers under `orchestrate local --keras jax` (its
preflight included), both end with the same weights, and the inventory it saved is checked for
JAX and Keras 3 on each worker, not TensorFlow. The check reads them from the workers' Python
(a local host's is the controller's): run from the dev venv, which has no JAX, it fails.

In the tf lane: CPU-bound worker processes."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import REPO, Cli, clean_env
from tests.jaxonly import jax_only_python

pytestmark = pytest.mark.tf

SCRIPT = REPO / "tests" / "scripts" / "fit_keras3_jax.py"


def test_a_keras_guide_script_trains_from_a_jax_only_install(cli: Cli) -> None:
    python = jax_only_python()
    probe = subprocess.run([python, "-c", "import tensorflow"], capture_output=True, text=True,
                           env=clean_env(), timeout=60, check=False)  # fmt: skip
    assert probe.returncode != 0 and "No module named 'tensorflow'" in probe.stderr
    run = subprocess.run(
        [python, "-m", "orchestrator", "local", str(SCRIPT), "--keras", "jax",
         "--workdir", "./work", "--save", "local.yaml"],
        cwd=cli.cwd, env=clean_env(EPOCHS="2"), capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "job fit_keras3_jax succeeded" in run.stderr
    sums = {p.parent.name: json.loads(p.read_text())["sha256"]
            for p in (cli.cwd / "work").rglob("attempt-0/*/checksum.json")}  # fmt: skip
    assert sorted(sums) == ["worker-0", "worker-1"] and len(set(sums.values())) == 1, sums
    assert 'keras: "jax"' in (cli.cwd / "local.yaml").read_text()
    found = subprocess.run([python, "-m", "orchestrator", "check", "--json", "local.yaml"],
                           cwd=cli.cwd, env=clean_env(), capture_output=True, text=True,
                           timeout=120, check=False)  # fmt: skip
    assert found.returncode == 0, found.stdout + found.stderr
    check = json.loads(found.stdout)
    jax = [f for f in check if f["check"] == "jax"]
    assert [(f["status"], f["detail"]) for f in jax] == [
        ("ok", "JAX 0.10.2, Keras 3.15.1 (job.keras: jax)")] * 2, jax  # fmt: skip
    assert not [f for f in check if f["check"] == "tensorflow"], check
    # The same inventory from the dev venv: its workers' Python is that one, without JAX.
    elsewhere = cli("check", "--json", "local.yaml", timeout=120)
    assert elsewhere.returncode != 0, elsewhere.stdout
    jax = [f for f in json.loads(elsewhere.stdout) if f["check"] == "jax"]
    assert [(f["status"], f["detail"]) for f in jax] == [
        ("fail", "job.keras is jax but JAX is not installed")] * 2, jax  # fmt: skip

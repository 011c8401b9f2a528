"""Issue 57's promise to a Keras 3 user: a script written as Keras' distribution guide writes one
(keras.distribution.initialize() from the environment, DataParallel, BackupAndRestore:
tests/scripts/fit_keras3_jax.py), installed with `pip install '.[jax]'` only (no TensorFlow
anywhere), runs unchanged on two local workers under `orchestrate local --keras jax`.

In the tf lane: CPU-bound worker processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env
from tests.jaxonly import jax_only_python

pytestmark = pytest.mark.tf

SCRIPT = REPO / "tests" / "scripts" / "fit_keras3_jax.py"


def test_a_keras_guide_script_trains_from_a_jax_only_install(tmp_path: Path) -> None:
    python = jax_only_python()
    probe = subprocess.run([python, "-c", "import tensorflow"], capture_output=True, text=True,
                           env=clean_env(), timeout=60, check=False)  # fmt: skip
    assert probe.returncode != 0 and "No module named 'tensorflow'" in probe.stderr
    run = subprocess.run(
        [python, "-m", "orchestrator", "local", str(SCRIPT), "--keras", "jax",
         "--workdir", "./work", "--save", "local.yaml"],
        cwd=tmp_path, env=clean_env(EPOCHS="2"), capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "job fit_keras3_jax succeeded" in run.stderr
    sums = {p.parent.name: json.loads(p.read_text())["sha256"]
            for p in (tmp_path / "work").rglob("attempt-0/*/checksum.json")}  # fmt: skip
    assert sorted(sums) == ["worker-0", "worker-1"] and len(set(sums.values())) == 1, sums

"""Where the tests' MLflow tracking server runs from: a venv of its own (.venv-mlflow, made by
scripts/test.sh in the background from pyproject.toml's tracking-server extra), not the suite's
.venv, whose TensorFlow workers would otherwise import the pandas, scikit-learn and matplotlib
that full MLflow brings (Keras 3 imports them whenever they are installed)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-mlflow"
# scripts/test.sh touches it when the install ended well (it runs beside the first tests).
INSTALLED = VENV / "installed"
PYTHON_ENV = "ORCHESTRATE_MLFLOW_SERVER_PYTHON"  # another Python with mlflow (full) installed
INSTALL_WAIT = 900.0  # seconds: a cold pip install of mlflow and its dependencies


def server_python() -> str:
    """The Python that runs `mlflow server`; waits for scripts/test.sh's install in progress.
    A missing server is a failure that says how to install it, never a skip."""
    chosen = os.environ.get(PYTHON_ENV)
    if chosen:
        return chosen
    if not VENV.exists():
        raise AssertionError(
            f"no MLflow tracking server: {VENV} does not exist. scripts/test.sh makes it; by "
            f"hand: python3 -m venv .venv-mlflow && .venv-mlflow/bin/pip install "
            f"'mlflow==<the tracking-server extra's version in pyproject.toml>' && touch "
            f"{INSTALLED} (or set {PYTHON_ENV})"
        )
    wait_for(INSTALLED.exists, INSTALL_WAIT, f"{INSTALLED} (scripts/test.sh installs MLflow)")
    return str(VENV / "bin" / "python")

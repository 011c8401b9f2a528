"""A jax-only install, as a user of `job.keras: jax` makes it: `pip install '.[jax]'` (JAX's CPU
build, Keras 3, orchestrate; no TensorFlow) in a venv of its own, .venv-jax, made by
scripts/test.sh in the background."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-jax"
INSTALLED = VENV / "installed"  # scripts/test.sh touches it when the install ended well
INSTALL_WAIT = 900.0  # seconds: a cold pip install of jax, jaxlib and keras


def jax_only_python() -> str:
    """Its Python; waits for scripts/test.sh's install in progress. Missing: a failure that
    says how to make it, never a skip."""
    if not VENV.exists():
        raise AssertionError(
            f"no jax-only install: {VENV} does not exist. scripts/test.sh makes it; by hand: "
            f"python3 -m venv .venv-jax && .venv-jax/bin/pip install '.[jax]' && touch {INSTALLED}"
        )
    wait_for(INSTALLED.exists, INSTALL_WAIT, f"{INSTALLED} (scripts/test.sh installs it)")
    return os.fspath(VENV / "bin" / "python")

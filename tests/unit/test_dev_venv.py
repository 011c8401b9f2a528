"""The venv the suite runs in holds none of the packages that TensorFlow or Keras 3 import merely
because they are installed: each would cost every TensorFlow process of the suite CPU on its
import (docs/development.md, the venvs). JAX (tf.lite imports it): 0.75 s of CPU per
TensorFlow import, measured; pandas, scikit-learn and matplotlib (Keras 3): about 2 s. Their
tests run them from venvs of their own (.venv-jax, .venv-mlflow). A .venv made before JAX left
the dev extra still has it: this names what to uninstall."""

from __future__ import annotations

import importlib.metadata

import pytest

# Distribution names, as pip spells them.
IMPORTED_WHEN_INSTALLED = ("jax", "jaxlib", "pandas", "scikit-learn", "matplotlib")


def installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.parametrize("name", IMPORTED_WHEN_INSTALLED)
def test_the_suites_venv_lacks_what_tensorflow_imports_when_present(name: str) -> None:
    assert not installed(name), (
        f"{name} is installed in the venv the TensorFlow processes of the suite run from: "
        f"TensorFlow or Keras imports it in each of them. `pip uninstall {name}` (a .venv made "
        "before it left the dev extra keeps it); a test that needs it runs it from a venv of "
        "its own (tests/jaxonly.py, tests/mlflowserver.py)"
    )


def test_it_can_tell_an_installed_package() -> None:
    assert installed("pytest") and not installed("no-such-distribution-orchestrate")

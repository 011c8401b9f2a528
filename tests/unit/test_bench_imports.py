"""Every benchmark at least imports: mypy does not check bench/, and a renamed helper in the
controller would otherwise break a benchmark unnoticed until someone runs it."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import bench

# Scripts that run TensorFlow on the device they are started on: compiled, not imported.
SCRIPTS = {"minimal_mwms", "gpu_check"}
BENCHMARKS = sorted(
    module.name for module in pkgutil.iter_modules(bench.__path__) if module.name not in SCRIPTS
)


def test_there_are_benchmarks() -> None:
    assert "bench_recovery" in BENCHMARKS


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_compiles(name: str) -> None:
    path = Path(bench.__path__[0]) / f"{name}.py"
    compile(path.read_text(encoding="utf-8"), str(path), "exec")

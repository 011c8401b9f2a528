"""The software checks every backend's preflight shares (backends/software.py): pure decisions,
and the Slurm node probe that feeds them, run for real with this interpreter."""

from __future__ import annotations

import importlib.metadata
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import __version__
from orchestrator.backends.slurm.checks import node_probe, node_software
from orchestrator.backends.software import Software, Where, software_findings
from orchestrator.contract import ISOLATED, KERAS_LEGACY
from orchestrator.model.findings import Finding, Status
from orchestrator.model.inventory import Job

TASK = Job(name="j", task="pkg.mod:task", steps=10)
SCRIPT = Job(name="j", script="/s/train.py")
SLURM = Where("slurm.python", "node")


def software(tensorflow: str | None = "2.21.0", tf_keras: str | None = None,
             worker: str | None = __version__, python: str = "3.11.7") -> Software:  # fmt: skip
    return Software(python, {"tensorflow": tensorflow, "tf-keras": tf_keras,
                             "tf-orchestrate": worker})  # fmt: skip


def by_check(findings: list[Finding], machine: str) -> dict[str, Finding]:
    return {f.check: f for f in findings if f.host == machine}


def test_a_good_task_machine_passes_python_tensorflow_and_worker() -> None:
    found = by_check(software_findings(TASK, {"n1": software()}, SLURM), "n1")
    assert list(found) == ["python", "tensorflow", "worker"]
    assert all(f.status is Status.OK for f in found.values())
    assert found["worker"].detail == f"orchestrate worker {__version__}"


@pytest.mark.parametrize(("installed", "words"), [
    (None, "not installed"), ("0.0.1", f"0.0.1 differs from the controller's {__version__}"),
])  # fmt: skip
def test_a_task_needs_the_controllers_worker_version(installed: str | None, words: str) -> None:
    found = by_check(software_findings(TASK, {"n1": software(worker=installed)}, SLURM), "n1")
    assert found["worker"].status is Status.FAIL and words in found["worker"].detail
    hint = found["worker"].hint or ""
    assert hint.startswith("pip install '.[worker]' in a clone of orchestrate")
    assert f"at version {__version__} on the node" in hint
    assert "'orchestrate[" not in hint  # PyPI's orchestrate is another project


def test_a_script_is_not_asked_for_the_worker_and_only_warned_without_tensorflow() -> None:
    found = by_check(software_findings(SCRIPT, {"a": software(None, worker=None)}, Where()), "a")
    assert "worker" not in found
    assert found["tensorflow"].status is Status.WARN
    assert found["tensorflow"].hint == (
        "pip install '.[worker]' in a clone of orchestrate (tf-orchestrate) into the Python "
        "named by 'python:', or pip install '/path/to/the/clone[worker]'"
    )
    task = by_check(software_findings(TASK, {"a": software(None)}, Where()), "a")
    assert task["tensorflow"].status is Status.FAIL


@pytest.mark.parametrize(("tf_keras", "status", "words"), [
    ("2.21.0", Status.OK, "tf_keras 2.21.0"),
    (None, Status.FAIL, "tf_keras (Keras 2) is not installed"),
    ("2.20.1", Status.FAIL, "does not match TensorFlow 2.21.0"),
])  # fmt: skip
def test_legacy_keras_needs_tf_keras_of_tensorflows_minor(
    tf_keras: str | None, status: Status, words: str
) -> None:
    legacy = Job(name="j", script="/s/train.py", keras=KERAS_LEGACY)
    found = by_check(software_findings(legacy, {"n1": software(tf_keras=tf_keras)}, SLURM), "n1")
    assert found["keras"].status is status and words in found["keras"].detail
    if status is Status.FAIL:
        assert "'tf-keras~=2.21.0' into the Python named by slurm.python" in str(
            found["keras"].hint
        )
    assert "keras" not in by_check(software_findings(SCRIPT, {"n1": software()}, SLURM), "n1")


def test_versions_are_judged_across_the_machines() -> None:
    machines = {"n1": software(), "n2": software("2.20.0", python="3.10.12")}
    findings = software_findings(TASK, machines, SLURM)
    for name in machines:
        found = by_check(findings, name)
        assert found["tensorflow"].status is Status.FAIL
        assert "mixes 2.20.0, 2.21.0" in found["tensorflow"].detail
        assert found["python"].status is Status.WARN
        assert "3.10.12, 3.11.7" in found["python"].detail


def test_a_node_answer_of_the_wrong_shape_reads_as_not_installed() -> None:
    packages = {"tensorflow": 2.21, "tf-keras": ["x"], "tf-orchestrate": "0.1.0"}
    read = node_software({"node": "n1", "python": "3.11.7", "packages": packages})
    assert read.tensorflow is None and read.packages["tf-keras"] is None
    assert read.packages["tf-orchestrate"] == "0.1.0"
    assert node_software({"node": "n1", "packages": "nope"}).packages["tf-orchestrate"] is None


def test_the_node_probe_reports_the_packages_the_checks_judge(tmp_path: Path) -> None:
    """The probe srun runs on every node, run here as srun would (isolated, in a directory)."""
    (tmp_path / ".orchestrate-shared-check").write_text("t0k3n")
    probe = node_probe({str(tmp_path): "t0k3n"})
    answer = subprocess.run([sys.executable, *ISOLATED, "-c", probe], cwd=tmp_path,
                            capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    found = node_software(json.loads(answer.stdout))
    assert found.packages["tf-orchestrate"] == __version__
    # What this interpreter has: the unprivileged unit run's venv has neither TensorFlow nor
    # tf-keras, and the probe must then say so rather than fail.
    assert found.packages["tf-keras"] == installed("tf-keras")
    assert found.tensorflow == installed("tensorflow")
    assert json.loads(answer.stdout)["seen"] == {str(tmp_path): True}
    # What this machine's name resolves to, as gloo (keras: jax) resolves it.
    name = socket.gethostname()
    expected = list(dict.fromkeys(a[4][0] for a in socket.getaddrinfo(name, None, 0, 1)))
    assert json.loads(answer.stdout)["addresses"] == expected


def installed(package: str) -> str | None:
    """The version of `package` in this interpreter, or None where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None

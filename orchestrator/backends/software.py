"""The software a worker's machine needs for the job: one list of checks for every backend's
preflight, judged from what a probe found on each machine (hosts: the host probe, in
backends/hosts/checks.py; Slurm: the node probe, in backends/slurm/checks.py). Pure.

The checks, per machine and in this order:
- python: the version the worker runs (different ones across the machines: a warning);
- tensorflow: installed (a task job fails without it, a script only warns: it may not need it),
  and one version everywhere (collectives between different versions fail);
- worker (a task job): the orchestrate worker package, of the controller's version;
- keras (`job.keras: legacy`): tf_keras of TensorFlow's minor version;
- jax (`job.keras: jax`, instead of tensorflow: such a host needs no TensorFlow): JAX and
  Keras 3 installed, one version of each everywhere.
Beside them, not software but judged alike by both backends from their probes' answers:
- gloo (`job.keras: jax`): the machine's own name resolves to an address its peers reach.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator import __version__
from orchestrator.contract import (
    DISTRIBUTION,
    JAX_PACKAGE,
    KERAS_JAX,
    KERAS_LEGACY,
    KERAS_PACKAGE,
    TF_KERAS_PACKAGE,
    TF_PACKAGES,
    install_hint,
    minor_version,
    tf_keras_requirement,
)
from orchestrator.model.findings import Finding, Status
from orchestrator.model.inventory import Job
from orchestrator.paths import is_loopback

WORKER_PACKAGE = DISTRIBUTION  # not "orchestrate": on PyPI that is another project
# The distributions every probe reports the versions of, where the worker will import from.
PACKAGES = (*TF_PACKAGES, TF_KERAS_PACKAGE, WORKER_PACKAGE, JAX_PACKAGE, KERAS_PACKAGE)


@dataclass(frozen=True)
class Software:
    """What a probe found where one worker will run: its Python's version and the versions of
    PACKAGES (None: not installed)."""

    python: str
    packages: Mapping[str, str | None]

    @property
    def tensorflow(self) -> str | None:
        return next((self.packages[n] for n in TF_PACKAGES if self.packages.get(n)), None)


@dataclass(frozen=True)
class Where:
    """How the hints name the place: the setting that picks the workers' Python (hosts'
    `'python:'`, Slurm's `slurm.python`) and what a machine is called (host, node)."""

    python: str = "'python:'"
    machine: str = "host"


def software_findings(job: Job, found: Mapping[str, Software], where: Where) -> list[Finding]:
    """Every machine's findings, in the module's order: `found` maps a machine's name to what
    its probe found."""
    pythons = sorted({s.python for s in found.values()})
    versions = sorted({v for v in (s.tensorflow for s in found.values()) if v})
    findings = []
    for name, software in found.items():
        findings.append(python_finding(name, software.python, pythons))
        if job.keras == KERAS_JAX:
            findings.append(jax_finding(name, software, found, where))
            if software.tensorflow:
                findings.append(beside_jax_finding(name, software.tensorflow, where))
            if job.task is not None:  # the built-in loop on JAX is the worker package's
                findings.append(worker_finding(name, software.packages.get(WORKER_PACKAGE), where))
            continue
        findings.append(tensorflow_finding(name, software.tensorflow, versions, job, where))
        if job.task is not None:
            findings.append(worker_finding(name, software.packages.get(WORKER_PACKAGE), where))
        if job.keras == KERAS_LEGACY:
            tf_keras = software.packages.get(TF_KERAS_PACKAGE)
            findings.append(legacy_keras_finding(name, software.tensorflow, tf_keras, where))
    return findings


def python_finding(name: str, version: str, everywhere: list[str]) -> Finding:
    if len(everywhere) > 1:
        return Finding(name, "python", Status.WARN,
                       f"Python {version}, but the workers run {', '.join(everywhere)}",
                       "the same Python everywhere avoids packages that differ between "
                       "them")  # fmt: skip
    return Finding(name, "python", Status.OK, f"Python {version}")


def tensorflow_finding(
    name: str, version: str | None, everywhere: list[str], job: Job, where: Where
) -> Finding:
    if version is None:
        return Finding(
            name,
            "tensorflow",
            Status.FAIL if job.task is not None else Status.WARN,
            f"TensorFlow is not installed for the {where.machine}'s python",
            hint=install_hint("worker", f"into the Python named by {where.python}"),
        )
    if len(everywhere) > 1:
        return Finding(
            name,
            "tensorflow",
            Status.FAIL,
            f"TensorFlow {version}, but the cluster mixes {', '.join(everywhere)}: "
            "collectives between different versions fail",
            hint=f"install the same TensorFlow version on every {where.machine}",
        )
    return Finding(name, "tensorflow", Status.OK, f"TensorFlow {version}")


def worker_finding(name: str, installed: str | None, where: Where) -> Finding:
    if installed == __version__:
        return Finding(name, "worker", Status.OK, f"orchestrate worker {installed}")
    detail = (
        "the orchestrate worker package is not installed"
        if installed is None
        else f"orchestrate worker {installed} differs from the controller's {__version__}"
    )
    hint = install_hint("worker", f"at version {__version__} on the {where.machine}")
    return Finding(name, "worker", Status.FAIL, detail, hint)


def legacy_keras_finding(
    name: str, tensorflow: str | None, tf_keras: str | None, where: Where
) -> Finding:
    """`job.keras: legacy` needs tf-keras of the machine's TensorFlow minor version:
    TensorFlow silently falls back to nothing (`tf.keras` raises ImportError) without it, and
    tf-keras 2.X imports APIs of TensorFlow 2.X only."""
    wanted = tf_keras_requirement(tensorflow) if tensorflow else TF_KERAS_PACKAGE
    hint = (
        f"pip install '{wanted}' into the Python named by {where.python} "
        f"(or {install_hint('legacy-keras', 'there')})"
    )
    if tf_keras is None:
        detail = "job.keras is legacy but tf_keras (Keras 2) is not installed"
        return Finding(name, "keras", Status.FAIL, detail, hint)
    if tensorflow and minor_version(tf_keras) != minor_version(tensorflow):
        return Finding(
            name,
            "keras",
            Status.FAIL,
            f"tf_keras {tf_keras} does not match TensorFlow {tensorflow}: tf_keras must have "
            "TensorFlow's minor version",
            hint,
        )
    return Finding(name, "keras", Status.OK, f"tf_keras {tf_keras} (Keras 2, job.keras: legacy)")


def jax_finding(
    name: str, software: Software, found: Mapping[str, Software], where: Where
) -> Finding:
    """`job.keras: jax` needs JAX and Keras 3 where the worker runs, and one version of each on
    every machine: the processes compile and run one program together, and its collectives
    between different versions fail."""
    hint = install_hint("jax", f"into the Python named by {where.python}")
    jax, keras = software.packages.get(JAX_PACKAGE), software.packages.get(KERAS_PACKAGE)
    missing = [label for label, version in (("JAX", jax), ("Keras", keras)) if version is None]
    if missing:
        detail = f"job.keras is jax but {' and '.join(missing)} is not installed"
        return Finding(name, "jax", Status.FAIL, detail, hint)
    assert jax is not None and keras is not None
    if not keras.split(".")[0].isdigit() or int(keras.split(".")[0]) < 3:
        return Finding(name, "jax", Status.FAIL, f"Keras {keras} is not Keras 3: "
                       "keras.distribution and the JAX backend need Keras 3", hint)  # fmt: skip
    for label, package in (("JAX", JAX_PACKAGE), ("Keras", KERAS_PACKAGE)):
        everywhere = sorted({v for v in (s.packages.get(package) for s in found.values()) if v})
        if len(everywhere) > 1:
            return Finding(name, "jax", Status.FAIL,
                           f"{label} {software.packages.get(package)}, but the cluster mixes "
                           f"{', '.join(everywhere)}: its processes run one program together",
                           hint=f"install the same {label} version on every "
                           f"{where.machine}")  # fmt: skip
    return Finding(name, "jax", Status.OK, f"JAX {jax}, Keras {keras} (job.keras: jax)")


def beside_jax_finding(name: str, tensorflow: str, where: Where) -> Finding:
    """TensorFlow installed where a `keras: jax` worker runs: Keras 3 imports it lazily (its
    data adapters, its export), and its own copy of the XLA runtime beside JAX's once aborted
    both tasks of a job in JAX's coordination service mid-`model.fit` (docs/keras3.md)."""
    return Finding(name, "tensorflow", Status.WARN,
                   f"TensorFlow {tensorflow} is installed beside JAX: Keras 3 may import it "
                   "mid-run, and its second XLA runtime has aborted JAX's coordination",
                   hint="give the jax job a Python without TensorFlow: "
                   + install_hint("jax", f"into a new venv, named by {where.python}"))  # fmt: skip


def gloo_finding(
    name: str, hostname: str | None, addresses: Sequence[str], reached_at: str
) -> Finding:
    """`keras: jax` on several machines: JAX's gloo collectives bind the first address the
    machine's own name resolves to and tell the other workers to connect there (JAX offers no
    setting for it), so a name at loopback (Debian's 127.0.1.1) sends every peer to its own
    machine and the first collective times out. `reached_at`: where the peers reach it."""
    said, first = hostname or "the machine's name", next(iter(addresses), None)
    if first is not None and not is_loopback(first):
        return Finding(name, "gloo", Status.OK, f"{said} resolves to {first}")
    found = f"resolves to {first}" if first else "resolves to no address"
    return Finding(name, "gloo", Status.FAIL,
                   f"{said} {found} on {name}: JAX's gloo collectives (keras: jax) tell the "
                   "other workers that address, and they cannot reach it there",
                   hint=f"map {said} to the address the others reach {name} at ({reached_at}) "
                   "in its /etc/hosts or DNS")  # fmt: skip

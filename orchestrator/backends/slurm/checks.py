"""Slurm's preflight: before submitting, find what would make the job fail or wait forever.

1. the partition exists and has N usable nodes (sinfo);
2. one short srun on N nodes: each node's Python, TensorFlow, worker package and (keras:
   legacy) tf_keras, judged by the software checks every backend shares (backends/software.py),
   and (keras: jax) what the node's own name resolves to, for gloo;
3. the job directory and the checkpoint directory are on a filesystem every node and the login
   node see: the login node (this machine, or slurm.login's) writes a token file there, every
   task reads it and writes its own answer beside it, and the login node reads every answer
   back. A node-local directory (a tmpfs, a local /scratch) fails here instead of splitting the
   checkpoints between nodes.

A login node that cannot be reached is no finding: nothing can be checked, and the command
ends with its connection error (exit 3).
"""

from __future__ import annotations

import json
import posixpath
import secrets
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.backends.slurm.commands import SLURM, Slurm, parse_node_states, usable
from orchestrator.backends.software import (
    PACKAGES,
    Software,
    Where,
    gloo_finding,
    software_findings,
)
from orchestrator.contract import ISOLATED, KERAS_JAX
from orchestrator.errors import ConnectError, HostError
from orchestrator.hostside.bundle import bundle
from orchestrator.model.findings import Finding, PreflightReport, Status
from orchestrator.model.reading import mapping, text, texts
from orchestrator.model.slurm import SlurmSpec
from orchestrator.model.workers import checkpoint_dir, job_dir

if TYPE_CHECKING:
    from orchestrator.machines.pool import Machines
    from orchestrator.model.inventory import Inventory, WorkerSlot

# Run by every task of the preflight step: versions, then the shared-directory answers.
# Run isolated (python -I) like every host program, with hostside/workerpath.py carried in front
# of it (bundle): what the worker will find is searched as data, never imported from.
NODE_PROBE = """
import importlib.metadata as md, json, os, socket, sys
import workerpath
path = workerpath.worker_path(os.getcwd())
def version(name):
    return next((d.version for d in md.distributions(name=name, path=path)), None)
packages = {name: version(name) for name in PACKAGES}
node = socket.gethostname()
seen = {}
for directory, token in DIRECTORIES.items():
    marker = os.path.join(directory, ".orchestrate-shared-check")
    try:
        with open(marker, encoding="utf-8") as handle:
            seen[directory] = handle.read().strip() == token
        with open(os.path.join(directory, ".orchestrate-seen-" + node), "w") as handle:
            handle.write(token)
    except OSError as exc:
        seen[directory] = str(exc)
try:  # as gloo resolves it (keras: jax): the first address of the node's own name
    found = socket.getaddrinfo(node, None, 0, socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(entry[4][0] for entry in found))
except OSError:
    addresses = []
print(json.dumps({"node": node, "python": sys.version.split()[0],
                  "packages": packages, "seen": seen, "addresses": addresses}))
"""


def slurm_preflight(
    inventory: Inventory, slurm: Slurm, files: Machines, timeout: float,
    login: WorkerSlot | None = None,
) -> PreflightReport:  # fmt: skip
    """`login`: the login node when it is not this machine (slurm.login)."""
    spec = inventory.source_settings
    assert isinstance(spec, SlurmSpec)
    viewer = login.name if login else "this machine"
    findings = [_partition(slurm, spec.partition, spec.nodes, login)]
    if findings[0].status is Status.FAIL:
        return PreflightReport(tuple(findings))
    where = login or inventory.hosts[0]
    home = files.workdirs([where]).raise_if_failed("reading the workdir")[where.name]
    directory = job_dir(inventory.job, home)
    directories = {directory: secrets.token_hex(8)}
    directories.setdefault(checkpoint_dir(inventory.job, directory), secrets.token_hex(8))
    runner = slurm.runner
    runner.make_dirs(list(directories))
    # The tasks start where the workers will: the inventory's directory when the nodes see this
    # machine's files, else the job directory (a laptop's directories are not on the cluster).
    chdir = inventory.base_dir if login is None else directory
    for path, token in directories.items():
        runner.run(["sh", "-c", 'printf %s "$1" > "$2"', "sh", token,
                    posixpath.join(path, ".orchestrate-shared-check")])  # fmt: skip
    source = node_probe(directories)
    argv = ["srun", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}", "--ntasks-per-node=1",
            f"--chdir={chdir}", "--job-name=orchestrate-check",
            *([f"--partition={spec.partition}"] if spec.partition else []),
            *([f"--account={spec.account}"] if spec.account else []),
            spec.python, *ISOLATED, "-c", source]  # fmt: skip
    try:
        result = slurm.run(argv, timeout=max(120.0, timeout))
    except HostError as error:
        return PreflightReport((*findings, Finding(SLURM, "nodes", Status.FAIL, error.message,
                                "are the nodes busy? 'squeue' shows the queue")))  # fmt: skip
    answers = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if not result.ok or len(answers) < spec.nodes:
        findings.append(Finding(SLURM, "python", Status.FAIL,
                                f"'{spec.python}' did not run on the nodes: {result.tail(3)}",
                                "set slurm.python to an interpreter every node has"))  # fmt: skip
        return PreflightReport(tuple(findings))
    found = {str(a["node"]): node_software(a) for a in answers}
    findings += software_findings(inventory.job, found, Where("slurm.python", "node"))
    if inventory.job.keras == KERAS_JAX and spec.nodes > 1:
        findings += [gloo_finding(str(a["node"]), str(a["node"]), texts(a.get("addresses")),
                                  "its address in slurm.conf's NodeAddr")
                     for a in answers]  # fmt: skip
    readback = {path: _seen_by(runner.run, path) for path in directories}
    findings += _shared(answers, directories, readback, viewer)
    return PreflightReport(tuple(findings))


def _partition(
    slurm: Slurm, partition: str | None, nodes: int, login: WorkerSlot | None
) -> Finding:
    argv = ["sinfo", "-h", "-N", "-o", "%N %t", *(["-p", partition] if partition else [])]
    try:
        result = slurm.run(argv, timeout=30)
    except ConnectError:
        raise
    except HostError as error:
        where = f"on {login.name}" if login else "here"
        return Finding(SLURM, "partition", Status.FAIL, error.message,
                       f"is Slurm's client installed {where} ('sinfo')?")  # fmt: skip
    states = parse_node_states(result.stdout) if result.ok else {}
    name = partition or "the default partition"
    if not states:
        listed = slurm.run(["sinfo", "-h", "-o", "%P"], timeout=30).stdout.split()
        return Finding(SLURM, "partition", Status.FAIL,
                       f"{name} does not exist or has no nodes ({result.tail(1) or 'no nodes'})",
                       f"set slurm.partition to one of: {', '.join(listed) or 'none'}")  # fmt: skip
    good = sorted(node for node, state in states.items() if usable(state))
    if len(good) < nodes:
        bad = ", ".join(f"{n} {s}" for n, s in sorted(states.items()) if not usable(s))
        return Finding(SLURM, "partition", Status.FAIL,
                       f"{name} has {len(good)} usable node(s), the job needs {nodes} ({bad})",
                       "lower slurm.nodes or choose another partition")  # fmt: skip
    return Finding(SLURM, "partition", Status.OK,
                   f"{name}: {len(good)} usable node(s) for {nodes} worker(s)")  # fmt: skip


def node_probe(directories: Mapping[str, str]) -> str:
    """The node probe's source as srun runs it: `directories` maps each to its token."""
    probe = NODE_PROBE.replace("PACKAGES", repr(PACKAGES))
    return bundle(probe.replace("DIRECTORIES", repr(dict(directories))), "node probe")


def node_software(answer: Mapping[str, Any]) -> Software:
    """The node probe's answer, read leniently: a value of the wrong type is not installed."""
    versions = mapping(answer.get("packages"))
    return Software(str(answer.get("python") or ""),
                    {name: text(versions.get(name)) for name in PACKAGES})  # fmt: skip


def _seen_by(run: Callable[..., object], path: str) -> set[str]:
    """The nodes whose answer file this machine sees in `path`."""
    result = run(["ls", "-a", path], timeout=20)
    names = str(getattr(result, "stdout", "")).split()
    prefix = ".orchestrate-seen-"
    return {name.removeprefix(prefix) for name in names if name.startswith(prefix)}


def _shared(answers: list[dict[str, object]], directories: dict[str, str],
            readback: dict[str, set[str]], viewer: str) -> list[Finding]:  # fmt: skip
    findings = []
    for path in directories:
        apart = []
        for answer in answers:
            node, seen = str(answer["node"]), answer.get("seen", {})
            saw = seen.get(path) if isinstance(seen, dict) else None
            if saw is not True:
                apart.append(
                    f"{node} does not see {viewer}'s files there"
                    + (f" ({saw})" if isinstance(saw, str) else "")
                )
            elif node not in readback[path]:
                apart.append(f"{viewer} does not see {node}'s files there")
        if apart:
            findings.append(Finding(SLURM, "shared filesystem", Status.FAIL,
                                    f"{path} is not one filesystem for all: {'; '.join(apart)}",
                                    "put slurm.workdir (and job.checkpoint_dir) on the "
                                    "cluster's shared filesystem"))  # fmt: skip
        else:
            findings.append(
                Finding(
                    SLURM,
                    "shared filesystem",
                    Status.OK,
                    f"{path}: every node and {viewer} see the same files",
                )
            )
    return findings

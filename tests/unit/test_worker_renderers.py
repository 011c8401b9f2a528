"""Every launcher and export starts a worker alike (issue 42).

For each job of ROWS (the inventories of golden/inventories/), each renderer gives each role of
the job the same command, the same environment (names and values; job.secret_env as references
to their names, never a value) and asks for the same number of GPUs:
- hosts: the host agent's launch request (`up`; WorkerSpec.launch_request of plan_workers);
- sbatch: the batch script's plan (`export --format sbatch`; what `up` submits on Slurm);
- tfjob: each replica type's container (`export --format tfjob`);
- trainjob: the `node` container of the TrainingRuntime (`export --format trainjob`).
The exports run as the CLI runs them (test_export_golden.export: in-process, re-rooted).

What differs by design is where the worker runs, and only that is taken out first:
- PLACEMENT_ENV: a run directory's variables (hosts and Slurm have one, a pod has none), the
  variables a launcher itself reads (the TFJob's exit wrapper, the TrainJob's pod launcher),
  and CUDA_VISIBLE_DEVICES (a host's own GPU indices; the count is compared instead);
- the checkpoint directory's path (each place mounts it elsewhere): ORCHESTRATE_CHECKPOINT_DIR
  must be set, and --checkpoint-dir must be that same path;
- in the command: the interpreter (the host's python, the image's), orchestrate's boot of a
  script (contract.booted: its stacks go to a run directory, which a pod lacks), the script's
  directory, the model export's directory, and --visible-gpus (a host's GPU indices).

A cell of `refused` must exit 2 (ExportRefused): a TrainJob runs workers only (Slurm runs every
role since issue 45: its ps and evaluator rows compare sbatch too).

Run against the code before issue 42's worker definition, it failed on five cells: steps and
legacy (the TFJob had no ORCHESTRATE_TARGET_STEPS, no TF_USE_LEGACY_KERAS), visible-gpus (the
batch script asked Slurm for no GPU and dropped --gpu-memory-growth), and ps and evaluator
(the batch script ran every role as a worker instead of refusing them).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from orchestrator.backends.registry import load_inventory
from orchestrator.contract import (
    CHECKPOINT_DIR_ENV,
    JAX_PLACE_ENV,
    SCRIPT_BOOT,
    TF_CONFIG_ENV,
)
from orchestrator.engine.workers.plan import plan_workers
from orchestrator.errors import ExportRefused
from orchestrator.machines import kinds
from orchestrator.model.inventory import WorkerSlot
from tests.unit import test_export_golden as golden

PLACEMENT_ENV = frozenset({
    "ORCHESTRATE_RUN_ID", "ORCHESTRATE_WORKER", "ORCHESTRATE_RUN_DIR",
    "ORCHESTRATE_PROGRESS_FILE",  # hosts and Slurm: the run directory
    "ORCHESTRATE_PERMANENT_EXIT_CODES",  # the TFJob's exit wrapper
    "ORCHESTRATE_TF_WORKERS", "ORCHESTRATE_JOBSET_NAME",  # the TrainJob's pod launcher
    "ORCHESTRATE_CLUSTER",  # which cluster that launcher writes (keras: jax: the JAX one)
    "CUDA_VISIBLE_DEVICES",  # a host's own GPU indices
})  # fmt: skip
# keras: jax: each process's id (its place in the cluster) is its own, like TF_CONFIG's task,
# and the cluster's addresses are where it runs: the hosts' (test_a_jax_job_gives_each_host_its_
# process checks them), or the nodes Slurm picks, which the batch script's launcher writes
# (test_slurm_plan.py checks it, test_slurm.py on a real cluster).
PROCESS_ENV = frozenset(JAX_PLACE_ENV)
REPLICA_ROLES = {"Chief": "chief", "PS": "ps", "Worker": "worker", "Evaluator": "evaluator"}
SECRETS = {"WANDB_API_KEY": "never-rendered"}


@dataclass(frozen=True)
class Worker:
    """One role's worker as a renderer starts it, with its placement taken out."""

    command: tuple[str, ...]
    env: dict[str, str]
    gpus: int | None


def secret(name: str) -> str:
    return f"<secret {name}>"


def command(argv: list[str], env: dict[str, str]) -> tuple[str, ...]:
    args = list(argv[1:])  # the interpreter
    if args[:2] == ["-c", SCRIPT_BOOT]:
        del args[:2]  # orchestrate's boot of a script
    if args and args[0] != "-m":
        args[0] = posixpath.basename(args[0])  # the script, wherever it is kept
    out: list[str] = []
    values = iter(args)
    for arg in values:
        if arg == "--visible-gpus":
            next(values)
            continue
        out.append(arg)
        if arg == "--checkpoint-dir":
            path = next(values)
            out.append("{checkpoints}" if path == env.get(CHECKPOINT_DIR_ENV) else path)
        elif arg == "--export-dir":
            next(values)
            out.append("{export}")
    return tuple(out)


def worker(argv: list[str], env: dict[str, str], secrets: list[str], gpus: int | None) -> Worker:
    assert CHECKPOINT_DIR_ENV in env, f"no {CHECKPOINT_DIR_ENV} in {sorted(env)}"
    kept = {k: v for k, v in env.items() if k not in PLACEMENT_ENV | PROCESS_ENV}
    kept[CHECKPOINT_DIR_ENV] = "{checkpoints}"
    kept.update({name: secret(name) for name in secrets})
    return Worker(command(argv, env), kept, gpus)


def by_role(workers: Iterator[tuple[str, Worker]]) -> dict[str, Worker]:
    """Each role's worker: all of a role differ only in their placement."""
    found: dict[str, Worker] = {}
    for role, one in workers:
        assert found.setdefault(role, one) == one, f"two {role}s differ: {found[role]}, {one}"
    return found


def host_gpus(argv: list[str], env: dict[str, str]) -> int | None:
    """How many GPUs a host's worker is given: its CUDA_VISIBLE_DEVICES or --visible-gpus."""
    indices = env.get("CUDA_VISIBLE_DEVICES")
    if indices is None and "--visible-gpus" in argv:
        indices = argv[argv.index("--visible-gpus") + 1]
    return len(indices.split(",")) if indices else None


def hosts(row: golden.Row) -> dict[str, Worker]:
    inventory = golden.rooted(load_inventory(golden.INVENTORIES / f"{row.job}.yaml"))
    secrets = {k: v for k, v in SECRETS.items() if k in inventory.job.secret_env}
    specs = plan_workers(inventory, "r", {h.name: "/w" for h in inventory.hosts}, 0, secrets,
                         reads_in_place=_reads_in_place)  # fmt: skip
    requests = ((spec.host.role, spec.launch_request()) for spec in specs)
    return by_role(
        (role, worker(r["argv"], r["env"], list(r["secret_env"]), host_gpus(r["argv"], r["env"])))
        for role, r in requests
    )


def _reads_in_place(host: WorkerSlot) -> bool:
    return kinds.kind_of(host).shares_files_with_controller


def exported(row: golden.Row, fmt: str) -> str:
    output, raised = golden.export(row, fmt)
    if raised is not None:
        raise raised
    return output


def sbatch(row: golden.Row) -> dict[str, Worker]:
    script = exported(row, "sbatch")
    body = script.split("<<'ORCHESTRATE_PLAN_END'\n", 1)[1].split("\nORCHESTRATE_PLAN_END", 1)[0]
    plan = json.loads(body)
    option = next((line for line in script.splitlines()
                   if line.startswith("#SBATCH --gpus-per-node=")), None)  # fmt: skip
    gpus = int(option.split("=", 1)[1]) if option else None
    # Each task's role is the plan's (a worker where the job has none): the launcher's
    # TF_CONFIG type (hostside/slurm_launcher.py).
    return by_role((t.get("role", "worker"), worker(t["argv"], t["env"], plan["secret_env"], gpus))
                   for t in plan["tasks"])  # fmt: skip


def container_worker(container: dict[str, Any]) -> Worker:
    env: dict[str, str] = {}
    secrets = []
    for entry in container["env"]:
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert ref["key"] == entry["name"], entry
            secrets.append(entry["name"])
        else:
            env[entry["name"]] = entry.get("value", "<from the pod>")
    gpus = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    return worker(container["args"], env, secrets, gpus)


def tfjob(row: golden.Row) -> dict[str, Worker]:
    replicas = yaml.safe_load(exported(row, "tfjob"))["spec"]["tfReplicaSpecs"]
    containers = ((kind, spec["template"]["spec"]["containers"][0])
                  for kind, spec in replicas.items())  # fmt: skip
    return by_role((REPLICA_ROLES[kind], container_worker(c)) for kind, c in containers)


def trainjob(row: golden.Row) -> dict[str, Worker]:
    runtime = next(yaml.safe_load_all(exported(row, "trainjob")))
    job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    return {"worker": container_worker(job["template"]["spec"]["containers"][0])}


RENDERERS: dict[str, Callable[[golden.Row], dict[str, Worker]]] = {
    "hosts": hosts, "sbatch": sbatch, "tfjob": tfjob, "trainjob": trainjob,
}  # fmt: skip


@dataclass(frozen=True)
class Row:
    job: str  # golden/inventories/{job}.yaml
    covers: str
    refused: tuple[str, ...] = ()
    # Renderers that do not start this job at all: a slurm: inventory's `up` is the batch script.
    not_for: tuple[str, ...] = ()
    kubernetes: tuple[str, ...] = field(default=golden.IMAGE)

    def golden(self) -> golden.Row:
        known = {row.job: row for row in golden.ROWS}
        return known.get(self.job, golden.Row(self.job, self.kubernetes))


ROWS = (
    Row("task", "a task job, env and secret_env"),
    Row("script", "a script job with args, env and secret_env"),
    Row("steps", "a script job with steps:"),
    Row("legacy", "keras: legacy"),
    Row("gpus", "Slurm GPUs (gpus_per_node)", not_for=("hosts",)),
    Row("visible-gpus", "hosts' visible_gpus and gpu_memory_growth"),
    Row("ps", "chief, ps, worker and evaluator roles", refused=("trainjob",)),
    Row("evaluator", "workers and an evaluator", refused=("trainjob",)),
    # A TFJob's operator writes TF_CONFIG, not the JAX cluster.
    Row("jax", "keras: jax (a Keras 3 script on JAX)", refused=("tfjob",)),
)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.job)
def test_every_renderer_starts_the_same_workers(row: Row) -> None:
    rendered = {name: render(row.golden()) for name, render in RENDERERS.items()
                if name not in row.refused + row.not_for}  # fmt: skip
    reference_name = next(iter(rendered))
    reference = rendered[reference_name]
    for name, workers in rendered.items():
        assert workers.keys() == reference.keys(), f"{row.job}: {name} has other roles"
        for role, one in workers.items():
            expected = reference[role]
            assert one.env == expected.env, (
                f"{row.job} ({row.covers}), {role}: {name}'s environment differs from "
                f"{reference_name}'s: {_differences(one.env, expected.env)}"
            )
            assert one.command == expected.command, (
                f"{row.job}, {role}: {name} runs {one.command}, {reference_name} {expected.command}"
            )
            assert one.gpus == expected.gpus, (
                f"{row.job}, {role}: {name} asks for {one.gpus} GPUs, {reference_name} "
                f"for {expected.gpus}"
            )


def _differences(got: dict[str, str], expected: dict[str, str]) -> dict[str, object]:
    keys = sorted(set(got) | set(expected))
    return {k: (got.get(k), expected.get(k)) for k in keys if got.get(k) != expected.get(k)}


@pytest.mark.parametrize(
    "cell", [(row, fmt) for row in ROWS for fmt in row.refused],
    ids=lambda cell: f"{cell[0].job}-{cell[1]}",
)  # fmt: skip
def test_a_renderer_that_cannot_start_a_role_refuses_the_job(cell: tuple[Row, str]) -> None:
    row, fmt = cell
    with pytest.raises(ExportRefused) as refused:
        RENDERERS[fmt](row.golden())
    assert refused.value.exit_code == 2


def test_a_jax_job_gives_each_host_its_process() -> None:
    """keras: jax: every worker gets the JAX cluster in task order (the chief first, the
    coordinator), its own process id, Keras on JAX and gloo's CPU collectives, and no
    TF_CONFIG (the launch request's tf_config is empty: the minder then sets none)."""
    inventory = load_inventory(golden.INVENTORIES / "jax.yaml")
    specs = plan_workers(inventory, "r", {h.name: "/w" for h in inventory.hosts}, 0, {},
                         reads_in_place=_reads_in_place)  # fmt: skip
    addresses = "10.0.0.1:2222,10.0.0.2:2223,10.0.0.3:2224"
    for index, spec in enumerate(specs):
        request = spec.launch_request()
        assert request["tf_config"] == {}
        env = request["env"]
        assert TF_CONFIG_ENV not in env
        assert {k: v for k, v in env.items() if "KERAS" in k or k.startswith("JAX_")} == {
            "KERAS_BACKEND": "jax",
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": addresses,
            "KERAS_DISTRIBUTION_NUM_PROCESSES": "3",
            "KERAS_DISTRIBUTION_PROCESS_ID": str(index),
            "JAX_COORDINATOR_ADDRESS": "10.0.0.1:2222",
            "JAX_NUM_PROCESSES": "3",
            "JAX_PROCESS_ID": str(index),
            "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        }
        assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"  # the job's own env stays

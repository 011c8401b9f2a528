"""The sbatch export: the self-contained batch script of slurm/script.py, planned for a job that
nothing supervises (each submission names its run after its Slurm job id)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from orchestrator.backends.base import Planner
from orchestrator.backends.slurm.script import batch_script
from orchestrator.config.sources.slurm import slurm_workers
from orchestrator.hostside.slurm_launcher import JOB_ID_PLACEHOLDER, SUBMIT_DIR_PLACEHOLDER
from orchestrator.machines import kinds
from orchestrator.model.inventory import ROLE_WORKER, Inventory, WorkerSlot
from orchestrator.model.slurm import SlurmSpec


def sbatch_script(inventory: Inventory, plan: Planner) -> str:
    """`export --format sbatch`: the batch script `up` submits, to submit by hand (for a hosts:
    inventory, one node per host, each task with its host's role). `plan` is the engine's
    plan_workers."""
    placed = inventory.source_settings if isinstance(inventory.source_settings, SlurmSpec) else None
    roles = tuple(host.role for host in inventory.hosts)  # the chief first, the evaluator last
    spec = placed or SlurmSpec(
        nodes=len(inventory.hosts), port=inventory.hosts[0].port,
        gpus_per_node=inventory.gpus_per_worker,
        roles=roles if set(roles) != {ROLE_WORKER} else ())  # fmt: skip
    # Submitted by hand on the cluster (a login node's `sbatch FILE`, or `ssh LOGIN sbatch <
    # FILE`): the tasks start where it was submitted and find the files there, login: or not.
    spec = replace(spec, login=None)
    if placed is None or placed.login is not None:  # tasks, from the nodes
        inventory = as_tasks(inventory, spec)
    # Each submission names its run after its job id; the tasks start where it was submitted.
    workdirs = {host.name: spec.workdir for host in inventory.hosts}
    specs = [replace(s, launch=replace(s.launch, cwd=SUBMIT_DIR_PLACEHOLDER))
             for s in plan(inventory, f"slurm-{JOB_ID_PLACEHOLDER}", workdirs,
                           reads_in_place=_from_the_nodes)]  # fmt: skip
    return batch_script(spec, inventory.job, specs)


def as_tasks(inventory: Inventory, spec: SlurmSpec) -> Inventory:
    """The inventory with its hosts as the batch script's tasks: task i keeps host i's GPU
    settings (memory growth and limit, logical GPUs) but not its GPU indices: Slurm hands each
    task the GPUs it asked for (`--gpus-per-node`), numbered from 0."""
    tasks = [host for _, _, host in slurm_workers(spec, Path(inventory.base_dir))]
    if not isinstance(inventory.source_settings, SlurmSpec):  # the hosts of hosts: or ansible:
        tasks = [replace(task, gpu_memory_growth=host.gpu_memory_growth,
                         gpu_memory_limit_mb=host.gpu_memory_limit_mb,
                         logical_gpus=host.logical_gpus)
                 for task, host in zip(tasks, inventory.hosts, strict=True)]  # fmt: skip
    return replace(inventory, hosts=tuple(tasks))


def _from_the_nodes(host: WorkerSlot) -> bool:
    """The tasks read their files where the script was submitted (a task's host is local)."""
    return kinds.kind_of(host).shares_files_with_controller

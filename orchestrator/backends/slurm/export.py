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
from orchestrator.model.inventory import Host, Inventory
from orchestrator.model.slurm import SlurmSpec


def sbatch_script(inventory: Inventory, plan: Planner) -> str:
    """`export --format sbatch`: the batch script `up` submits, to submit by hand (for a hosts:
    inventory, one node per host). `plan` is the engine's plan_workers."""
    spec = inventory.slurm or SlurmSpec(nodes=len(inventory.hosts), port=inventory.hosts[0].port)
    # Submitted by hand on the cluster (a login node's `sbatch FILE`, or `ssh LOGIN sbatch <
    # FILE`): the tasks start where it was submitted and find the files there, login: or not.
    spec = replace(spec, login=None)
    if inventory.slurm is None or inventory.slurm.login is not None:  # tasks, from the nodes
        workers = slurm_workers(spec, Path(inventory.base_dir))
        inventory = replace(inventory, hosts=tuple(host for _, _, host in workers))
    # Each submission names its run after its job id; the tasks start where it was submitted.
    workdirs = {host.name: spec.workdir for host in inventory.hosts}
    specs = [replace(s, launch=replace(s.launch, cwd=SUBMIT_DIR_PLACEHOLDER))
             for s in plan(inventory, f"slurm-{JOB_ID_PLACEHOLDER}", workdirs,
                           reads_in_place=_from_the_nodes)]  # fmt: skip
    return batch_script(spec, inventory.job, specs)


def _from_the_nodes(host: Host) -> bool:
    """The tasks read their files where the script was submitted (a task's host is local)."""
    return kinds.kind_of(host).shares_files_with_controller

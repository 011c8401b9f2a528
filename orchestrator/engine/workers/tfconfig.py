"""TF_CONFIG for each host: the same cluster spec everywhere, each its own task. Pure.

The inventory's hosts, in inventory order, as contract.py's tf_config takes them (each host's
endpoint and role): one function builds TF_CONFIG for the engine, the Slurm launcher and the pod
launcher.
"""

from __future__ import annotations

from typing import Any

from orchestrator import contract
from orchestrator.model.inventory import Inventory, WorkerSlot


def cluster_spec(inventory: Inventory) -> dict[str, list[str]]:
    hosts = inventory.hosts
    return contract.cluster_spec([host.endpoint for host in hosts], [host.role for host in hosts])


def task_of(hosts: tuple[WorkerSlot, ...], index: int) -> dict[str, Any]:
    """The task of the host at `index`: its role and its index among the hosts of that role."""
    return contract.task_of([host.role for host in hosts], index)


def tf_config(inventory: Inventory, index: int) -> dict[str, Any]:
    """TF_CONFIG of the host at `index` in inventory order."""
    hosts = inventory.hosts
    if not 0 <= index < len(hosts):
        raise IndexError(f"worker index {index} out of range 0..{len(hosts) - 1}")
    endpoints = [host.endpoint for host in hosts]
    return contract.tf_config(endpoints, [host.role for host in hosts], index)

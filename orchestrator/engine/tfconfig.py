"""TF_CONFIG for each host: the same cluster spec everywhere, each its own task. Pure.

As TensorFlow specifies it: the cluster lists the training tasks by type (`chief`, `worker`,
`ps`), in inventory order within a type; a task is its type and its index within that type.
Under MultiWorkerMirroredStrategy every training host is a worker (worker 0 is the chief). The
evaluator is in no cluster list: its task is {"type": "evaluator", "index": 0}.
"""

from __future__ import annotations

from typing import Any

from orchestrator.model.inventory import ROLE_EVALUATOR, Host, Inventory

# TensorFlow's order of a cluster spec's task types (as its tutorials write them).
_CLUSTER_ORDER = ("chief", "worker", "ps")


def cluster_spec(inventory: Inventory) -> dict[str, list[str]]:
    spec: dict[str, list[str]] = {}
    for role in _CLUSTER_ORDER:
        endpoints = [host.endpoint for host in inventory.hosts if host.role == role]
        if endpoints:
            spec[role] = endpoints
    return spec


def task_of(hosts: tuple[Host, ...], index: int) -> dict[str, Any]:
    """The task of the host at `index`: its role and its index among the hosts of that role."""
    role = hosts[index].role
    return {"type": role, "index": sum(1 for host in hosts[:index] if host.role == role)}


def tf_config(inventory: Inventory, index: int) -> dict[str, Any]:
    """TF_CONFIG of the host at `index` in inventory order."""
    if not 0 <= index < len(inventory.hosts):
        raise IndexError(f"worker index {index} out of range 0..{len(inventory.hosts) - 1}")
    task = task_of(inventory.hosts, index)
    if task["type"] == ROLE_EVALUATOR:
        task = {"type": ROLE_EVALUATOR, "index": 0}
    return {"cluster": cluster_spec(inventory), "task": task}

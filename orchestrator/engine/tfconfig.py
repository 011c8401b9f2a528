"""TF_CONFIG for each worker: the same cluster list everywhere, a different task index. Pure."""

from __future__ import annotations

from typing import Any

from orchestrator.model.inventory import Inventory


def cluster_spec(inventory: Inventory) -> dict[str, list[str]]:
    return {"worker": [host.endpoint for host in inventory.hosts]}


def tf_config(inventory: Inventory, index: int) -> dict[str, Any]:
    """TF_CONFIG of the worker at `index` in inventory order; worker 0 is the chief."""
    if not 0 <= index < len(inventory.hosts):
        raise IndexError(f"worker index {index} out of range 0..{len(inventory.hosts) - 1}")
    return {"cluster": cluster_spec(inventory), "task": {"type": "worker", "index": index}}

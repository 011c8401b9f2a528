"""plan_workers as the hosts backend calls it: whether a worker sees this machine's files is
the hosts backend's answer (HostBackend.reads_in_place), as in lifecycle.launch_attempt."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.backends.hosts.backend import HostBackend
from orchestrator.engine.workers import plan
from orchestrator.model.inventory import Inventory
from orchestrator.model.workers import WorkerSpec


def plan_workers(
    inventory: Inventory,
    run_id: str,
    workdirs: dict[str, str],
    attempt: int = 0,
    secrets: Mapping[str, str] | None = None,
) -> list[WorkerSpec]:
    return plan.plan_workers(inventory, run_id, workdirs, attempt, secrets,
                             reads_in_place=HostBackend().reads_in_place)  # fmt: skip

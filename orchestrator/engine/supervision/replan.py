"""Re-planning the cluster before a restart: hosts that cannot be reached are replaced by
spares, in order; with no spare left they are dropped while at least min_hosts remain (TF_CONFIG
is rebuilt for the survivors); hosts dropped earlier that answer again come back. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.model.inventory import ROLE_EVALUATOR, Inventory, WorkerSlot


@dataclass(frozen=True)
class ClusterPlan:
    hosts: tuple[WorkerSlot, ...]
    spares: tuple[WorkerSlot, ...]
    dropped: tuple[WorkerSlot, ...]
    changes: tuple[str, ...] = ()  # what changed, for the log
    problem: str | None = None  # why no cluster can be formed
    hint: str | None = None


def plan_cluster(
    inventory: Inventory, dropped: list[WorkerSlot], dead: Mapping[str, str]
) -> ClusterPlan:
    """The workers of the next attempt: spares first, then min_hosts. Pure.

    The global batch size is kept when hosts are dropped (each survivor takes a larger share),
    so the optimizer sees the same batch per step and the learning-rate schedule still fits."""
    spares = [s for s in inventory.spares if s.name not in dead]
    hosts: list[WorkerSlot] = []
    changes: list[str] = []
    still_dropped: list[WorkerSlot] = []
    for host in inventory.hosts:
        if host.name not in dead:
            hosts.append(host)
        elif spares and host.role != ROLE_EVALUATOR:  # a spare is a worker
            spare = spares.pop(0)
            changes.append(f"{host.name} does not answer; spare {spare.name} takes its place")
            hosts.append(spare)
        else:
            still_dropped.append(host)
    for host in dropped:
        if host.name in dead:
            still_dropped.append(host)
        else:
            changes.append(f"{host.name} answers again and rejoins the cluster")
            hosts.append(host)
    # The evaluator is beside the training: it is no worker to count or to split the batch over.
    training = [h for h in hosts if h.role != ROLE_EVALUATOR]
    wanted = inventory.min_hosts or len(training) + len(
        [h for h in still_dropped if h.role != ROLE_EVALUATOR]
    )
    lost = [h for h in still_dropped if h not in dropped]
    if len(training) < wanted:
        gone = ", ".join(f"{h.name} ({dead[h.name]})" for h in still_dropped)
        return ClusterPlan(
            (), (), (),
            tuple(changes),
            f"host {gone} does not answer and no spare host is left to replace it"
            + (f"; {len(training)} host(s) answer, min_hosts is {wanted}" if inventory.min_hosts
               else ""),
            "list replacement hosts under 'spares:' or allow fewer with 'min_hosts:', or bring "
            "the host back and run 'orchestrate up' again to resume from the checkpoint",
        )  # fmt: skip
    job = inventory.job
    if job.task is not None and job.batch_size % len(training):
        return ClusterPlan(
            (), (), (), tuple(changes),
            f"{len(training)} host(s) answer, but the global batch size {job.batch_size} does "
            f"not split evenly over {len(training)} workers",
            "choose a batch_size divisible by every worker count down to min_hosts",
        )  # fmt: skip
    for host in lost:
        changes.append(
            f"{host.name} does not answer and no spare is left; going on with {len(training)} "
            f"worker(s) (min_hosts {wanted})"
        )
    return ClusterPlan(tuple(hosts), tuple(spares), tuple(still_dropped), tuple(changes))

"""Leases of the hosts backend: one request per machine and lease directory to the host's lease
program (hostside/leases.py), whose keeper holds what it took until the run ends.

The requests and the inventory with what was leased are pure (`lease_request`, `resolved`);
`take`, `release` and `listing` fan them out through Machines.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from orchestrator.errors import HostError, HostErrors, LeaseClash
from orchestrator.fanout import fan_out
from orchestrator.hostside import leasepolicy as policy
from orchestrator.hostside import protocol
from orchestrator.model.leases import (
    KEEPER_IDLE_SECONDS,
    Acquired,
    Assignment,
    Clash,
    Ignored,
    Lease,
    LeaseListing,
    Ticket,
    by_run,
    clash_message,
    queued_by_run,
)

if TYPE_CHECKING:
    from orchestrator.machines.hostclient import HostAgent
    from orchestrator.model.inventory import Inventory, WorkerSlot

GroupKey = tuple[tuple[str, ...], str]  # (machine key, lease_dir)
CLASH_HINT = (
    "'orchestrate jobs INVENTORY' lists every job holding leases on these hosts; wait for it to "
    "end, give this job other GPUs or a wider port_range, or let GPUs be shared (share_gpus: "
    "true in both jobs)"
)


def lease_groups(
    hosts: Sequence[WorkerSlot], machine_key: Callable[[WorkerSlot], tuple[str, ...]]
) -> dict[GroupKey, list[WorkerSlot]]:
    """The leasing hosts by machine and lease directory: one request (and keeper) each."""
    groups: dict[GroupKey, list[WorkerSlot]] = {}
    for host in hosts:
        if host.leases:
            groups.setdefault((machine_key(host), host.lease_dir), []).append(host)
    return groups


def worker_request(host: WorkerSlot) -> dict[str, Any]:
    """What the lease program needs for one worker: its port (fixed, or a range and the port
    the run has now), its GPU count, pool and the ones it has now."""
    auto = host.port_range is not None
    return {
        policy.NAME_KEY: host.name,
        policy.PORT_KEY: None if auto else host.port,
        policy.RANGE_KEY: list(host.port_range) if host.port_range else None,
        policy.KEEP_PORT_KEY: host.port if auto and host.port else None,
        policy.GPUS_KEY: host.gpus,
        policy.POOL_KEY: list(host.visible_gpus) if host.visible_gpus is not None else None,
        policy.KEEP_GPUS_KEY: list(host.leased_gpus) if host.leased_gpus else None,
        policy.SHARE_KEY: host.share_gpus,
    }


def lease_request(
    hosts: Sequence[WorkerSlot], run_id: str, job: str, *, controller: str, dry_run: bool = False,
    idle: float = KEEPER_IDLE_SECONDS,
) -> dict[str, Any]:  # fmt: skip
    return {
        policy.LEASE_DIR_KEY: hosts[0].lease_dir,
        policy.RUN_ID_KEY: run_id,
        policy.JOB_KEY: job,
        policy.CONTROLLER_KEY: controller,
        policy.IDLE_KEY: idle,
        policy.DRY_RUN_KEY: dry_run,
        policy.WORKERS_KEY: [worker_request(host) for host in hosts],
    }


def resolved(inventory: Inventory, assigned: dict[str, Assignment]) -> Inventory:
    """The inventory with each leased worker's port and GPUs."""

    def leased(host: WorkerSlot) -> WorkerSlot:
        got = assigned.get(host.name)
        if got is None:
            return host
        return replace(host, port=got.port, leased_gpus=got.gpus)

    return replace(inventory, hosts=tuple(leased(h) for h in inventory.hosts))


def take(
    inventory: Inventory,
    run_id: str,
    agent: Callable[[WorkerSlot], HostAgent],
    machine_key: Callable[[WorkerSlot], tuple[str, ...]],
    *,
    dry_run: bool = False,
    ticket: Mapping[str, Any] | None = None,
) -> tuple[Inventory, tuple[Ignored, ...]]:
    """`ticket` (queued runs): the run's arrival and its controller's identity, written beside
    the leases of every host it needs until `withdraw`."""
    groups = lease_groups(inventory.hosts, machine_key)
    if not groups:
        return inventory, ()
    controller = socket.gethostname()

    def acquire(key: GroupKey) -> Acquired:
        hosts = groups[key]
        request = lease_request(hosts, run_id, inventory.job.name, controller=controller,
                                dry_run=dry_run)  # fmt: skip
        if ticket is not None:
            request[policy.TICKET_KEY] = dict(ticket)
        answer = agent(hosts[0]).leases(protocol.ACQUIRE, **request)
        try:
            return Acquired.parse(hosts[0].name, answer)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise HostError(hosts[0].name, f"the lease program's answer has the wrong shape: "
                            f"{exc!r}") from exc  # fmt: skip

    answers = fan_out(groups, acquire)
    clashes: list[Clash] = [c for a in answers.ok.values() for c in a.clashes]
    ignored = tuple(i for a in answers.ok.values() for i in a.ignored)
    taken = [k for k, a in answers.ok.items() if not a.clashes]
    if (clashes or answers.failed) and not dry_run:
        # All or nothing: what this attempt took on the other machines goes back at once.
        fan_out(taken, lambda key: _release(agent(groups[key][0]), key[1], run_id))
    if clashes:
        raise LeaseClash(clash_message(clashes), clashes, hint=CLASH_HINT)
    if answers.failed:
        raise HostErrors(list(answers.failed.values()), "leasing ports and GPUs")
    assigned = {name: got for a in answers.ok.values() for name, got in a.assigned.items()}
    return resolved(inventory, assigned), ignored


def _release(agent: HostAgent, lease_dir: str, run_id: str) -> None:
    agent.leases(protocol.RELEASE, timeout=30, lease_dir=lease_dir, run_id=run_id)


def release(
    inventory: Inventory,
    run_id: str,
    agent: Callable[[WorkerSlot], HostAgent],
    machine_key: Callable[[WorkerSlot], tuple[str, ...]],
) -> None:
    """Stop the run's keepers on every leasing host (and spare): a host not answering keeps
    its leases until its keeper sees no worker of the run for a while."""
    groups = lease_groups([*inventory.hosts, *inventory.spares], machine_key)
    fan_out(groups, lambda key: _release(agent(groups[key][0]), key[1], run_id))


def withdraw(
    inventory: Inventory,
    run_id: str,
    agent: Callable[[WorkerSlot], HostAgent],
    machine_key: Callable[[WorkerSlot], tuple[str, ...]],
) -> None:
    """Remove the run's tickets on every leasing host (it started, or gave up waiting)."""
    groups = lease_groups(inventory.hosts, machine_key)
    fan_out(
        groups,
        lambda key: agent(groups[key][0]).leases(
            protocol.WITHDRAW, timeout=30, lease_dir=key[1], run_id=run_id
        ),
    )


def listing(
    inventory: Inventory,
    agent: Callable[[WorkerSlot], HostAgent],
    machine_key: Callable[[WorkerSlot], tuple[str, ...]],
) -> LeaseListing:
    """Every lease in the lease directories of the inventory's hosts, by run."""
    groups: dict[GroupKey, list[WorkerSlot]] = {}
    for host in (*inventory.hosts, *inventory.spares):
        groups.setdefault((machine_key(host), host.lease_dir), []).append(host)

    def ask(key: GroupKey) -> dict[str, Any]:
        return agent(groups[key][0]).leases(protocol.LIST, timeout=30, lease_dir=key[1])

    answers = fan_out(groups, ask)
    leases: list[Lease] = []
    ignored: list[Ignored] = []
    tickets: list[Ticket] = []
    for key, answer in answers.ok.items():
        name = "+".join(h.name for h in groups[key])  # the inventory's names of the machine
        found_tickets = answer.get(policy.TICKETS_KEY)
        tickets += [Ticket.parse(name, t) for t in found_tickets if isinstance(t, dict)] \
            if isinstance(found_tickets, list) else []  # fmt: skip
        holders = answer.get(policy.HOLDERS_KEY)
        # A record of another network namespace sharing the lease directory is listed by its
        # own host (and blocks here): listed here too, it would read as this host's lease.
        leases += [Lease.parse(name, h) for h in holders
                   if isinstance(h, dict) and h.get(policy.HERE_KEY) is not False] \
            if isinstance(holders, list) else []  # fmt: skip
        found = answer.get(policy.IGNORED_KEY)
        ignored += [Ignored.parse(name, i) for i in found] if isinstance(found, list) else []
    failed = {
        "+".join(h.name for h in groups[key]): error.message
        for key, error in answers.failed.items()
    }
    return LeaseListing(by_run(leases), tuple(ignored), failed, queued_by_run(tickets))

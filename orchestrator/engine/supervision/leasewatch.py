"""The supervisor's look at its run's leases: a run never goes on unleased without saying so.

A lease lives while its keeper on the host does (hostside/leases.py: the kernel's claims, never
a file). A keeper can die under the run (an OOM kill, someone's `kill`): its port and GPUs are
free for any other job while the run's workers still use them. Every LEASE_CHECK_SECONDS (at
least every poll) the supervisor lists the leases of the run's hosts; what the run uses and no
keeper of the run holds (`missing`, pure) is taken again, pinned to the very port and GPUs the
workers use (a different GPU would be no lease of theirs); what cannot be taken back (another
job took it meanwhile) is said loudly: the supervisor's output, `status` (the record's
`leases_lost`) and the `lease_lost` notification. A host that does not answer the listing is
no evidence either way: it is looked at again at the next check.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from orchestrator.backends.capabilities import Leases
from orchestrator.errors import OrchestrateError
from orchestrator.model.inventory import Inventory, WorkerSlot
from orchestrator.model.leases import LeaseListing

LEASE_CHECK_SECONDS = 2.0  # at most this long between two looks (the poll's, if longer)


@dataclass(frozen=True)
class Missing:
    """What one worker uses that no keeper of its run holds now."""

    host: str
    ports: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()

    def describe(self) -> str:
        parts = [f"port {p}" for p in self.ports]
        if self.gpus:
            parts.append("GPU" + ("s " if len(self.gpus) > 1 else " ") +
                         ",".join(str(g) for g in self.gpus))  # fmt: skip
        return f"{self.host}: {' and '.join(parts)}"


def missing(
    inventory: Inventory, run_id: str, active: Collection[str], listing: LeaseListing
) -> tuple[Missing, ...]:
    """Each active leasing worker's port and GPUs (`active`: the names of the workers that
    have not ended; an ended one's keeper lets go by itself) that the listing shows no keeper
    of run `run_id` holding; workers on hosts that did not answer are left out (unknown, not
    lost). Pure."""
    held: dict[str, tuple[set[int], set[int]]] = {}
    for job in listing.jobs:
        if job.holder.run_id != run_id:
            continue
        for names, lease in job.hosts.items():
            for name in names.split("+"):
                ports, gpus = held.setdefault(name, (set(), set()))
                ports.update(lease.ports)
                gpus.update(lease.gpus)
    unknown = {name for names in listing.failed for name in names.split("+")}
    found = []
    for host in inventory.hosts:
        if not host.leases or host.name in unknown or host.name not in active:
            continue
        ports, gpus = held.get(host.name, (set(), set()))
        lost_ports = (host.port,) if host.port and host.port not in ports else ()
        lost_gpus = tuple(g for g in host.leased_gpus or () if g not in gpus)
        if lost_ports or lost_gpus:
            found.append(Missing(host.name, lost_ports, lost_gpus))
    return tuple(found)


def pinned(host: WorkerSlot) -> WorkerSlot:
    """The worker as a lease request that takes exactly what it uses: its port fixed, its
    GPUs the only pool."""
    gpus = host.leased_gpus
    return replace(host, port_range=None, visible_gpus=gpus if gpus else host.visible_gpus)


@dataclass(frozen=True)
class LeaseCheck:
    """One look's verdict: what was taken back, and what is lost (a line each)."""

    reclaimed: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()


class LeaseWatch:
    """Look at the run's leases at most every `every` seconds; take back what a dead keeper
    let go; say what could not be."""

    def __init__(self, leasing: Leases | None, every: float = LEASE_CHECK_SECONDS) -> None:
        self.leasing = leasing  # Backend.leasing: None where nothing is leased
        self.every = every
        self._looked: float | None = None

    def check(
        self, inventory: Inventory, run_id: str, active: Collection[str], now: float
    ) -> LeaseCheck | None:
        """None when it is not time to look, or the backend leases nothing. `active`: the
        workers that have not ended."""
        leasing = self.leasing
        if leasing is None or not any(h.leases and h.name in active for h in inventory.hosts):
            return None
        if self._looked is not None and now - self._looked < self.every:
            return None
        self._looked = now
        try:
            listing = leasing.leases(inventory)
        except OrchestrateError:
            return None  # no host answered: the next look
        gone = missing(inventory, run_id, active, listing)
        if not gone:
            return LeaseCheck()
        return reclaim(gone, inventory, run_id, leasing.take_leases)


def reclaim(
    gone: Sequence[Missing],
    inventory: Inventory,
    run_id: str,
    take: Callable[..., object],
) -> LeaseCheck:
    """Take each lost worker's port and GPUs again, one worker at a time (a clash on one
    host gives back nothing of another's): a line for each taken back, and for each lost."""
    by_name = {h.name: h for h in inventory.hosts}
    reclaimed, lost = [], []
    for entry in gone:
        alone = replace(inventory, hosts=(pinned(by_name[entry.host]),), spares=())
        try:
            take(alone, run_id)
            reclaimed.append(f"{entry.describe()}: its keeper had died; leased again")
        except OrchestrateError as error:
            first = error.message.splitlines()[0] if error.message else type(error).__name__
            lost.append(f"{entry.describe()}: its keeper died and it could not be leased "
                        f"again ({first}); another job may use it now")  # fmt: skip
    return LeaseCheck(tuple(reclaimed), tuple(lost))

"""The Backend for workers on hosts the controller reaches through a Runner (local, SSH, ...).

Every operation on a machine is Machines' (one runner and one agent session per machine); this
class adds what makes those machines a cluster's hosts: the preflight rounds (preflight.py),
sync and setup before a start (prep.py), and starting an attempt's workers. It plays every
optional role: standbys (Machines'), leases (leases.py) and firewall rules (firewall.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.backends.base import Backend, Firewall, Leased, Leases, Standbys
from orchestrator.backends.hosts import leases
from orchestrator.backends.hosts.checks import (
    ExposureProbe,
    partition_findings,
    run_preflight,
)
from orchestrator.backends.hosts.firewall import (
    controller_address,
    controller_towards,
    host_rules,
    reaches,
)
from orchestrator.backends.hosts.prep import prepare_hosts
from orchestrator.fanout import GroupResult, fan_out
from orchestrator.machines.kinds import kind_of
from orchestrator.machines.pool import Machines, expand_uploads, machine_key
from orchestrator.model.findings import CHECK, Finding, PreflightOptions, PreflightReport
from orchestrator.model.workers import Started

if TYPE_CHECKING:
    from orchestrator.machines.hostclient import HostAgent
    from orchestrator.model.firewall import HostRules
    from orchestrator.model.inventory import Inventory, LoginDetails, WorkerSlot
    from orchestrator.model.leases import LeaseListing
    from orchestrator.model.workers import WorkerSpec


class HostBackend(Machines, Backend, Standbys, Leases, Firewall):
    one_for_all = True  # hosts of any connection kind: one runner per machine

    @property
    def keeper(self) -> Standbys:
        return self

    @property
    def leasing(self) -> Leases:
        return self

    @property
    def firewall(self) -> Firewall:
        return self

    def firewall_rules(
        self, inventory: Inventory, fmt: str, controller: str | None
    ) -> list[HostRules]:
        return host_rules(inventory, fmt, controller or controller_towards(inventory))

    def preflight(self, inventory: Inventory, options: PreflightOptions = CHECK) -> PreflightReport:
        probe = ExposureProbe(controller_address, reaches) if options.exposure else None
        return run_preflight(inventory, self, probe_timeout=options.probe_timeout,
                             min_free_bytes=options.min_free_bytes, exposure=probe,
                             perf=options.perf)  # fmt: skip

    def prepare(
        self,
        inventory: Inventory,
        workdirs: Mapping[str, str],
        say: Callable[[str], None],
        *,
        force_setup: bool = False,
        spares: bool = False,
    ) -> None:
        prepare_hosts(inventory, self, dict(workdirs), say, force_setup=force_setup, spares=spares)

    def start(self, specs: Sequence[WorkerSpec]) -> GroupResult[str, Started]:
        by_name = {spec.name: spec for spec in specs}

        def launch(name: str) -> Started:
            spec = by_name[name]
            # Into a private run directory from the first byte on; the directories, the files
            # (SFTP, no shell) and the launch all go over the machine's one open session.
            files = expand_uploads(spec.uploads)
            if files:
                self._make_dirs(spec.host, files, list(spec.private_dirs))
                self._put(spec.host, files)
            return Started(pid=self.agent(spec.host).launch(spec.launch_request()))

        return fan_out(by_name, launch)

    def take_leases(
        self, inventory: Inventory, run_id: str, *, dry_run: bool = False,
        ticket: Mapping[str, Any] | None = None,
    ) -> Leased:  # fmt: skip
        resolved, ignored = leases.take(inventory, run_id, self._lease_agent, machine_key,
                                        ticket=ticket,
                                        dry_run=dry_run)  # fmt: skip
        return Leased(resolved, ignored)

    def release_leases(self, inventory: Inventory, run_id: str) -> None:
        leases.release(inventory, run_id, self._lease_agent, machine_key)

    def withdraw_tickets(self, inventory: Inventory, run_id: str) -> None:
        leases.withdraw(inventory, run_id, self._lease_agent, machine_key)

    def leases(self, inventory: Inventory) -> LeaseListing:
        return leases.listing(inventory, self._lease_agent, machine_key)

    def _lease_agent(self, host: WorkerSlot) -> HostAgent:
        return self.agent(host)

    def reads_in_place(self, host: WorkerSlot) -> bool:
        return kind_of(host).shares_files_with_controller

    def login_details(self, host: WorkerSlot) -> LoginDetails | None:
        return kind_of(host).login_details(host)

    def network_problems(self, inventory: Inventory) -> list[Finding]:
        return partition_findings(inventory, self.preflight)

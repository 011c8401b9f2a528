"""The Backend for workers on hosts the controller reaches through a Runner (local, SSH, ...).

Every operation on a machine is Machines' (one runner and one agent session per machine); this
class adds what makes those machines a cluster's hosts: starting an attempt's workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.backend import Backend
from orchestrator.fanout import GroupResult, fan_out
from orchestrator.machines.pool import Machines, expand_uploads

if TYPE_CHECKING:
    from orchestrator.model.inventory import Inventory
    from orchestrator.model.workers import WorkerSpec


class HostBackend(Machines, Backend):
    keeps_standbys = True

    def start(self, specs: Sequence[WorkerSpec]) -> GroupResult[str, int]:
        by_name = {spec.name: spec for spec in specs}

        def launch(name: str) -> int:
            spec = by_name[name]
            # Into a private run directory from the first byte on; the directories, the files
            # (SFTP, no shell) and the launch all go over the machine's one open session.
            files = expand_uploads(spec.uploads)
            if files:
                self._make_dirs(spec.host, files, list(spec.private_dirs))
                self._put(spec.host, files)
            return self.agent(spec.host).launch(spec.launch_request())

        return fan_out(by_name, launch)

    def serves(self, inventory: Inventory) -> bool:
        return inventory.slurm is None  # hosts of any connection kind: one runner per machine

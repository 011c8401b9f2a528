"""The `slurm:` block of an inventory, resolved. Pure data (no imports of the rest)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_PORT = 20000


@dataclass(frozen=True)
class LoginNode:
    """`slurm.login:`: the machine `orchestrate` drives Slurm through over SSH, when it does
    not run on one itself. `settings` are the SSH kind's (kinds/ssh.SshSettings): the same keys
    as a host's, checked the same way; `python` runs the controller's small host programs there
    (not the workers: they use slurm.python on the nodes)."""

    address: str
    python: str = "python3"
    settings: Any = None

    @property
    def name(self) -> str:
        """What errors and messages call it: the name the inventory gave."""
        alias = getattr(self.settings, "ssh_host", None)
        return f"login node {alias or self.address}"


@dataclass(frozen=True)
class SlurmSpec:
    """What `up` asks of Slurm: N nodes, one task per node, and the workers' TensorFlow port."""

    nodes: int
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    port: int = DEFAULT_PORT
    python: str = "python3"
    workdir: str = "~/orchestrate"  # on the cluster's shared filesystem
    gpus_per_node: int | None = None
    sbatch_args: tuple[str, ...] = ()  # passed verbatim as #SBATCH lines, never through a shell
    login: LoginNode | None = None  # None: Slurm's commands and the files are on this machine

    def worker_name(self, index: int) -> str:
        return f"task{index}"

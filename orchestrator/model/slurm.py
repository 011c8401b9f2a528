"""The `slurm:` block of an inventory, resolved. Pure data (no imports of the rest)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_PORT = 20000

# The batch script (backends/slurm/script.py) carries the plan and the launcher as quoted
# here-documents, each ended by a line that is its marker: no value in it may hold one. What
# each embeds, for the message that refuses such a value.
PLAN_END = "ORCHESTRATE_PLAN_END"
LAUNCHER_END = "ORCHESTRATE_LAUNCHER_END"
END_MARKERS = {
    PLAN_END: "plan (each task's directory, command and environment)",
    LAUNCHER_END: "launcher",
}


def end_marker_in(value: str) -> str | None:
    """The batch script's end marker that `value` holds, if any."""
    return next((marker for marker in END_MARKERS if marker in value), None)


def end_marker_problem(marker: str) -> str:
    """Why a value holding `marker` is refused, as "KEY <this>" reads."""
    return (f"contains {marker}, the line that ends the batch script's embedded "
            f"{END_MARKERS[marker]}: a value must not hold it")  # fmt: skip


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
    """What `up` asks of Slurm: N nodes, one task per node, and the workers' TensorFlow port.
    `roles`: each task's TF_CONFIG type in task order (`slurm.roles`: the chief first, then the
    workers, the ps, the evaluator); empty: every task is a worker."""

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
    roles: tuple[str, ...] = ()

    @property
    def gpus_per_worker(self) -> int | None:  # model.inventory.SourceSettings
        return self.gpus_per_node

    def worker_name(self, index: int) -> str:
        return f"task{index}"

    def role_of(self, index: int) -> str:
        """The TF_CONFIG type of the task at `index` (a worker unless `roles` says otherwise)."""
        return self.roles[index] if self.roles else "worker"

"""The `slurm:` block of an inventory, resolved. Pure data (no imports of the rest)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORT = 20000


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

    def worker_name(self, index: int) -> str:
        return f"task{index}"

"""The seam for where workers live: what every command needs of a cluster, and nothing more.

In the spirit of torch elastic's agent (start workers, monitor them, stop them): `up`, `status`,
`tail`, `down`, `check`, `supervise` and `tensorboard` are written once against `Backend`, which
is a few narrow capabilities (capabilities.py): `Lifecycle`, `Logs`, `Files`, `Preparation` and
`Reach`, which every backend has, and the optional `Standbys`, `Leases`, `Scheduler` and `Firewall`,
which a backend declares as data: the capability, or None. Hosts reached through a Runner (local
processes, SSH) are one implementation (hosts/), whose connection kinds live in
orchestrator/machines/kinds/; Slurm is another (slurm/), which needs no host agent forking
processes. registry.py names them and picks one for an inventory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Protocol

from orchestrator.backends.capabilities import (
    Files,
    Firewall,
    Leased,
    Leases,
    Lifecycle,
    Logs,
    Preparation,
    Reach,
    Scheduler,
    Standbys,
)

if TYPE_CHECKING:
    from orchestrator.model.inventory import Inventory, WorkerSlot
    from orchestrator.model.workers import WorkerSpec

__all__ = [
    "Backend", "ExportWriter", "Files", "Firewall", "Leased", "Leases", "Lifecycle", "Logs",
    "Planner", "Preparation", "Reach", "Scheduler", "Standbys",
]  # fmt: skip


class Planner(Protocol):
    """The engine's plan_workers, passed to a backend that plans workers of its own (an
    export): a backend never imports the engine."""

    def __call__(
        self,
        inventory: Inventory,
        run_id: str,
        workdirs: dict[str, str],
        *,
        reads_in_place: Callable[[WorkerSlot], bool],
    ) -> list[WorkerSpec]: ...


ExportWriter = Callable[["Inventory", Planner], str]


class Backend(Lifecycle, Logs, Files, Preparation, Reach):
    """Every capability a place where workers live has, and what it declares about the others."""

    # A preempted attempt (every worker saved and exited 75) is resubmitted by the supervisor
    # instead of ending the run: a scheduler preempts and gives the nodes back later.
    resubmits_preempted: ClassVar[bool] = False
    # Every worker's checkpoint directory is one shared filesystem that outlives any node: the
    # supervisor keeps no copy of the chief's checkpoints on this machine.
    shared_checkpoints: ClassVar[bool] = False
    # One backend serves every inventory of its host sources (its machines are named by the
    # hosts themselves, not by a scheduler's settings): a command that meets an earlier run's
    # inventory of the same backend asks this one (its open sessions) instead of a second.
    one_for_all: ClassVar[bool] = False
    # A worker that restarts by itself (a ParameterServerStrategy worker, the evaluator) is
    # started again in place by its own launcher, which records each restart in its run
    # directory (WorkerProbe.restarts); the supervisor only records them, never starts one.
    restarts_in_place: ClassVar[bool] = False

    @classmethod
    def for_inventory(cls, inventory: Inventory | None) -> Backend:
        """The backend for an inventory (or a run record's) of one of its host sources (the
        registry's table); None: an inventory not known yet (`local`, a record's earlier run)."""
        return cls()

    # --- the optional capabilities, as data: the capability, or None where it has none ---------
    @property
    def keeper(self) -> Standbys | None:
        """Standbys for warm restarts (hosts); None: every attempt starts cold (Slurm)."""
        return None

    @property
    def leasing(self) -> Leases | None:
        """Leases of shared hosts' ports and GPUs; None: nothing to lease (a scheduler)."""
        return None

    @property
    def scheduler(self) -> Scheduler | None:
        """A scheduler's own view of a run, for status; None: no scheduler places the workers."""
        return None

    @property
    def firewall(self) -> Firewall | None:
        """Rules for the hosts' firewalls; None: no host here is the user's to open."""
        return None

    def close(self) -> None:
        """Release every connection."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

"""The seam for where workers live: what every command needs of a cluster, and nothing more.

In the spirit of torch elastic's agent (start workers, monitor them, stop them): `up`, `status`,
`tail`, `down`, `check`, `supervise` and `tensorboard` are written once against `Backend`.
Hosts reached through a Runner (local processes, SSH) are one implementation (hosts/), whose
connection kinds live in orchestrator/machines/kinds/; Slurm is another (slurm/), which needs no
host agent forking processes. registry.py picks one for an inventory. Answers are typed
(model/answers.py) and per worker, in GroupResults.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from orchestrator.fanout import GroupResult
from orchestrator.model.answers import (
    BY_DOWN,
    CheckpointListing,
    FileListing,
    StackAnswer,
    StandbyInfo,
    StopAnswer,
    WorkerProbe,
)
from orchestrator.model.leases import Ignored
from orchestrator.model.preflight import CHECK, PreflightOptions
from orchestrator.model.workers import Started

if TYPE_CHECKING:
    from orchestrator.model.inventory import Host, Inventory, LoginDetails
    from orchestrator.model.leases import LeaseListing
    from orchestrator.model.preflight import Finding, PreflightReport
    from orchestrator.model.records import RunRecord, SchedulerState, WorkerRecord
    from orchestrator.model.workers import WorkerSpec


class Planner(Protocol):
    """The engine's plan_workers, passed to a backend that plans workers of its own (an
    export): a backend never imports the engine."""

    def __call__(
        self,
        inventory: Inventory,
        run_id: str,
        workdirs: dict[str, str],
        *,
        reads_in_place: Callable[[Host], bool],
    ) -> list[WorkerSpec]: ...


ExportWriter = Callable[["Inventory", Planner], str]


@dataclass(frozen=True)
class Leased:
    """What taking a run's leases gave: the inventory with each leasing host's port and GPUs
    as leased, and the files of the lease directories that were ignored (hostile, broken)."""

    inventory: Inventory
    ignored: tuple[Ignored, ...] = ()


WAIT_CHECK = 0.1  # seconds between looks at a wait's `woken` (the stop flag)


class Backend(ABC):
    # A preempted attempt (every worker saved and exited 75) is resubmitted by the supervisor
    # instead of ending the run: a scheduler preempts and gives the nodes back later.
    resubmits_preempted: ClassVar[bool] = False
    # Every worker's checkpoint directory is one shared filesystem that outlives any node: the
    # supervisor keeps no copy of the chief's checkpoints on this machine.
    shared_checkpoints: ClassVar[bool] = False
    # start_standbys keeps processes that can become workers (warm restarts, and `up`'s first
    # attempt): without it nothing asks for them, not even the workdirs they would need.
    keeps_standbys: ClassVar[bool] = False

    # --- an attempt's workers ------------------------------------------------------------------
    @abstractmethod
    def workdirs(self, hosts: Sequence[Host]) -> GroupResult[str, str]:
        """Each host's workdir as an absolute path on that host, by host name."""

    @abstractmethod
    def start(self, specs: Sequence[WorkerSpec]) -> GroupResult[str, Started]:
        """Upload what each worker needs and start it detached; by worker name, its pid on its
        host or the scheduler's job it is a task of."""

    @abstractmethod
    def probe(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, WorkerProbe]:
        """What each worker's run directory says now, by worker name."""

    def wait_for_change(self, workers: Sequence[WorkerRecord], timeout: float,
                        woken: Callable[[], bool] = lambda: False) -> bool:  # fmt: skip
        """Wait at most `timeout` seconds between two probes; True as soon as one of `workers`
        that ran ended (then the caller probes at once). `woken` is looked at every
        WAIT_CHECK seconds while it waits: True ends the wait at once (`down`'s stop flag). A
        backend whose machines can tell it (hosts: the agent session's `watch`) answers the
        moment a worker exits; by default this is the poll's sleep, and a failure is seen at
        the next probe (Slurm, hosts that cannot push)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0 and not woken():
            time.sleep(min(left, WAIT_CHECK))
        return False

    @abstractmethod
    def stop(
        self, workers: Sequence[WorkerRecord], grace: float, by: str = BY_DOWN
    ) -> GroupResult[str, StopAnswer]:
        """SIGTERM each worker's processes, SIGKILL what is left after `grace` seconds; `by`
        (who asked, "after beta ended the attempt") is what their status says stopped them."""

    @abstractmethod
    def log_lines(self, worker: WorkerRecord, lines: int) -> list[str]:
        """The last lines of the worker's log (none if it has no log yet)."""

    @abstractmethod
    def follow_log(self, worker: WorkerRecord, lines: int) -> Iterator[str]:
        """The last lines, then new ones as they come, until the caller stops iterating."""

    @abstractmethod
    def stacks(
        self, workers: Sequence[WorkerRecord], wait: float, native: bool = False
    ) -> GroupResult[str, StackAnswer]:
        """Every thread's Python stack of each running worker, as its faulthandler wrote them
        on SIGUSR2, all within `wait` seconds; by worker name. A worker that cannot answer
        (not running, no handler, silent) is a StackAnswer with its `error`. `native`: py-spy's
        dump too, where it is installed and allowed (else why not)."""

    # --- standbys: warm restarts (a backend without them starts every attempt cold) ------------
    def start_standbys(self, specs: Sequence[WorkerSpec], linger: float) -> GroupResult[str, str]:
        """Keep, per worker slot, a process that has imported TensorFlow and can become that
        slot's worker in the next attempt (WorkerSpec.standby_request); by worker name, what
        happened. None started here: every attempt starts cold."""
        return GroupResult()

    def discard_standbys(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, str]:
        """Stop these workers' slots' standbys for good (the run ended)."""
        return GroupResult()

    def linger_standbys(
        self, workers: Sequence[WorkerRecord], seconds: float
    ) -> GroupResult[str, str]:
        """The run ended: its slots' standbys stay `seconds` (job.linger), for the next run of
        the job on the same hosts to take; by worker name, "lingering" or "none"."""
        return GroupResult()

    def standbys(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, StandbyInfo | None]:
        """The standby alive now for each worker's slot (lingering after its run, or waiting for
        a restart), with its memory; None where there is none."""
        return GroupResult()

    # --- leases: ports and GPUs held against every other job (a scheduler leases itself) -------
    def take_leases(
        self, inventory: Inventory, run_id: str, *, dry_run: bool = False,
        ticket: Mapping[str, Any] | None = None,
    ) -> Leased:  # fmt: skip
        """Lease each leasing host's port (`port: auto`: a free one of its range, the run's own
        one first) and GPUs (`gpus: N`) on its machine for run `run_id`, kept there until the
        run ends; the inventory with what was leased. Raises LeaseClash naming the holders.
        `dry_run`: what would be leased now, nothing held. `ticket` (a queued run: its arrival
        and its controller's identity): the run's place in each host's queue, kept until
        withdraw_tickets; a run takes nothing an earlier ticket waits for (LeaseClash with
        queued entries). None here: nothing to lease."""
        return Leased(inventory)

    def withdraw_tickets(self, inventory: Inventory, run_id: str) -> None:  # noqa: B027
        """Remove the run's queue tickets on every host (it started, or stopped waiting)."""

    def release_leases(self, inventory: Inventory, run_id: str) -> None:  # noqa: B027
        """Let go of the run's leases on every host of `inventory` (the run ended)."""

    def leases(self, inventory: Inventory) -> LeaseListing:
        """Every job of any user holding leases on the inventory's hosts."""
        from orchestrator.model.leases import LeaseListing

        return LeaseListing()

    # --- files on a host -----------------------------------------------------------------------
    @abstractmethod
    def checkpoint(self, host: Host, directory: str) -> CheckpointListing:
        """The latest TensorFlow checkpoint in a host's directory."""

    @abstractmethod
    def adopt_checkpoint(
        self, host: Host, directory: str, name: str, checkpoints: Sequence[str]
    ) -> None:
        """Make `name`, whose files are in `directory` already, that directory's latest, with
        `checkpoints` (oldest first) the earlier ones its state file lists."""

    @abstractmethod
    def list_files(self, host: Host, directory: str) -> FileListing:
        """Every file under a host's directory, with sizes and modification times."""

    @abstractmethod
    def read_text(self, host: Host, path: str) -> str | None:
        """A small text file of the host (a progress history); None when it does not exist."""

    @abstractmethod
    def download(self, host: Host, remote: str, local: str) -> None:
        """Copy one file of the host to this machine."""

    @abstractmethod
    def upload(self, host: Host, files: Sequence[tuple[str, str]]) -> None:
        """Copy (path here, path there) pairs to the host, creating the directories."""

    # --- before a start ------------------------------------------------------------------------
    @abstractmethod
    def preflight(self, inventory: Inventory, options: PreflightOptions = CHECK) -> PreflightReport:
        """Every reason the inventory's cluster would hang, found before anything starts (hosts:
        versions, free space, every port from every host; a scheduler: its own checks)."""

    def prepare(  # noqa: B027 - optional: most backends' machines come prepared
        self,
        inventory: Inventory,
        workdirs: Mapping[str, str],
        say: Callable[[str], None],
        *,
        force_setup: bool = False,
        spares: bool = False,
    ) -> None:
        """Make the machines ready for a start (hosts: `sync:`, then `setup:`; `spares`: the
        spares too). Nothing to do for a backend whose machines come prepared."""

    def network_problems(self, inventory: Inventory) -> list[Finding]:
        """Between two attempts: the blocking findings that say the workers' machines cannot
        reach each other now (a partition), so that a restart waits instead of failing the same
        way. None where no partition can be checked (one machine; a scheduler's unknown nodes)."""
        return []

    # --- reaching hosts ------------------------------------------------------------------------
    @abstractmethod
    def unreachable(self, hosts: Sequence[Host]) -> dict[str, str]:
        """The hosts that cannot be reached at all (not merely failing a command), with why."""

    @abstractmethod
    def reads_in_place(self, host: Host) -> bool:
        """Whether the worker on `host` sees this machine's files: nothing is uploaded, it
        starts in the inventory's directory, and its checkpoints, event files and export are
        read where they are (never mirrored or pulled)."""

    def login_details(self, host: Host) -> LoginDetails | None:
        """How the host's machine is reached, as resolved (`orchestrate hosts`); None when
        nothing logs in to it."""
        return None

    # --- what a scheduler adds (hosts have none of it) -----------------------------------------
    def scheduler_state(self, record: RunRecord) -> SchedulerState | None:
        """The scheduler's view of the run's current attempt, for status."""
        return None

    def serves(self, inventory: Inventory) -> bool:
        """Whether this backend can also answer for `inventory`'s workers (an earlier run's),
        so that its open connections serve both instead of a second backend's."""
        return False

    def close(self) -> None:  # noqa: B027 - optional for backends that hold nothing
        """Release every connection."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

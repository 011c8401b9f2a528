"""The capabilities of a backend, each a narrow interface: what the engine and the CLI ask of
the place where workers live, grouped by what a caller needs. (A *role* is only ever a worker's
TF_CONFIG type: chief, worker, ps, evaluator.)

Every backend has the five capabilities `Backend` is made of (base.py): `Lifecycle` (an attempt's
workers), `Logs`, `Files` (on a worker's host), `Preparation` (before a start) and `Reach` (which
hosts answer, which read this machine's files). The others are optional and a backend declares them
as data, `Backend.keeper`, `.leasing`, `.scheduler`, `.firewall`: the capability, or None where it
has none. A caller asks the data ("does this backend keep standbys?"), never a stub that raises or
answers nothing. A caller that needs one capability takes that one (files: `Files`), so a fake for
it implements a few methods, not thirty.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.fanout import GroupResult
from orchestrator.model.answers import (
    BY_DOWN,
    CheckpointListing,
    FileListing,
    SetAside,
    StackAnswer,
    StandbyInfo,
    StopAnswer,
    WorkerProbe,
)
from orchestrator.model.findings import CHECK, PreflightOptions
from orchestrator.model.leases import Ignored
from orchestrator.model.workers import Started

if TYPE_CHECKING:
    from orchestrator.model.findings import Finding, PreflightReport
    from orchestrator.model.firewall import HostRules
    from orchestrator.model.inventory import Inventory, LoginDetails, WorkerSlot
    from orchestrator.model.leases import LeaseListing
    from orchestrator.model.records import RunRecord, SchedulerState, WorkerRecord
    from orchestrator.model.workers import WorkerSpec

WAIT_CHECK = 0.1  # seconds between looks at a wait's `woken` (the stop flag)


class Lifecycle(ABC):
    """An attempt's workers: where they work, started, probed, awaited, stopped, asked for
    their stacks. Answers are typed (model/answers.py) and per worker, in GroupResults."""

    @abstractmethod
    def workdirs(self, hosts: Sequence[WorkerSlot]) -> GroupResult[str, str]:
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
    def stacks(
        self, workers: Sequence[WorkerRecord], wait: float, native: bool = False
    ) -> GroupResult[str, StackAnswer]:
        """Every thread's Python stack of each running worker, as its faulthandler wrote them
        on SIGUSR2, all within `wait` seconds; by worker name. A worker that cannot answer
        (not running, no handler, silent) is a StackAnswer with its `error`. `native`: py-spy's
        dump too, where it is installed and allowed (else why not)."""


class Logs(ABC):
    """A worker's log (`tail`, the dashboard, the root cause of a failure)."""

    @abstractmethod
    def log_lines(self, worker: WorkerRecord, lines: int) -> list[str]:
        """The last lines of the worker's log (none if it has no log yet)."""

    @abstractmethod
    def follow_log(self, worker: WorkerRecord, lines: int) -> Iterator[str]:
        """The last lines, then new ones as they come, until the caller stops iterating."""


class Files(ABC):
    """Files on a worker's host: checkpoints, progress histories, event files, exports."""

    @abstractmethod
    def checkpoint(self, host: WorkerSlot, directory: str) -> CheckpointListing:
        """The latest TensorFlow checkpoint in a host's directory."""

    @abstractmethod
    def adopt_checkpoint(
        self, host: WorkerSlot, directory: str, name: str, checkpoints: Sequence[str]
    ) -> None:
        """Make `name`, whose files are in `directory` already, that directory's latest, with
        `checkpoints` (oldest first) the earlier ones its state file lists."""

    @abstractmethod
    def set_aside(self, host: WorkerSlot, directory: str, stamp: str) -> SetAside:
        """Move the contents of a host's directory to a sibling, `DIRECTORY.set-aside-STAMP`,
        leaving it empty (`up --fresh`): nothing is deleted."""

    @abstractmethod
    def list_files(self, host: WorkerSlot, directory: str) -> FileListing:
        """Every file under a host's directory, with sizes and modification times."""

    @abstractmethod
    def read_text(self, host: WorkerSlot, path: str) -> str | None:
        """A small text file of the host (a progress history); None when it does not exist."""

    @abstractmethod
    def download(self, host: WorkerSlot, remote: str, local: str) -> None:
        """Copy one file of the host to this machine."""

    @abstractmethod
    def upload(self, host: WorkerSlot, files: Sequence[tuple[str, str]]) -> None:
        """Copy (path here, path there) pairs to the host, creating the directories."""


class Preparation(ABC):
    """Before a start: the checks (`check`, `up`), the machines made ready, a partition seen."""

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


class Reach(ABC):
    """Which hosts answer, and how each is reached from here."""

    @abstractmethod
    def unreachable(self, hosts: Sequence[WorkerSlot]) -> dict[str, str]:
        """The hosts that cannot be reached at all (not merely failing a command), with why."""

    @abstractmethod
    def reads_in_place(self, host: WorkerSlot) -> bool:
        """Whether the worker on `host` sees this machine's files: nothing is uploaded, it
        starts in the inventory's directory, and its checkpoints, event files and export are
        read where they are (never mirrored or pulled)."""

    def login_details(self, host: WorkerSlot) -> LoginDetails | None:
        """How the host's machine is reached, as resolved (`orchestrate hosts`); None when
        nothing logs in to it."""
        return None


# --- optional capabilities: a backend has them (Backend.keeper, ...) or declares None --------


class Standbys(ABC):
    """Warm restarts: per worker slot, a process that has imported TensorFlow and becomes that
    slot's worker in the next attempt (WorkerSpec.standby_request). A backend without this
    capability starts every attempt cold, and nothing asks for standbys, not even the workdirs."""

    @abstractmethod
    def start_standbys(self, specs: Sequence[WorkerSpec], linger: float) -> GroupResult[str, str]:
        """Keep a standby per worker slot; by worker name, what happened."""

    @abstractmethod
    def discard_standbys(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, str]:
        """Stop these workers' slots' standbys for good (the run ended)."""

    @abstractmethod
    def linger_standbys(
        self, workers: Sequence[WorkerRecord], seconds: float
    ) -> GroupResult[str, str]:
        """The run ended: its slots' standbys stay `seconds` (job.linger), for the next run of
        the job on the same hosts to take; by worker name, "lingering" or "none"."""

    @abstractmethod
    def standbys(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, StandbyInfo | None]:
        """The standby alive now for each worker's slot (lingering after its run, or waiting for
        a restart), with its memory; None where there is none."""


@dataclass(frozen=True)
class Leased:
    """What taking a run's leases gave: the inventory with each leasing host's port and GPUs
    as leased, and the files of the lease directories that were ignored (hostile, broken)."""

    inventory: Inventory
    ignored: tuple[Ignored, ...] = ()


class Leases(ABC):
    """Ports and GPUs of shared machines held against every other job (`port: auto`, `gpus:
    N`, `up --queue`, `orchestrate jobs`). A scheduler leases itself: a backend without this
    capability leases nothing, and its runs start with the inventory as written."""

    @abstractmethod
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
        queued entries)."""

    @abstractmethod
    def withdraw_tickets(self, inventory: Inventory, run_id: str) -> None:
        """Remove the run's queue tickets on every host (it started, or stopped waiting)."""

    @abstractmethod
    def release_leases(self, inventory: Inventory, run_id: str) -> None:
        """Let go of the run's leases on every host of `inventory` (the run ended)."""

    @abstractmethod
    def leases(self, inventory: Inventory) -> LeaseListing:
        """Every job of any user holding leases on the inventory's hosts."""


class Scheduler(ABC):
    """A scheduler that places the workers (Slurm): its own view of a run, for `status`."""

    @abstractmethod
    def scheduler_state(self, record: RunRecord) -> SchedulerState | None:
        """The scheduler's view of the run's current attempt."""


class Firewall(ABC):
    """Firewall rules for the hosts' TensorFlow ports (`orchestrate firewall`): hosts that the
    user administers. A scheduler's nodes are the cluster's administrators' to open."""

    @abstractmethod
    def firewall_rules(
        self, inventory: Inventory, fmt: str, controller: str | None
    ) -> list[HostRules]:
        """Per host, the commands (in `fmt`, one of model.firewall.FORMATS) that open its
        TensorFlow port to the cluster's hosts only, and its login port to `controller`
        (None: this machine's address as the hosts see it)."""

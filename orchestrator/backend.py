"""The seam for where workers live: what every command needs of a cluster, and nothing more.

In the spirit of torch elastic's agent (start workers, monitor them, stop them): `up`, `status`,
`tail`, `down`, `check`, `supervise` and `tensorboard` are written once against `Backend`.
Hosts reached through a Runner (local processes, SSH) are one implementation (hostbackend.py),
whose connection kinds live in orchestrator/kinds/; a scheduler can be another that needs no
host agent forking processes. Answers are typed (answers.py) and per worker, in GroupResults.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from orchestrator.answers import CheckpointListing, FileListing, StopAnswer, WorkerProbe
from orchestrator.fanout import GroupResult
from orchestrator.runner import LineSession

if TYPE_CHECKING:
    from orchestrator.inventory import Host
    from orchestrator.plan import WorkerSpec
    from orchestrator.runstore import WorkerRecord


class Backend(ABC):
    # --- an attempt's workers ------------------------------------------------------------------
    @abstractmethod
    def workdirs(self, hosts: Sequence[Host]) -> GroupResult[str, str]:
        """Each host's workdir as an absolute path on that host, by host name."""

    @abstractmethod
    def start(self, specs: Sequence[WorkerSpec]) -> GroupResult[str, int]:
        """Upload what each worker needs and start it detached; its pid, by worker name."""

    @abstractmethod
    def probe(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, WorkerProbe]:
        """What each worker's run directory says now, by worker name."""

    @abstractmethod
    def stop(self, workers: Sequence[WorkerRecord], grace: float) -> GroupResult[str, StopAnswer]:
        """SIGTERM each worker's processes, SIGKILL what is left after `grace` seconds."""

    @abstractmethod
    def log_lines(self, worker: WorkerRecord, lines: int) -> list[str]:
        """The last lines of the worker's log (none if it has no log yet)."""

    @abstractmethod
    def follow_log(self, worker: WorkerRecord, lines: int) -> Iterator[str]:
        """The last lines, then new ones as they come, until the caller stops iterating."""

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

    # --- reaching hosts ------------------------------------------------------------------------
    @abstractmethod
    def unreachable(self, hosts: Sequence[Host]) -> dict[str, str]:
        """The hosts that cannot be reached at all (not merely failing a command), with why."""

    @abstractmethod
    def preflight_session(self, host: Host) -> LineSession:
        """A hostprobe session on the host (preflight.py's rounds)."""

    def close(self) -> None:  # noqa: B027 - optional for backends that hold nothing
        """Release every connection."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_backend() -> Backend:
    """The backend for the hosts an inventory lists (any connection kind of orchestrator/kinds)."""
    from orchestrator.hostbackend import HostBackend

    return HostBackend()

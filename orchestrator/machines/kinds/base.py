"""A connection kind: how the controller reaches the machine a worker runs on.

Everything that differs between kinds lives in the kind's own module: the host keys it reads from
the inventory, its settings type, its defaults, how its runner is made, which hosts share one
connection, and what the machine shares with the controller. Other modules ask the kind; none of
them compares a connection name to a literal.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.model.inventory import LoginDetails, NoSettings
from orchestrator.values import Checker, Key

if TYPE_CHECKING:
    from orchestrator.machines.runner import Runner
    from orchestrator.model.inventory import WorkerSlot

ReportProblem = Callable[[str, str], None]  # (key, message)


@dataclass(frozen=True)
class SyncTransport:
    """How rsync reaches a machine: its remote shell command line (`-e`) and the destination."""

    shell: list[str]
    target: str


class Kind(ABC):
    name: ClassVar[str]
    # Host keys only this kind reads, with their checkers; their values make `settings_type`.
    keys: ClassVar[Mapping[str, Checker]] = {}
    # The same keys with type, default and meaning, for the manual's key reference
    # (values.checkers(key_entries) gives `keys`); a kind with keys describes every one here.
    key_entries: ClassVar[tuple[Key, ...]] = ()
    settings_type: ClassVar[type[Any]] = NoSettings  # a KindSettings dataclass
    # Keys whose values are paths on this machine, resolved against the inventory's directory.
    controller_paths: ClassVar[tuple[str, ...]] = ()
    default_python: ClassVar[str] = "python3"
    # The worker sees this machine's files: nothing is uploaded, it starts in the inventory's
    # directory, and its checkpoints and event files are read in place (never mirrored).
    shares_files_with_controller: ClassVar[bool] = False
    # The preflight check that stands for reaching the machine ("ssh"), if the kind logs in.
    login_check: ClassVar[str | None] = None

    def prepare(self, values: dict[str, Any], problem: ReportProblem, base: Path) -> None:
        """Fill in this kind's defaults and check what it alone forbids (pure)."""
        values.setdefault("python", self.default_python)

    def settings(self, values: Mapping[str, Any]) -> Any:
        return self.settings_type(**{key: values[key] for key in self.keys if key in values})

    def settings_from_json(self, data: Mapping[str, Any] | None) -> Any:
        # JSON turns tuples into lists; the frozen settings want them back (and hashable).
        known = {f.name for f in fields(self.settings_type)}
        return self.settings_type(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in (data or {}).items()
               if k in known}
        )  # fmt: skip

    @abstractmethod
    def machine_key(self, host: WorkerSlot) -> tuple[str, ...]:
        """Hosts with the same key are one machine and share one connection."""

    @abstractmethod
    def runner(self, host: WorkerSlot) -> Runner:
        """A new connection to the host's machine."""

    def login_port(self, host: WorkerSlot) -> int | None:
        """The port the controller logs in through, for the firewall rules; None if none."""
        return None

    def login_details(self, host: WorkerSlot) -> LoginDetails | None:
        """How the machine is reached, as resolved (user, port, key, jump host), for
        `orchestrate hosts`; None for a kind that does not log in."""
        return None

    def sync_transport(self, host: WorkerSlot) -> SyncTransport | None:
        """How `sync:` mirrors a directory to the machine; None when it cannot (or need not)."""
        return None

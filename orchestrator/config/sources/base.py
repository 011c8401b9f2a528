"""What a host source is: a top-level block of the inventory that lists the workers, as data.

The loader takes the sources it knows as a parameter: the backends' registry
(backends/registry.py) names every source in its one table, beside the backend that runs its
workers, and hands them to the loader (config/ never imports backends/). Each source's module
(hosts.py, ansible.py, slurm.py) defines its `SOURCE`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.config.report import Report
    from orchestrator.model.inventory import Job, SourceSettings, WorkerSlot
    from orchestrator.model.records import SettingsReader
    from orchestrator.values import Key
    from orchestrator.yamlsource import LineMap

Placed = tuple[str, int | None, "WorkerSlot"]  # where in the file ("hosts[1]"), its line, the host
# (the document, `defaults:`, the report, the inventory's directory) -> the workers in
# TF_CONFIG order, and the source's own settings when it places them itself (else None).
SourceParser = Callable[["LineMap", "LineMap", "Report", Path], tuple[list["Placed"], Any]]
# A source's own check of the roles it gives its workers (placed, the job, the document, the
# report), with lines: Slurm's `slurm.roles` counts against the job's strategy.
OwnRoles = Callable[[Sequence["Placed"], "Job", "LineMap", "Report"], None]
# A block of the manual's key reference: (where, what it is, its entries).
Block = tuple[str, str, tuple["Key", ...]]


@dataclass(frozen=True)
class RoleRule:
    """How a source that cannot give its hosts roles refuses them: `strategy` when the job is
    parameter-server, `host` ("{role}: ...") for each host with a role other than worker
    (None: its hosts cannot carry one; the other role checks then still apply)."""

    strategy: str
    host: str | None = None


@dataclass(frozen=True)
class HostSource:
    key: Key  # the top level's entry: its name is the block's key (`hosts`, `slurm`, ...)
    parse: SourceParser
    blocks: tuple[Block, ...] = ()  # its own keys, for the key reference (the manual)
    roles: RoleRule | None = None  # None: hosts take `role:` as under `hosts:`
    check_roles: OwnRoles | None = None  # roles given its own way, checked by it
    # Why `setup:` and `sync:` do not apply (a scheduler's nodes come prepared); None: they do.
    no_setup: str | None = None
    # Checks of `job:` this source adds (what its launcher cannot carry), with lines.
    check_job: Callable[[Job, LineMap, Report], None] | None = None
    # Its settings read back from a run record (SourceSettingsReader's part for this source).
    settings_from_json: Callable[[Mapping[str, Any], SettingsReader], SourceSettings] | None = None

    @property
    def name(self) -> str:
        return self.key.name

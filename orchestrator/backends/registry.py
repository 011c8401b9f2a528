"""The one module that names the backends: a table of every host source an inventory may use
(its top-level block: `hosts:`, `slurm:`, `ansible:`), each with the backend that runs its
workers and the export formats that backend writes. Everything above asks here and then speaks
only to backends.base.Backend and its capabilities.

config/ cannot import backends/, so the table is handed down: the loader takes the sources as a
parameter, and `load_inventory` here is the loader with this table's sources. A backend's class
is imported the first time an inventory asks for it (a `hosts:` command never loads Slurm's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.backends.base import Backend, ExportWriter
from orchestrator.config import loader
from orchestrator.config.sources import ansible, hosts, slurm
from orchestrator.config.sources.base import HostSource
from orchestrator.errors import InventoryError
from orchestrator.machines import kinds

if TYPE_CHECKING:
    from orchestrator.model.inventory import Inventory, SourceSettings
    from orchestrator.model.records import SettingsReader
    from orchestrator.values import Key


@dataclass(frozen=True)
class Entry:
    """One row: a host source, the backend for its inventories, what that backend exports."""

    source: HostSource  # its block's key, parser, key entries and rules (config/sources/)
    backend: Callable[[], type[Backend]]  # the class, imported when first asked for
    formats: Mapping[str, Callable[[], ExportWriter]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.source.name


def _hosts() -> type[Backend]:
    from orchestrator.backends.hosts.backend import HostBackend

    return HostBackend


def _slurm() -> type[Backend]:
    from orchestrator.backends.slurm.backend import SlurmBackend

    return SlurmBackend


def _sbatch() -> ExportWriter:
    from orchestrator.backends.slurm.export import sbatch_script

    return sbatch_script


# The table. The first row serves an inventory made in code (no host source recorded); the
# order is the order of the messages that list the sources.
_TABLE: dict[str, Entry] = {
    entry.name: entry
    for entry in (
        Entry(hosts.SOURCE, _hosts),
        Entry(slurm.SOURCE, _slurm, {"sbatch": _sbatch}),
        Entry(ansible.SOURCE, _hosts),
    )
}


def register(entry: Entry) -> None:
    """Make a host source and its backend known to the inventory and every command."""
    _TABLE[entry.name] = entry


def unregister(name: str) -> None:
    _TABLE.pop(name, None)


def host_sources() -> tuple[HostSource, ...]:
    return tuple(entry.source for entry in _TABLE.values())


def entry_of(inventory: Inventory | None) -> Entry:
    """The row of the inventory's host source (the first row's for one made in code)."""
    name = inventory.host_source if inventory is not None else None
    if name is None:
        return next(iter(_TABLE.values()))
    try:
        return _TABLE[name]
    except KeyError:
        raise InventoryError(
            [], hint=f"no backend serves the host source {name!r}; known: {', '.join(_TABLE)}"
        ) from None


def open_backend(inventory: Inventory | None = None) -> Backend:
    """The backend for the inventory's (or run record's) host source."""
    return entry_of(inventory).backend().for_inventory(inventory)


def serves(backend: Backend, inventory: Inventory) -> bool:
    """Whether `backend` can also answer for `inventory`'s workers (an earlier run's), so that
    its open connections serve both instead of a second backend's."""
    return backend.one_for_all and isinstance(backend, entry_of(inventory).backend())


def load_inventory(path: str | Path) -> Inventory:
    """An inventory file, with the sources of this table (config/loader.py)."""
    return loader.load_inventory(path, host_sources())


def load_inventory_text(text: str, label: str, base_dir: Path, stem: str) -> Inventory:
    """An inventory held in memory (`orchestrate local`'s), read as if it were the file
    `label` in `base_dir`, with the sources of this table."""
    return loader.load_inventory_text(text, label, base_dir, stem, host_sources())


def key_reference() -> tuple[tuple[str, str, tuple[Key, ...]], ...]:
    """Every block of inventory keys, this table's sources included (the manual's reference)."""
    return loader.key_reference(host_sources())


# Export formats a backend writes itself (`orchestrate export --format NAME`), as the table
# has them at start-up (the CLI's choices).
BACKEND_FORMATS: tuple[str, ...] = tuple(f for entry in _TABLE.values() for f in entry.formats)


def export_writer(name: str) -> ExportWriter:
    """The writer of a backend's export format: the inventory and the engine's planner -> text."""
    for entry in _TABLE.values():
        if name in entry.formats:
            return entry.formats[name]()
    known = ", ".join(f for entry in _TABLE.values() for f in entry.formats)
    raise ValueError(f"no backend writes {name!r}; known: {known}")


def host_settings(connection: str, data: Mapping[str, Any]) -> Any:
    """A host's settings read back from a run record, as its connection kind's own type
    (model.records.SettingsReader)."""
    return kinds.get(connection).settings_from_json(data)


def source_settings_of(
    data: Mapping[str, Any], settings: SettingsReader
) -> tuple[str | None, SourceSettings | None]:
    """A recorded inventory's host source, and that source's settings read back as its own type
    (model.records.SourceSettingsReader). Records from before `host_source` kept the settings
    under the block's key."""
    name, raw = data.get("host_source"), data.get("source_settings")
    if name is None:
        older = [e for e in _TABLE.values() if e.source.settings_from_json is not None]
        name = next((e.name for e in older if data.get(e.name) is not None), None)
        raw = data.get(name) if name is not None else None
    entry = _TABLE.get(name) if name is not None else None
    reader = entry.source.settings_from_json if entry is not None else None
    return name, reader(raw, settings) if reader is not None and raw is not None else None


__all__: Sequence[str] = [
    "BACKEND_FORMATS",
    "Entry",
    "entry_of",
    "export_writer",
    "host_settings",
    "host_sources",
    "key_reference",
    "load_inventory",
    "load_inventory_text",
    "open_backend",
    "register",
    "serves",
    "source_settings_of",
    "unregister",
]  # fmt: skip

"""The one module that names the backends: which one serves an inventory, which writes an
export format, how a connection kind's settings are read back. Everything above asks here and
then speaks only to backends.base.Backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.backends.base import Backend, ExportWriter
from orchestrator.machines import kinds

if TYPE_CHECKING:
    from orchestrator.model.inventory import Inventory


def open_backend(inventory: Inventory | None = None) -> Backend:
    """The backend for the inventory's (or run record's) host source: hosts of any connection
    kind of orchestrator/machines/kinds, or the nodes of a Slurm cluster."""
    if inventory is not None and inventory.slurm is not None:
        from orchestrator.backends.slurm.backend import SlurmBackend

        return SlurmBackend(inventory.slurm, inventory.job)
    from orchestrator.backends.hosts.backend import HostBackend

    return HostBackend()


# Export formats a backend writes itself (`orchestrate export --format NAME`).
BACKEND_FORMATS = ("sbatch",)


def export_writer(name: str) -> ExportWriter:
    """The writer of one of BACKEND_FORMATS: the inventory and the engine's planner -> text."""
    if name == "sbatch":
        from orchestrator.backends.slurm.export import sbatch_script

        return sbatch_script
    raise ValueError(f"no backend writes {name!r}; known: {', '.join(BACKEND_FORMATS)}")


def host_settings(connection: str, data: Mapping[str, Any]) -> Any:
    """A host's settings read back from a run record, as its connection kind's own type
    (model.records.SettingsReader)."""
    return kinds.get(connection).settings_from_json(data)

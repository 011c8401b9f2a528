"""Event files for TensorBoard: the chief writes them next to its checkpoints.

A chief that sees this machine's files is read in place. A remote chief's event files are pulled
through the backend into the state directory (only new or grown files) and pulled again every few
seconds, so a plain local TensorBoard shows them without opening any port on the hosts.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from orchestrator.backends.base import Backend
from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import HostError
from orchestrator.model.records import RunRecord, WorkerRecord
from orchestrator.model.workers import tensorboard_dir
from orchestrator.paths import inside


def chief_event_dir(chief: WorkerRecord) -> str:
    return tensorboard_dir(chief.checkpoint_dir)


def events_are_remote(record: RunRecord, backend: Backend) -> bool:
    return not backend.reads_in_place(record.workers[0].host)


def local_event_dir(record: RunRecord, store: RunStore, backend: Backend) -> Path:
    if not events_are_remote(record, backend):
        return Path(chief_event_dir(record.workers[0]))
    return store.event_dir(record.job_name)


def pull_events(record: RunRecord, backend: Backend, target: Path) -> int:
    """Copy the remote chief's new or changed event files into `target`; how many were copied."""
    if not events_are_remote(record, backend):
        return 0
    chief = record.workers[0]
    listing = backend.list_files(chief.host, chief_event_dir(chief))
    copied = 0
    for relative, (size, _mtime) in sorted(listing.files.items()):
        local = inside(target, relative)
        if local is None:  # `..` or an absolute name: never a path outside the target
            why = f"its listing of {listing.root} names {relative!r}, not a path inside it"
            raise HostError(chief.host.name, why + ": nothing more was copied")
        if local.exists() and local.stat().st_size == size:
            continue
        local.parent.mkdir(parents=True, exist_ok=True)
        backend.download(chief.host, posixpath.join(listing.root, relative), str(local))
        copied += 1
    return copied

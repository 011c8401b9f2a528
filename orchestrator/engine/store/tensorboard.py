"""Event files for TensorBoard: the chief writes them next to its checkpoints.

A chief that sees this machine's files is read in place. A remote chief's event files are pulled
through the backend into the state directory (only new or grown files) and pulled again every few
seconds, so a plain local TensorBoard shows them without opening any port on the hosts.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from orchestrator.backends.capabilities import Files, Reach
from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import HostError
from orchestrator.model.records import RunRecord, WorkerRecord
from orchestrator.model.workers import tensorboard_dir
from orchestrator.paths import inside


def chief_event_dir(chief: WorkerRecord) -> str:
    return tensorboard_dir(chief.checkpoint_dir)


def events_are_remote(record: RunRecord, reach: Reach) -> bool:
    return not reach.reads_in_place(record.workers[0].host)


def local_event_dir(record: RunRecord, store: RunStore, reach: Reach) -> Path:
    if not events_are_remote(record, reach):
        return Path(chief_event_dir(record.workers[0]))
    return store.event_dir(record.job_name)


def pull_events(record: RunRecord, reach: Reach, files: Files, target: Path) -> int:
    """Copy the remote chief's new or changed event files into `target`; how many were copied."""
    if not events_are_remote(record, reach):
        return 0
    chief = record.workers[0]
    listing = files.list_files(chief.host, chief_event_dir(chief))
    copied = 0
    for relative, (size, _mtime) in sorted(listing.files.items()):
        local = inside(target, relative)
        if local is None:  # `..` or an absolute name: never a path outside the target
            why = f"its listing of {listing.root} names {relative!r}, not a path inside it"
            raise HostError(chief.host.name, why + ": nothing more was copied")
        if local.exists() and local.stat().st_size == size:
            continue
        local.parent.mkdir(parents=True, exist_ok=True)
        files.download(chief.host, posixpath.join(listing.root, relative), str(local))
        copied += 1
    return copied

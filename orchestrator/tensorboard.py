"""Event files for TensorBoard: the chief writes them next to its checkpoints.

A chief on this machine is read in place. A remote chief's event files are pulled over SSH into
the state directory (only new or grown files) and pulled again every few seconds, so a plain local
TensorBoard shows them without opening any port on the hosts.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from orchestrator.connect import Machines
from orchestrator.runstore import RunRecord, RunStore, WorkerRecord


def chief_event_dir(chief: WorkerRecord) -> str:
    # The worker's default: a "tensorboard" directory beside the checkpoint directory.
    return posixpath.join(posixpath.dirname(chief.checkpoint_dir.rstrip("/")), "tensorboard")


def local_event_dir(record: RunRecord, store: RunStore) -> Path:
    chief = record.workers[0]
    if chief.host.connection == "local":
        return Path(chief_event_dir(chief))
    return store.root.resolve() / "tensorboard" / record.job_name


def pull_events(record: RunRecord, machines: Machines, target: Path) -> int:
    """Copy the remote chief's new or changed event files into `target`; how many were copied."""
    chief = record.workers[0]
    if chief.host.connection == "local":
        return 0
    listing = machines.agent(chief.host).files(chief_event_dir(chief))
    runner = machines.runner(chief.host)
    copied = 0
    for relative, (size, _mtime) in sorted(listing["files"].items()):
        local = target / relative
        if local.exists() and local.stat().st_size == size:
            continue
        local.parent.mkdir(parents=True, exist_ok=True)
        runner.get(posixpath.join(listing["root"], relative), str(local))
        copied += 1
    return copied

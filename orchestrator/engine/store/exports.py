"""The exported model (job.export): the chief writes it to {workdir}/{job}/export/ at the end of a
successful run; `orchestrate pull-export` copies it to this machine.

The copy goes to a staging directory beside the target and is swapped in whole, so the target
holds one complete export (the chief's own export is swapped in the same way, worker.export).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.capabilities import Files, Reach
from orchestrator.errors import HostError, RunStateError
from orchestrator.model.records import RunRecord, WorkerRecord
from orchestrator.model.workers import export_dir, job_dir_of_run
from orchestrator.paths import inside


@dataclass(frozen=True)
class PulledExport:
    source: str  # the export directory on the chief's host
    target: Path
    files: int
    size_bytes: int


def chief_export_dir(chief: WorkerRecord) -> str:
    return export_dir(job_dir_of_run(chief.run_dir))


def no_export(chief: WorkerRecord, source: str) -> RunStateError:
    return RunStateError(
        f"{chief.name} has no exported model in {source}",
        hint="set 'export: keras' or 'export: saved_model' in the job and run 'orchestrate "
        "up' again: a finished job exports from its last checkpoint without training",
    )


def export_is_remote(record: RunRecord, reach: Reach) -> bool:
    return not reach.reads_in_place(record.workers[0].host)


def local_export(record: RunRecord) -> Path:
    """A chief that shares this machine's files: its export directory, read in place."""
    chief = record.workers[0]
    source = Path(chief_export_dir(chief))
    if not source.is_dir() or not any(source.iterdir()):
        raise no_export(chief, str(source))
    return source


def pull_export(record: RunRecord, files: Files, target: Path) -> PulledExport:
    """Copy the chief's export directory to `target` (replacing what was there)."""
    chief = record.workers[0]
    source = chief_export_dir(chief)
    listing = files.list_files(chief.host, source)
    found = listing.files
    if not found:
        raise no_export(chief, source)
    target = target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        for relative in sorted(found):
            local = inside(staging, relative)
            if local is None:  # a host that answered `../../.bashrc` or `/etc/x` as a name
                raise HostError(
                    chief.host.name,
                    f"its listing of {source} names {relative!r}, which is not a path inside "
                    "the export: nothing was copied",
                    hint="look at what is in that directory on the host (a link or a "
                    "name with '..'), or at whether the host runs orchestrate's own agent",
                )
            local.parent.mkdir(parents=True, exist_ok=True)
            files.download(chief.host, posixpath.join(listing.root, relative), str(local))
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide the model from other users
        _swap_in(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    size = sum(entry[0] for entry in found.values())
    return PulledExport(source=source, target=target, files=len(found), size_bytes=size)


def _swap_in(staging: Path, target: Path) -> None:
    old = None
    if target.exists() or target.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        old.rmdir()  # a fresh unused name for the rename
        target.replace(old)
    staging.replace(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)

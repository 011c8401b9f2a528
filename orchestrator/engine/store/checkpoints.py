"""Where checkpoints live, and how every host gets the one the cluster resumes from.

Only the chief writes checkpoints. Without a shared file system the other hosts have none, and a
cluster whose workers restore different steps diverges or hangs in its first collective. So before
each start the latest checkpoint is copied, through this machine, into every host's checkpoint
directory that lacks it (a shared disk, the same machine or an earlier copy need nothing).

While a run is supervised, each new checkpoint of a remote chief is also mirrored to this machine
(`{state_dir}/checkpoints/{run_id}/`). When the chief's host is lost, a spare host takes its place
and the cluster resumes from the mirror: at most one checkpoint interval back.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.base import Files
from orchestrator.contract import CHECKPOINT_COMPANIONS
from orchestrator.engine.store.runstore import atomic_write, current_umask
from orchestrator.errors import HostError
from orchestrator.fanout import fan_out
from orchestrator.model.answers import CheckpointListing
from orchestrator.model.inventory import WorkerSlot
from orchestrator.model.workers import WorkerSpec
from orchestrator.paths import plain_name


@dataclass(frozen=True)
class CheckpointSpread:
    name: str | None  # the checkpoint the cluster resumes from; None when there is none yet
    size_bytes: int
    copied_to: tuple[str, ...]  # worker names that received a copy
    source: str = "chief"  # "chief", or "mirror" when the chief lacked the latest one


def checkpoint_step(name: str | None) -> int:
    """CheckpointManager names checkpoints `ckpt-<step>` (the worker numbers them by step)."""
    try:
        return int(str(name).rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


class Mirror:
    """The newest checkpoint of a remote chief, kept on this machine."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def latest(self) -> CheckpointListing | None:
        try:
            name = (self.root / "latest").read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        directory = self.root / name
        files = {p.name: p.stat().st_size for p in directory.iterdir()}
        return CheckpointListing(str(directory), name, files, (name,))

    def update(self, host: WorkerSlot, checkpoint_dir: str, files: Files) -> str | None:
        """Copy the host's latest checkpoint here unless it is already here; its name."""
        found = checked_listing(host, files.checkpoint(host, checkpoint_dir))
        current = self.latest()
        if not found.latest or (current and current.latest == found.latest):
            return None
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=self._ready()))
        prefix = found.latest + "."
        latest_only = {n for n in found.files if n.startswith(prefix) or n in CHECKPOINT_COMPANIONS}
        _download(host, found, latest_only, files, staging)
        os.replace(staging, self.root / found.latest)
        _write_atomic(self.root / "latest", found.latest)  # last: never names a partial copy
        for old in self.root.iterdir():
            if old.is_dir() and old.name != found.latest:
                shutil.rmtree(old, ignore_errors=True)
        return found.latest

    def _ready(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root


def _write_atomic(path: Path, text: str) -> None:
    atomic_write(path, text, 0o666 & ~current_umask())  # the mirror keeps the user's umask


def spread_latest_checkpoint(
    specs: list[WorkerSpec], files: Files, mirror: Mirror | None = None
) -> CheckpointSpread:
    """Make the newest checkpoint (the chief's, or the mirror's if newer) present everywhere."""
    chief = specs[0]
    found = checked_listing(chief.host, files.checkpoint(chief.host, chief.checkpoint_dir))
    mirrored = mirror.latest() if mirror else None
    use_mirror = bool(mirrored) and checkpoint_step(mirrored.latest if mirrored else None) > (
        checkpoint_step(found.latest)
    )
    wanted = mirrored if use_mirror and mirrored else found
    if not wanted.latest:
        return CheckpointSpread(None, 0, ())
    targets = {spec.name: spec for spec in (specs if use_mirror else specs[1:])}
    listings = fan_out(
        targets,
        lambda n: checked_listing(
            targets[n].host, files.checkpoint(targets[n].host, targets[n].checkpoint_dir)
        ),
    ).raise_if_failed("reading the checkpoint directories")
    # Every checkpoint the chief keeps, not only the latest: a worker that cannot load the
    # latest falls back to an earlier one, and all of them must find the same files to agree.
    missing = {name: _missing(listing, wanted) for name, listing in listings.items()}
    needy = {n: targets[n] for n, listing in listings.items()
             if missing[n] or listing.checkpoints != wanted.checkpoints}  # fmt: skip
    if needy:
        with tempfile.TemporaryDirectory(prefix="orchestrate-ckpt-") as scratch:
            staging = Path(wanted.directory) if use_mirror else Path(scratch)
            if not use_mirror:
                wanted_files = set().union(*(missing[n] for n in needy))
                _download(chief.host, found, wanted_files, files, staging)
            fan_out(
                needy, lambda n: _install(needy[n], wanted, missing[n], files, staging)
            ).raise_if_failed("copying the latest checkpoint")
    return CheckpointSpread(
        wanted.latest,
        wanted.size_bytes,
        tuple(needy),
        "mirror" if use_mirror else "chief",
    )


def checked_listing(host: WorkerSlot, listing: CheckpointListing) -> CheckpointListing:
    """A host's checkpoint listing whose every name is one plain name (`ckpt-100`,
    `ckpt-100.index`): they become paths here (the mirror, a staging directory) and in the
    other hosts' checkpoint directories. A name with '/' or '..' is the host's error."""
    names = [*([listing.latest] if listing.latest else []), *listing.checkpoints, *listing.files]
    bad = sorted({name for name in names if not plain_name(name)})
    if bad:
        raise HostError(
            host.name,
            f"its checkpoint listing of {listing.directory} names {', '.join(map(repr, bad))}: "
            "not a checkpoint's file name, so nothing was copied",
            hint="look at the 'checkpoint' state file in that directory on the host (it should "
            "list names such as ckpt-100), or at whether the host runs orchestrate's own agent",
        )
    return listing


def _missing(listing: CheckpointListing, wanted: CheckpointListing) -> set[str]:
    """The files of `wanted` that the listed directory lacks or holds with another size."""
    return {name for name, size in wanted.files.items() if listing.files.get(name) != size}


def _download(
    host: WorkerSlot, found: CheckpointListing, names: set[str] | None, files: Files, staging: Path
) -> None:
    for name in sorted(found.files if names is None else names):
        files.download(host, posixpath.join(found.directory, name), str(staging / name))


def _install(
    spec: WorkerSpec, found: CheckpointListing, names: set[str], files: Files, staging: Path
) -> None:
    assert found.latest is not None
    pairs = [(str(staging / n), posixpath.join(spec.checkpoint_dir, n)) for n in sorted(names)]
    files.upload(spec.host, pairs)
    files.adopt_checkpoint(spec.host, spec.checkpoint_dir, found.latest, found.checkpoints)

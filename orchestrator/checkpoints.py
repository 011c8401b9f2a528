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
from typing import Any

from orchestrator.connect import Machines
from orchestrator.fanout import fan_out, successes
from orchestrator.inventory import Host
from orchestrator.plan import WorkerSpec


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


def _same(listing: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return listing["latest"] == wanted["latest"] and listing["files"] == wanted["files"]


class Mirror:
    """The newest checkpoint of a remote chief, kept on this machine."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def latest(self) -> dict[str, Any] | None:
        """A listing shaped like the agent's `checkpoint` answer, or None."""
        try:
            name = (self.root / "latest").read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        directory = self.root / name
        files = {p.name: p.stat().st_size for p in directory.iterdir()}
        return {"directory": str(directory), "latest": name, "files": files}

    def update(self, host: Host, checkpoint_dir: str, machines: Machines) -> str | None:
        """Copy the host's latest checkpoint here unless it is already here; its name."""
        found = machines.agent(host).checkpoint(checkpoint_dir)
        current = self.latest()
        if not found["latest"] or (current and current["latest"] == found["latest"]):
            return None
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=self._ready()))
        _download(host, found, machines, staging)
        os.replace(staging, self.root / found["latest"])
        _write_atomic(self.root / "latest", found["latest"])  # last: never names a partial copy
        for old in self.root.iterdir():
            if old.is_dir() and old.name != found["latest"]:
                shutil.rmtree(old, ignore_errors=True)
        return str(found["latest"])

    def _ready(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def spread_latest_checkpoint(
    specs: list[WorkerSpec], machines: Machines, mirror: Mirror | None = None
) -> CheckpointSpread:
    """Make the newest checkpoint (the chief's, or the mirror's if newer) present everywhere."""
    chief = specs[0]
    found = machines.agent(chief.host).checkpoint(chief.checkpoint_dir)
    mirrored = mirror.latest() if mirror else None
    use_mirror = mirrored and checkpoint_step(mirrored["latest"]) > checkpoint_step(found["latest"])
    wanted = mirrored if use_mirror else found
    if not wanted or not wanted["latest"]:
        return CheckpointSpread(None, 0, ())
    targets = specs if use_mirror else specs[1:]
    listings = successes(
        fan_out(
            range(len(targets)),
            lambda i: machines.agent(targets[i].host).checkpoint(targets[i].checkpoint_dir),
        ),
        "reading the checkpoint directories",
    )
    needy = [targets[i] for i, listing in listings.items() if not _same(listing, wanted)]
    if needy:
        with tempfile.TemporaryDirectory(prefix="orchestrate-ckpt-") as scratch:
            staging = Path(wanted["directory"]) if use_mirror else Path(scratch)
            if not use_mirror:
                _download(chief.host, found, machines, staging)
            successes(
                fan_out(
                    range(len(needy)),
                    lambda i: _install(needy[i], wanted, machines, staging),
                ),
                "copying the latest checkpoint",
            )
    return CheckpointSpread(
        wanted["latest"],
        sum(wanted["files"].values()),
        tuple(spec.name for spec in needy),
        "mirror" if use_mirror else "chief",
    )


def _download(host: Host, found: dict[str, Any], machines: Machines, staging: Path) -> None:
    runner = machines.runner(host)
    for name in found["files"]:
        runner.get(posixpath.join(found["directory"], name), str(staging / name))


def _install(spec: WorkerSpec, found: dict[str, Any], machines: Machines, staging: Path) -> None:
    runner = machines.runner(spec.host)
    runner.make_dirs([spec.checkpoint_dir])
    for name in found["files"]:
        runner.put(str(staging / name), posixpath.join(spec.checkpoint_dir, name))
    machines.agent(spec.host).adopt_checkpoint(spec.checkpoint_dir, found["latest"])

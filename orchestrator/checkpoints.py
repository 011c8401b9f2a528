"""Make the chief's latest checkpoint present on every host before the workers start.

Only the chief writes checkpoints. Without a shared file system the other hosts have none, and a
cluster whose workers restore different steps diverges or hangs in its first collective. So before
each start the chief's latest checkpoint is copied, through this machine, into every other host's
checkpoint directory. A host that already has the same checkpoint (a shared disk, the same
machine, or an earlier copy) is left alone.
"""

from __future__ import annotations

import posixpath
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.connect import Machines
from orchestrator.fanout import fan_out, successes
from orchestrator.plan import WorkerSpec


@dataclass(frozen=True)
class CheckpointSpread:
    name: str | None  # the chief's latest checkpoint, None when there is none yet
    size_bytes: int
    copied_to: tuple[str, ...]  # worker names that received a copy


def _same(listing: dict[str, Any], chief: dict[str, Any]) -> bool:
    return listing["latest"] == chief["latest"] and listing["files"] == chief["files"]


def spread_latest_checkpoint(specs: list[WorkerSpec], machines: Machines) -> CheckpointSpread:
    chief, others = specs[0], specs[1:]
    found = machines.agent(chief.host).checkpoint(chief.checkpoint_dir)
    if not found["latest"]:
        return CheckpointSpread(None, 0, ())
    listings = successes(
        fan_out(
            range(len(others)),
            lambda i: machines.agent(others[i].host).checkpoint(others[i].checkpoint_dir),
        ),
        "reading the checkpoint directories",
    )
    needy = [others[i] for i, listing in listings.items() if not _same(listing, found)]
    if needy:
        with tempfile.TemporaryDirectory(prefix="orchestrate-ckpt-") as staging:
            _download(chief, found, machines, Path(staging))
            successes(
                fan_out(
                    range(len(needy)),
                    lambda i: _install(needy[i], found, machines, Path(staging)),
                ),
                "copying the chief's checkpoint",
            )
    return CheckpointSpread(
        found["latest"], sum(found["files"].values()), tuple(spec.name for spec in needy)
    )


def _download(chief: WorkerSpec, found: dict[str, Any], machines: Machines, staging: Path) -> None:
    runner = machines.runner(chief.host)
    for name in found["files"]:
        runner.get(posixpath.join(found["directory"], name), str(staging / name))


def _install(spec: WorkerSpec, found: dict[str, Any], machines: Machines, staging: Path) -> None:
    runner = machines.runner(spec.host)
    runner.make_dirs([spec.checkpoint_dir])
    for name in found["files"]:
        runner.put(str(staging / name), posixpath.join(spec.checkpoint_dir, name))
    machines.agent(spec.host).adopt_checkpoint(spec.checkpoint_dir, found["latest"])

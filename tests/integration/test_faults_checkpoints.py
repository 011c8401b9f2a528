"""Checkpoint faults on real TensorFlow workers: a damaged latest checkpoint and a full disk.

Nothing is lost: a worker falls back to the previous checkpoint (all of them, alike), never
starts from step 0 while checkpoints exist, and a save that fails for lack of space leaves the
previous checkpoint as the latest, loadable one.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cli, clean_env, local_tf_inventory, restored_steps

pytestmark = pytest.mark.tf


def checkpoint_files(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir())}


def truncate(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def test_a_damaged_latest_checkpoint_falls_back_and_none_loadable_refuses(
    cli: Cli, reaper: list[str]
) -> None:
    local_tf_inventory(cli, steps=40, checkpoint_every=20, max_to_keep=5)
    assert cli("up", "--skip-checks", "inv.yaml", timeout=300).returncode == 0
    reaper.append(cli.record()["run_id"])
    checkpoints = cli.cwd / "work" / "shapes" / "checkpoints"
    truncate(checkpoints / "ckpt-40.data-00000-of-00001")

    local_tf_inventory(cli, steps=60, checkpoint_every=20, max_to_keep=5)
    result = cli("up", "--skip-checks", "inv.yaml", timeout=300)
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 0, result.stdout + result.stderr
    # Both workers found the latest unreadable and took the same earlier one.
    assert restored_steps(cli) == [20, 20]
    logs = cli("tail", "-n", "200", check=True).stdout
    assert logs.count("checkpoint ckpt-40 cannot be loaded") == 2
    notes = [w["note"] for w in cli.status()["workers"]]
    assert all(
        n and n.startswith("fell back to checkpoint ckpt-20 (step 20): ckpt-40:") for n in notes
    )
    assert [w["step"] for w in cli.status()["workers"]] == [60, 60]

    # Every checkpoint damaged: the workers refuse to train over them, and nothing is retried.
    for data in checkpoints.glob("ckpt-*.data-*"):
        truncate(data)
    before = checkpoint_files(checkpoints)
    local_tf_inventory(cli, steps=80, checkpoint_every=20, max_to_keep=5)
    result = cli("up", "--skip-checks", "inv.yaml", timeout=300)
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 1
    report = " ".join(result.stderr.split())  # the console wraps long lines
    assert "can be loaded" in report and "refusing to start from step 0" in report
    assert "after 0 restart(s) because exit code 2 is marked permanent" in report
    assert checkpoint_files(checkpoints) == before


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 KiB tmpfs: room for one checkpoint of the bundled example (about 32 KiB), not two."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(
    cli: Cli, reaper: list[str], small_disk: Path
) -> None:
    local_tf_inventory(cli, steps=60, checkpoint_every=20, checkpoint_dir=str(small_disk),
                       max_restarts=3, restart_backoff=0)  # fmt: skip
    result = cli("up", "--skip-checks", "inv.yaml", timeout=400)
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 1, result.stdout + result.stderr
    report = " ".join(result.stderr.split())  # the console wraps long lines
    assert "No space left on device" in report and str(small_disk) in report
    assert "the worker that failed first: chief" in report
    # The same failure at the same step again ended it: not all three restarts at full speed.
    assert "after 1 restart(s) because it failed the same way at the same step twice" in report
    state = (small_disk / "checkpoint").read_text()
    assert 'model_checkpoint_path: "ckpt-20"' in state
    # ...and that checkpoint loads: the use-phase command restores and evaluates it.
    evaluated = subprocess.run(
        [sys.executable, "-m", "worker.evaluate", "--task", "worker.examples.shapes:task",
         "--checkpoint-dir", str(small_disk)],
        capture_output=True, text=True, env=clean_env(), timeout=300, check=False,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["step"] == 20

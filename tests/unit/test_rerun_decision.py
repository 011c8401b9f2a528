"""A finished job run again (issue 56): when the chief's latest checkpoint already reaches
job.steps, `up` starts no worker and makes no run; `up --fresh` sets the checkpoints aside on
every host and trains from 0 (tests/integration/test_rerun_finished_job.py trains it for real).

The decision is pure (checkpoint step against steps, the export's presence); the reading and the
moving go through the real agent on this machine, against checkpoint directories laid out as
the worker's CheckpointManager lays them (a `checkpoint` state file naming `ckpt-<step>`)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.registry import load_inventory, open_backend
from orchestrator.engine.start.rerun import (
    Trained,
    already_trained,
    exported,
    reached,
    set_aside_checkpoints,
)
from orchestrator.model.inventory import Inventory, Job
from tests.conftest import clean_env

TASK = "worker.examples.shapes:task"


@pytest.mark.parametrize(
    ("latest", "steps", "finished"),
    [
        ("ckpt-300", 300, True),
        ("ckpt-400", 300, True),  # steps lowered below what trained: nothing to train either
        ("ckpt-299", 300, False),
        ("ckpt-300", 301, False),  # steps raised: it trains on from 300
        (None, 300, False),  # no checkpoint yet
        ("model-final", 300, False),  # not a name the loop writes: no step, so it starts
    ],
)
def test_a_checkpoint_finishes_the_job_at_or_past_its_steps(
    latest: str | None, steps: int, finished: bool
) -> None:
    assert reached(Job(name="j", task=TASK, steps=steps), latest) is finished


def test_a_script_jobs_checkpoints_never_finish_it() -> None:
    """A script numbers its checkpoints as it likes (a save count, an epoch): ckpt-300 says
    nothing of its step 300."""
    assert not reached(Job(name="j", script="train.py", steps=300), "ckpt-300")
    assert not reached(Job(name="j", script="train.py"), "ckpt-300")


def test_a_finished_job_with_its_export_missing_still_starts_to_export() -> None:
    assert exported(Job(name="j", task=TASK, steps=1), [])  # no export asked for
    keras = Job(name="j", task=TASK, steps=1, export="keras")
    assert exported(keras, ["model.keras"])
    assert exported(keras, ["model/saved_model.pb", "model/variables/x.index"])  # tf.keras 2
    assert not exported(keras, ["saved_model/saved_model.pb"])  # the other format's
    assert not exported(keras, [])
    saved = Job(name="j", task=TASK, steps=1, export="saved_model")
    assert exported(saved, ["saved_model/saved_model.pb"])
    assert not exported(saved, ["model.keras"])


def test_the_message_names_the_checkpoint_the_steps_the_directory_and_fresh() -> None:
    message = Trained("ckpt-300", 300, "/home/u/orchestrate/shapes/checkpoints", "worker-0").message
    assert message.startswith("ckpt-300 already reaches steps: 300: nothing to train")
    assert "/home/u/orchestrate/shapes/checkpoints on worker-0" in message
    assert "raise job.steps" in message and "'orchestrate up --fresh' starts over" in message


def write_checkpoints(directory: Path, *steps: int) -> None:
    """What the worker's CheckpointManager leaves: each step's files and the state file."""
    directory.mkdir(parents=True, exist_ok=True)
    for step in steps:
        (directory / f"ckpt-{step}.index").write_bytes(b"i" * 10)
        (directory / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"d" * 100)
    listed = "".join(f'all_model_checkpoint_paths: "ckpt-{s}"\n' for s in steps)
    (directory / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{steps[-1]}"\n{listed}')


def local_inventory(tmp_path: Path, job: dict[str, Any], spares: bool = False) -> Inventory:
    """Two local workers (one machine, one checkpoint directory) under tmp_path/work."""
    path = tmp_path / "inv.yaml"
    path.write_text(
        f"defaults: {{connection: local, workdir: '{tmp_path / 'work'}'}}\n"
        "hosts:\n  - {name: a, address: 127.0.0.1, port: 29871}\n"
        "  - {name: b, address: 127.0.0.1, port: 29872}\n"
        + ("spares:\n  - {name: s, address: 127.0.0.1, port: 29873}\n" if spares else "")
        + f"job: {json.dumps({'name': 'demo', **job})}\n"
    )
    return load_inventory(path)


def test_the_chiefs_checkpoint_is_read_through_its_agent(tmp_path: Path) -> None:
    checkpoints = tmp_path / "work" / "demo" / "checkpoints"
    write_checkpoints(checkpoints, 100, 200, 300)
    finished = local_inventory(tmp_path, {"task": TASK, "steps": 300})
    with open_backend(finished) as backend:
        assert already_trained(finished, backend, backend) == Trained(
            "ckpt-300", 300, str(checkpoints), "a"
        )
        more = local_inventory(tmp_path, {"task": TASK, "steps": 500})
        assert already_trained(more, backend, backend) is None
        (tmp_path / "train.py").write_text("")
        script = local_inventory(tmp_path, {"script": "train.py", "steps": 300})
        assert already_trained(script, backend, backend) is None
        exporting = local_inventory(tmp_path, {"task": TASK, "steps": 300, "export": "keras"})
        assert already_trained(exporting, backend, backend) is None  # it starts, to export
        (tmp_path / "work" / "demo" / "export").mkdir()
        (tmp_path / "work" / "demo" / "export" / "model.keras").write_bytes(b"m")
        assert already_trained(exporting, backend, backend) is not None
    (tmp_path / "work" / "demo" / "checkpoints").rename(tmp_path / "elsewhere")
    with open_backend(finished) as backend:
        assert already_trained(finished, backend, backend) is None  # no checkpoint: it trains


def test_fresh_moves_the_checkpoints_aside_once_per_directory_and_loses_nothing(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "work" / "demo" / "checkpoints"
    write_checkpoints(checkpoints, 100, 200)
    checkpoints.chmod(0o750)
    inventory = local_inventory(tmp_path, {"task": TASK, "steps": 300}, spares=True)
    said: list[str] = []
    with open_backend(inventory) as backend:
        moved = set_aside_checkpoints(
            inventory, backend, backend, said.append, stamp="20261207-120000"
        )
        aside = tmp_path / "work" / "demo" / "checkpoints.set-aside-20261207-120000"
        assert [(m.directory, m.moved_to, m.count) for m in moved] == [
            (str(checkpoints), str(aside), 5)
        ]  # the two workers and the spare share the directory: moved once
        assert said == [f"--fresh: set aside 5 file(s) of {checkpoints} on a: moved to {aside}"]
        assert sorted(p.name for p in aside.iterdir()) == [
            "checkpoint", "ckpt-100.data-00000-of-00001", "ckpt-100.index",
            "ckpt-200.data-00000-of-00001", "ckpt-200.index",
        ]  # fmt: skip
        assert list(checkpoints.iterdir()) == []
        assert stat.S_IMODE(checkpoints.stat().st_mode) == 0o750

        # The same second again: nothing left to move, and it says so.
        said.clear()
        assert (
            set_aside_checkpoints(inventory, backend, backend, said.append, "20261207-120000") == []
        )
        assert said == [f"--fresh: no checkpoint to set aside ({checkpoints} on a holds none); "
                        "training from step 0"]  # fmt: skip

        # A taken name gets a number; a directory reached through a link stays linked.
        target = tmp_path / "disk" / "ckpts"
        write_checkpoints(target, 300)
        checkpoints.rmdir()
        checkpoints.symlink_to(target)
        (moved_again,) = set_aside_checkpoints(
            inventory, backend, backend, said.append, "20261207-120000"
        )
    assert moved_again.moved_to == f"{target}.set-aside-20261207-120000"
    assert checkpoints.is_symlink() and checkpoints.resolve() == target
    assert list(target.iterdir()) == []
    assert (tmp_path / "disk" / "ckpts.set-aside-20261207-120000" / "checkpoint").is_file()
    write_checkpoints(target, 400)
    with open_backend(inventory) as backend:
        (third,) = set_aside_checkpoints(
            inventory, backend, backend, said.append, "20261207-120000"
        )
    assert third.moved_to == f"{target}.set-aside-20261207-120000-2"


def test_up_of_a_finished_job_starts_nothing_makes_no_run_and_exits_0(tmp_path: Path) -> None:
    """Through the real CLI: no worker, no run record, no TensorFlow needed to say so."""
    write_checkpoints(tmp_path / "work" / "demo" / "checkpoints", 200, 300)
    local_inventory(tmp_path, {"task": TASK, "steps": 300})
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "up", "inv.yaml"], cwd=tmp_path,
        env=clean_env(ORCHESTRATE_WIDTH="400"), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    checkpoints = tmp_path / "work" / "demo" / "checkpoints"
    assert result.stderr.strip() == (
        f"job demo: ckpt-300 already reaches steps: 300: nothing to train (the checkpoints in "
        f"{checkpoints} on a; raise job.steps, or 'orchestrate up --fresh' starts over from "
        "step 0, setting them aside)"
    )
    assert not (tmp_path / ".orchestrate" / "runs").exists() or not os.listdir(
        tmp_path / ".orchestrate" / "runs"
    )
    assert not (tmp_path / "work" / "demo" / "runs").exists()  # no worker's run directory

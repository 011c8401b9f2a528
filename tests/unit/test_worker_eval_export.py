"""Evaluation, export and restore: the flags, the checkpoint names, the export swap, and what
status shows. Pure rules, no TensorFlow (the TensorFlow side is tests/integration/
test_evaluation_export.py)."""

from __future__ import annotations

import io
import os
import sys
import types
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.cli.render import status_table
from orchestrator.engine.observe.status import RunStatus, worker_status
from orchestrator.model.answers import WorkerProbe
from orchestrator.model.inventory import WorkerSlot
from orchestrator.model.records import WorkerRecord
from worker import cli
from worker.export import _swap_in, keras_major
from worker.restore import CheckpointNotFound, available_checkpoints, checkpoint_path
from worker.task import TaskError, TrainingTask

TASK = "worker.examples.shapes:task"


def test_eval_and_export_defaults_and_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = cli.parse_config(["--task", TASK, "--steps", "5"], {"ORCHESTRATE_RUN_DIR": "run"})
    assert (config.eval_every, config.export_format) == (None, None)
    assert config.export_dir == str(tmp_path / "run" / "export")  # beside the checkpoints
    assert config.temp_export_dir == str(tmp_path / "run" / "tmp-export")
    argv = ["--task", TASK, "--steps", "5", "--eval-every", "2", "--export", "saved_model"]
    config = cli.parse_config([*argv, "--export-dir", "out"], {})
    assert (config.eval_every, config.export_format) == (2, "saved_model")
    assert config.export_dir == str(tmp_path / "out")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--eval-every", "0"], "worker: --eval-every must be a positive integer, got 0"),
        (["--export", "onnx"], "worker: argument --export: invalid choice: 'onnx'"),
    ],
)
def test_bad_eval_and_export_flags_exit_2(capsys, flags, message):
    assert cli.main(["--task", TASK, "--steps", "5", *flags]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1


def test_eval_every_needs_an_eval_dataset(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = types.ModuleType("fake_eval_tasks")
    module.task = lambda: TrainingTask(model=lambda: None, dataset=lambda: None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    code = cli.main(["--task", "fake_eval_tasks:task", "--steps", "5", "--eval-every", "2"])
    assert code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--eval-every 2: task 'fake_eval_tasks:task' has no eval_dataset" in err


def test_eval_dataset_must_be_callable() -> None:
    with pytest.raises(TaskError, match=r"TrainingTask\.eval_dataset must be callable"):
        TrainingTask(model=lambda: None, dataset=lambda: None, eval_dataset=[1, 2])  # type: ignore[arg-type]
    assert TrainingTask(model=lambda: None, dataset=lambda: None).eval_dataset is None


def make_checkpoints(directory: Path, steps: list[int], latest: int | None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for step in steps:
        (directory / f"ckpt-{step}.index").write_bytes(b"")
        (directory / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"")
    if latest is not None:
        (directory / "checkpoint").write_text(
            f'model_checkpoint_path: "ckpt-{latest}"\nall_model_checkpoint_paths: "ckpt-{latest}"\n'
        )


def test_checkpoints_are_listed_by_step_and_the_latest_comes_from_the_state_file(tmp_path):
    make_checkpoints(tmp_path, [100, 20, 3], latest=20)  # e.g. adopted by the controller
    assert available_checkpoints(str(tmp_path)) == ["ckpt-3", "ckpt-20", "ckpt-100"]
    assert checkpoint_path(str(tmp_path)) == str(tmp_path / "ckpt-20")
    assert checkpoint_path(str(tmp_path), "ckpt-3") == str(tmp_path / "ckpt-3")
    assert checkpoint_path(str(tmp_path), "ckpt-100.index") == str(tmp_path / "ckpt-100")
    (tmp_path / "checkpoint").unlink()
    assert checkpoint_path(str(tmp_path)) == str(tmp_path / "ckpt-100")


def test_bad_checkpoint_names_say_what_is_there(tmp_path):
    make_checkpoints(tmp_path / "c", [10, 20], latest=20)
    with pytest.raises(CheckpointNotFound) as error:
        checkpoint_path(str(tmp_path / "c"), "ckpt-15")
    assert str(error.value) == (
        f"no checkpoint 'ckpt-15' in {tmp_path / 'c'}; available: ckpt-10, ckpt-20"
    )
    with pytest.raises(CheckpointNotFound, match="no such checkpoint directory"):
        checkpoint_path(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointNotFound, match="no checkpoint in"):
        checkpoint_path(str(tmp_path / "empty"))


def test_export_swap_replaces_the_whole_directory(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    (target / "model.keras").write_text("old")
    staging = tmp_path / ".export.partial-1"
    (staging / "saved_model").mkdir(parents=True)
    (staging / "saved_model" / "saved_model.pb").write_text("new")
    _swap_in(str(staging), str(target))
    assert sorted(os.listdir(target)) == ["saved_model"]  # no stale model.keras beside it
    assert sorted(os.listdir(tmp_path)) == ["export"]


def test_keras_generation_comes_from_the_model_class():
    legacy = type("Model", (), {"__module__": "tf_keras.src.engine.training"})
    subclass = type("MyModel", (legacy,), {"__module__": "my_tasks"})
    assert keras_major(subclass()) == 2
    with pytest.raises(TypeError, match="not a Keras model"):
        keras_major(object())


def test_status_shows_the_latest_evaluation():
    host = WorkerSlot(name="chief", address="localhost", port=1, connection="local")
    record = WorkerRecord("chief", 0, host, "/w/j/runs/r/attempt-0/chief", "/log", "/w/j/ckpt")
    progress = {"step": 40, "target_steps": 40, "val_loss": 0.25, "val_accuracy": 0.875}
    probe = {"exists": True, "pid": 1, "alive": True, "progress": progress, "exit": None}
    status = worker_status(record, WorkerProbe.parse(probe, now=0.0))
    json = status.to_json()
    assert (json["val_loss"], json["val_accuracy"]) == (0.25, 0.875)
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(status_table(RunStatus("r", "j", status.state, (status,))))
    lines = console.export_text().splitlines()
    header, row = lines[2], lines[4]
    assert "val_loss" in header and "val_acc" in header
    assert "0.25" in row and "0.875" in row

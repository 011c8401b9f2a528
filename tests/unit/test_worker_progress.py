"""The progress file: atomic replacement, merging, strict JSON, and the report() helper."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from worker import progress
from worker.progress import ProgressWriter, report


def read(path) -> dict:
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def test_write_merges_fields_and_stamps_time(tmp_path):
    path = tmp_path / "progress.json"
    writer = ProgressWriter(str(path))
    before = time.time()
    writer.write(step=0, loss=None, target_steps=30)
    first = read(path)
    assert first["step"] == 0 and first["loss"] is None and first["target_steps"] == 30
    assert before <= first["time"] <= time.time()
    writer.write(step=10, loss=1.25)
    second = read(path)
    # Fields not named keep their value; named ones change. The first step past 0 stamps
    # first_step_at (goodput's end of start-up), once.
    assert "first_step_at" not in first
    assert second == {**first, "step": 10, "loss": 1.25, "time": second["time"],
                      "first_step_at": second["time"]}  # fmt: skip
    assert second["time"] >= first["time"]
    assert writer.fields == second
    writer.write(step=20)
    assert read(path)["first_step_at"] == second["time"]


def test_first_step_is_past_the_start_step_and_timed_blocks_add_up(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    writer = ProgressWriter(str(path))
    writer.write(step=300, start_step=300)  # a resume: its start is no step made
    assert "first_step_at" not in read(path)
    writer.write(step=301)
    assert read(path)["first_step_at"] == read(path)["time"]
    monkeypatch.setenv("ORCHESTRATE_PROGRESS_FILE", str(tmp_path / "script.json"))
    for _ in range(2):
        with progress.timed("checkpoint"):
            time.sleep(0.01)
    with progress.timed("evaluation"):
        pass
    script = read(tmp_path / "script.json")
    assert script["checkpoint_seconds"] >= 0.02 and script["eval_seconds"] >= 0


def test_no_path_writes_nothing_but_still_merges(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    writer = ProgressWriter(None)
    writer.write(step=3)
    writer.write(loss=0.5)
    assert os.listdir(tmp_path) == []
    assert writer.fields["step"] == 3 and writer.fields["loss"] == 0.5


def test_creates_the_directory_and_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "run" / "deep" / "progress.json"
    writer = ProgressWriter(str(path))
    for step in range(5):
        writer.write(step=step)
    assert os.listdir(path.parent) == ["progress.json"]
    assert read(path)["step"] == 4
    # Readable by others (a monitoring user), unlike mkstemp's 0600.
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_a_failed_replace_keeps_the_old_file_and_cleans_up(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    writer = ProgressWriter(str(path))
    writer.write(step=1)

    def fail(src, dst):
        raise OSError("disk trouble")

    monkeypatch.setattr(progress.os, "replace", fail)
    with pytest.raises(OSError, match="disk trouble"):
        writer.write(step=2)
    assert read(path)["step"] == 1
    assert os.listdir(tmp_path) == ["progress.json"]


def test_readers_never_see_a_partial_file(tmp_path):
    path = tmp_path / "progress.json"
    writer = ProgressWriter(str(path))
    writer.write(step=0, devices=["/device:CPU:0"] * 200)  # big enough to need several writes
    stop = threading.Event()

    def keep_writing() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            writer.write(step=step)

    thread = threading.Thread(target=keep_writing)
    thread.start()
    try:
        steps = [read(path)["step"] for _ in range(500)]  # raises on a torn or empty file
    finally:
        stop.set()
        thread.join()
    assert steps == sorted(steps)


def test_non_finite_and_numpy_like_values_become_strict_json(tmp_path):
    class Scalar:  # what numpy and TensorFlow scalars look like, without importing them
        def __init__(self, value):
            self.value = value

        def tolist(self):
            return self.value

    path = tmp_path / "progress.json"
    ProgressWriter(str(path)).write(
        loss=float("nan"), accuracy=float("inf"), step=Scalar(7), steps_per_sec=Scalar(2.5)
    )
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["loss"] is None and data["accuracy"] is None
    assert data["step"] == 7 and data["steps_per_sec"] == 2.5


def test_report_writes_to_the_file_named_in_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv("ORCHESTRATE_PROGRESS_FILE", str(path))
    report(step=5, target_steps=100)
    report(step=6, loss=0.75)
    data = read(path)
    assert data["step"] == 6 and data["target_steps"] == 100 and data["loss"] == 0.75
    assert isinstance(data["time"], float)


def test_report_without_the_environment_does_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORCHESTRATE_PROGRESS_FILE", raising=False)
    report(step=1)
    assert os.listdir(tmp_path) == []


def _imported_modules(path: str) -> set[str]:
    import ast

    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names
            if isinstance(node, ast.Import)
            else [ast.alias(node.module or "." * node.level)]
        )
    }


def test_progress_module_imports_only_the_standard_library():
    import sys

    from orchestrator import contract

    # The shared contract is allowed: it is itself standard-library only (checked here too).
    for path, allowed in (
        (progress.__file__, {"orchestrator.contract"}),
        (contract.__file__, set()),
    ):
        top = {name.split(".")[0] for name in _imported_modules(path) - allowed}
        assert top <= set(sys.stdlib_module_names) | {"__future__"}, path


def test_history_keeps_one_line_per_metric_step(tmp_path):
    path = tmp_path / "progress.json"
    writer = ProgressWriter(str(path))
    writer.write(step=0, loss=None, steps_per_sec=None, target_steps=30)  # nothing measured yet
    writer.write(step=10, loss=1.5, accuracy=0.25, steps_per_sec=4.0)
    writer.write(step=10, checkpoint_step=10)  # a checkpoint: no new point
    writer.write(step=20, loss=1.0, accuracy=0.5, steps_per_sec=5.0)
    lines = (tmp_path / progress.HISTORY_FILE).read_text().splitlines()
    points = [json.loads(line) for line in lines]
    assert [(p["step"], p["loss"], p["steps_per_sec"]) for p in points] == [
        (10, 1.5, 4.0),
        (20, 1.0, 5.0),
    ]
    assert all(p["time"] > 0 for p in points)


def test_history_stays_bounded_and_keeps_the_whole_run(tmp_path):
    history = progress.History(str(tmp_path / progress.HISTORY_FILE), limit=100)
    for step in range(1, 2001):
        history.append({"step": step, "time": float(step), "loss": 1.0 / step})
    steps = [json.loads(line)["step"] for line in Path(history.path).read_text().splitlines()]
    assert len(steps) <= 100
    assert steps == sorted(steps)
    # The first points survive (thinned), the newest are all there.
    assert steps[0] < 50 and steps[-25:] == list(range(1976, 2001))


def test_history_counts_an_existing_file_when_a_writer_restarts(tmp_path):
    path = str(tmp_path / progress.HISTORY_FILE)
    first = progress.History(path, limit=10)
    for step in range(8):
        first.append({"step": step, "time": 0.0, "loss": 1.0})
    second = progress.History(path, limit=10)
    for step in range(8, 16):
        second.append({"step": step, "time": 0.0, "loss": 1.0})
    assert len(Path(path).read_text().splitlines()) <= 10


class RecordedMetrics:
    """worker.tracking.MetricLog's interface, keeping what it was asked to log."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float | None]]] = []

    def log(self, step: int, values: dict[str, float | None]) -> None:
        self.logged.append((step, dict(values)))


def test_keras_progress_logs_each_figure_once_per_step_into_the_tracker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.kerasprogress import FitReporter

    monkeypatch.setenv("ORCHESTRATE_PROGRESS_FILE", str(tmp_path / "progress.json"))
    reporter = FitReporter(every=0.0)
    tracker = RecordedMetrics()
    reporter.tracking = tracker  # type: ignore[assignment]
    params = {"epochs": 2, "steps": 4}
    reporter.batch(1, {"loss": 2.0}, params)  # the first batch: the start step, no figures
    reporter.batch(2, {"loss": 1.5, "accuracy": 0.5}, params)
    reporter.epoch(4, {"loss": 1.0, "accuracy": 0.6, "val_loss": 1.2, "val_accuracy": 0.55})
    reporter.epoch(4, {"loss": 1.0, "accuracy": 0.6})  # on_train_end: the same step again
    assert tracker.logged == [
        (2, {"loss": 1.5, "accuracy": 0.5}),
        (4, {"loss": 1.0, "accuracy": 0.6, "val_loss": 1.2, "val_accuracy": 0.55}),
    ]

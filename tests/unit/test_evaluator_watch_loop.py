"""The evaluator's watch loop (worker.evaluator_watch): which checkpoint next, skipped counts,
when it ends.

The checkpoint directory is a real one (empty ckpt-N.index files, read by worker.restore's
available_checkpoints, the listing the evaluator uses); "training" writes checkpoints into it from
inside the fake evaluation and the fake poll wait, i.e. while the evaluator is busy or asleep.
No TensorFlow.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator.contract import EXIT_USAGE
from worker import evaluate as evaluate_cli
from worker.evaluator_watch import (
    Choice,
    Outcome,
    Tally,
    Watch,
    WatchError,
    checkpoint_step,
    default_tensorboard_dir,
    next_checkpoint,
    tf_config_problem,
)
from worker.restore import available_checkpoints


def write_checkpoint(directory: Path, step: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"")
    (directory / f"ckpt-{step}.index").write_bytes(b"")


def write_checkpoints(directory: Path, *steps: int) -> None:
    for step in steps:
        write_checkpoint(directory, step)


class Polls(threading.Event):
    """The stop flag; each wait() between polls runs the next scripted action (the training)."""

    def __init__(self, actions: list[Callable[[], None]]) -> None:
        super().__init__()
        self.actions = actions
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.actions:
            self.actions.pop(0)()
        elif not self.is_set():
            raise AssertionError("the watch waited with nothing more to happen")
        return self.is_set()


class Harness:
    def __init__(self, directory: Path, final_step: int, polls: Polls) -> None:
        self.directory = directory
        self.during: dict[str, Callable[[], None]] = {}  # checkpoint -> what happens meanwhile
        self.failing: dict[str, int] = {}  # checkpoint -> reads that fail
        self.evaluated: list[str] = []
        self.reports: list[tuple[str, int, int, int]] = []
        self.logs: list[str] = []
        self.watch = Watch(
            str(directory), final_step, list_checkpoints=available_checkpoints,
            evaluate=self.evaluate, report=self.report, log=self.logs.append, stop=polls,
            poll_seconds=0,
        )  # fmt: skip

    def evaluate(self, name: str) -> Mapping[str, Any]:
        self.during.pop(name, lambda: None)()
        if self.failing.get(name, 0) > 0:
            self.failing[name] -= 1
            raise OSError(f"{name}: truncated")
        self.evaluated.append(name)
        return {"val_loss": 1.0 / checkpoint_step(name), "val_accuracy": 0.5, "examples": 10}

    def report(self, name: str, step: int, metrics: Mapping[str, Any], tally: Tally) -> None:
        assert metrics["val_loss"] == 1.0 / step
        self.reports.append((name, step, tally.evaluated, tally.skipped))

    def run(self) -> Outcome:
        return self.watch.run()


def test_the_newest_later_checkpoint_is_next_and_the_others_later_are_skipped() -> None:
    assert next_checkpoint([], None) == Choice(None)
    assert next_checkpoint(["ckpt-10", "ckpt-20"], 20) == Choice(None)
    assert next_checkpoint(["ckpt-10", "ckpt-20", "ckpt-30"], None) == Choice("ckpt-30", 2)
    assert next_checkpoint(["ckpt-10", "ckpt-20", "ckpt-30"], 10) == Choice("ckpt-30", 1)
    # By step, not by name: ckpt-100 is newer than ckpt-90.
    assert next_checkpoint(["ckpt-90", "ckpt-100"], 80) == Choice("ckpt-100", 1)
    assert Choice("ckpt-100").step == 100 and Choice(None).step is None


def test_checkpoints_written_while_busy_are_skipped_for_the_newest_until_the_final(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "checkpoints"
    write_checkpoint(checkpoints, 10)
    polls = Polls([lambda: write_checkpoints(checkpoints, 50, 60)])
    harness = Harness(checkpoints, final_step=60, polls=polls)
    # While ckpt-10 is evaluated, 20 and 30 appear; while 30 is, 40; while it sleeps, 50 and 60.
    harness.during["ckpt-10"] = lambda: write_checkpoints(checkpoints, 20, 30)
    harness.during["ckpt-30"] = lambda: write_checkpoint(checkpoints, 40)
    outcome = harness.run()
    assert outcome.how == "final"
    assert harness.evaluated == ["ckpt-10", "ckpt-30", "ckpt-40", "ckpt-60"]
    assert harness.reports == [
        ("ckpt-10", 10, 1, 0), ("ckpt-30", 30, 2, 1), ("ckpt-40", 40, 3, 1), ("ckpt-60", 60, 4, 2),
    ]  # fmt: skip
    assert outcome.tally.fields() == {
        "evaluated": 4, "skipped": 2, "eval_step": 60, "checkpoint": "ckpt-60",
    }  # fmt: skip
    assert polls.waits == 1  # it slept only when nothing new was there


def test_a_missing_directory_is_waited_for_and_said_once(tmp_path: Path) -> None:
    checkpoints = tmp_path / "job" / "checkpoints"
    polls = Polls([
        lambda: None,
        lambda: checkpoints.mkdir(parents=True),
        lambda: None,
        lambda: write_checkpoint(checkpoints, 5),
    ])  # fmt: skip
    harness = Harness(checkpoints, final_step=5, polls=polls)
    assert harness.run().how == "final"
    assert harness.evaluated == ["ckpt-5"]
    assert harness.logs == [
        f"evaluator: waiting for the checkpoint directory {checkpoints}",
        f"evaluator: waiting for a checkpoint in {checkpoints}",
    ]


def test_a_stop_while_evaluating_finishes_it_then_evaluates_the_newest_once(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "checkpoints"
    write_checkpoint(checkpoints, 10)
    polls = Polls([])
    harness = Harness(checkpoints, final_step=100, polls=polls)

    def sigterm_and_more_checkpoints() -> None:
        polls.set()
        write_checkpoint(checkpoints, 20)
        write_checkpoint(checkpoints, 30)

    harness.during["ckpt-10"] = sigterm_and_more_checkpoints
    harness.during["ckpt-30"] = lambda: write_checkpoint(checkpoints, 40)  # not evaluated
    outcome = harness.run()
    assert outcome.how == "stopped"
    assert harness.evaluated == ["ckpt-10", "ckpt-30"]
    assert outcome.tally.skipped == 1 and outcome.tally.eval_step == 30


def test_a_stop_with_nothing_new_ends_at_once(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    write_checkpoint(checkpoints, 10)
    polls = Polls([])
    polls.actions.append(polls.set)
    harness = Harness(checkpoints, final_step=100, polls=polls)
    outcome = harness.run()
    assert (outcome.how, harness.evaluated) == ("stopped", ["ckpt-10"])
    # Stopped before any checkpoint came: nothing evaluated, still a clean end.
    empty = Harness(tmp_path / "none", final_step=100, polls=Polls([]))
    empty.watch._stop.set()
    assert (empty.run().how, empty.evaluated) == ("stopped", [])


def test_a_checkpoint_that_cannot_be_read_is_retried_at_the_next_poll(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    write_checkpoint(checkpoints, 10)
    polls = Polls([lambda: None])
    harness = Harness(checkpoints, final_step=10, polls=polls)
    harness.failing["ckpt-10"] = 2  # being written: two reads fail, the third works
    assert harness.run().how == "final"
    assert harness.evaluated == ["ckpt-10"] and harness.watch.tally.failures == {}
    assert sum("could not read ckpt-10" in line for line in harness.logs) == 2
    assert "retrying at the next poll" in harness.logs[0]


def test_a_checkpoint_pruned_while_read_gives_way_to_the_newer_one(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    write_checkpoint(checkpoints, 10)
    harness = Harness(checkpoints, final_step=20, polls=Polls([]))

    def pruned() -> None:  # max_to_keep removed it while it was read, a newer one is there
        write_checkpoint(checkpoints, 20)
        for path in checkpoints.glob("ckpt-10.*"):
            path.unlink()

    harness.during["ckpt-10"] = pruned
    harness.failing["ckpt-10"] = 1
    outcome = harness.run()
    assert harness.evaluated == ["ckpt-20"] and outcome.tally.skipped == 0
    assert "it is gone (pruned)" in harness.logs[0]


def test_a_checkpoint_that_stays_unreadable_is_an_error_not_a_loop(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    write_checkpoint(checkpoints, 10)
    harness = Harness(checkpoints, final_step=10, polls=Polls([lambda: None] * 5))
    harness.failing["ckpt-10"] = 99
    with pytest.raises(WatchError, match=r"ckpt-10 .* could not be evaluated 3 times in a row"):
        harness.run()


def test_tf_config_of_the_evaluator_task_only() -> None:
    assert tf_config_problem({}) is None
    assert tf_config_problem({"TF_CONFIG": " "}) is None
    evaluator = {"cluster": {"chief": ["a:1"], "worker": ["b:1"]},
                 "task": {"type": "evaluator", "index": 0}}  # fmt: skip
    assert tf_config_problem({"TF_CONFIG": json.dumps(evaluator)}) is None
    worker = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}
    problem = tf_config_problem({"TF_CONFIG": json.dumps(worker)})
    assert problem is not None and "task type 'worker'" in problem and "'evaluator'" in problem
    assert "not valid JSON" in (tf_config_problem({"TF_CONFIG": "{"}) or "")


def test_the_val_metrics_go_to_the_eval_run_of_the_training_tensorboard_dir() -> None:
    assert default_tensorboard_dir("/w/shapes/checkpoints/") == "/w/shapes/tensorboard/eval"


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (["--watch"], {}, "--watch needs --steps N"),
        (["--watch", "--steps", "0"], {}, "--steps must be a positive integer"),
        (["--watch", "--steps", "5", "--checkpoint", "ckpt-5"], {}, "--checkpoint names one"),
        (["--watch", "--steps", "5", "--poll", "0"], {}, "--poll must be a positive number"),
        (["--watch", "--steps", "5"], {"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, '
                                       '"task": {"type": "worker", "index": 0}}'},
         "task type 'worker'"),
        (["--steps", "5"], {}, "--steps goes with --watch"),
        (["--poll", "2"], {}, "--poll goes with --watch"),
        (["--tensorboard-dir", "tb"], {}, "--tensorboard-dir goes with --watch"),
    ],
)  # fmt: skip
def test_watch_flag_mistakes_are_one_line_and_exit_2(
    flags: list[str],
    env: dict[str, str],
    message: str,
    *,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    argv = ["--task", "worker.examples.shapes:task", "--checkpoint-dir", str(tmp_path), *flags]
    assert evaluate_cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_fatal_error_is_raised_at_once_not_retried(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    write_checkpoint(checkpoints, 10)
    calls: list[str] = []

    def other_keras(name: str) -> Mapping[str, Any]:
        calls.append(name)
        raise evaluate_cli.UsageError("written with job.keras: legacy")

    watch = Watch(
        str(checkpoints), 10, list_checkpoints=available_checkpoints, evaluate=other_keras,
        report=lambda *_: None, log=lambda _: None, stop=Polls([]), poll_seconds=0,
        fatal=(evaluate_cli.UsageError,),
    )  # fmt: skip
    with pytest.raises(evaluate_cli.UsageError):
        watch.run()
    assert calls == ["ckpt-10"]


@pytest.mark.parametrize("watch", [False, True])
def test_checkpoints_of_the_other_keras_are_refused_with_exit_2(
    watch: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    write_checkpoint(tmp_path, 5)
    (tmp_path / "keras.json").write_text('{"keras": "legacy"}')
    flags = ["--watch", "--steps", "5"] if watch else []
    argv = ["--task", "worker.examples.shapes:task", "--checkpoint-dir", str(tmp_path), *flags]
    assert evaluate_cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "written with job.keras: legacy" in err and "TF_USE_LEGACY_KERAS=1" in err
    assert err.count("\n") == 1

"""Preemption on SIGTERM: the flag, the exit code and the loop's decision, without processes.

The first tests need no TensorFlow. The loop tests (marked tf) import worker.loop and drive a
real Loop with fakes for the step, the saver and the cluster-wide vote; the real vote across two
processes is tested in tests/integration/test_worker_preemption.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

import worker
from worker import cli
from worker.config import ConfigError, WorkerConfig
from worker.preemption import Preempted, SigtermFlag
from worker.progress import ProgressWriter

TASK = "worker.examples.shapes:task"


def test_preemption_check_every_defaults_to_10_and_must_be_positive():
    assert cli.parse_config(["--task", TASK, "--steps", "5"], {}).preemption_check_every == 10
    config = cli.parse_config(
        ["--task", TASK, "--steps", "5", "--preemption-check-every", "50"], {}
    )
    assert config.preemption_check_every == 50
    with pytest.raises(ConfigError, match="--preemption-check-every must be a positive integer"):
        cli.parse_config(["--task", TASK, "--steps", "5", "--preemption-check-every", "0"], {})


def test_exit_75_is_documented():
    assert cli.EXIT_PREEMPTED == 75
    assert "75  stopped on SIGTERM after saving a checkpoint; run again to resume" in (
        cli.__doc__ or ""
    )


def test_main_exits_75_when_the_run_was_preempted(monkeypatch):
    def run(config: WorkerConfig, task: Any) -> int:
        raise Preempted(40)

    # Stands in for worker.mirrored, so main() does not import TensorFlow.
    fake_train = types.SimpleNamespace(run=run)
    monkeypatch.setitem(sys.modules, "worker.mirrored", fake_train)
    monkeypatch.setattr(worker, "mirrored", fake_train, raising=False)
    assert cli.main(["--task", TASK, "--steps", "100"]) == cli.EXIT_PREEMPTED


def test_preempted_names_its_step():
    stop = Preempted(40)
    assert stop.step == 40
    assert str(stop) == "stopped on SIGTERM after saving a checkpoint at step 40"


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def send_sigterm_to_self(flag: SigtermFlag, expected: int) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 5
    # Python runs the handler in the main thread at its next check; this loop gives it one.
    while flag.count < expected and time.monotonic() < deadline:
        time.sleep(0.01)


def test_sigterm_only_counts_once_installed(sigterm_restored):
    flag = SigtermFlag()
    flag.install()
    assert not flag.received

    send_sigterm_to_self(flag, 1)
    assert (flag.received, flag.count) == (True, 1)
    # A second SIGTERM (while the checkpoint is saved, say) is counted too, and nothing else.
    send_sigterm_to_self(flag, 2)
    assert flag.count == 2


def test_a_notice_from_tensorflow_counts_as_a_sigterm():
    flag = SigtermFlag()
    flag.set()
    assert flag.received


# The loop, with TensorFlow imported but no strategy, no step function and no files.

if TYPE_CHECKING:  # the fakes stand for these, and mypy holds them to their signatures
    from worker.preemption import Preemption
    from worker.saver import CheckpointSaver
    from worker.summaries import ProfileWindow, Summaries
    from worker.window import Window
else:  # importing the saver and the window imports TensorFlow, which only tf-marked tests need
    ProfileWindow = Summaries = CheckpointSaver = Preemption = Window = object


class FakeValue:
    def numpy(self) -> float:
        return 1.0


class FakeWindow(Window):
    steps = FakeValue()

    def __init__(self) -> None:  # none of the real one's TensorFlow state
        pass

    def read_and_reset(self, with_accuracy: bool) -> tuple[float, None]:
        return 1.0, None


class FakeSaver(CheckpointSaver):
    def __init__(self) -> None:
        self.saves: list[int] = []
        self.saved_step: int | None = None

    def save(self, step: int, *, wait: bool = False) -> None:
        self.saves.append(step)
        self.saved_step = step

    def close(self) -> None:
        pass


class FakeSummaries(Summaries):
    closed = False

    def __init__(self) -> None:  # none of the real one's TensorFlow state
        pass

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeProfile(ProfileWindow):
    def __init__(self) -> None:  # none of the real one's TensorFlow state
        pass

    def before_step(self, step: int) -> None:
        pass

    def ends_at(self, step: int) -> bool:
        return False

    def boundaries(self) -> tuple[int, ...]:
        return ()


class AgreedAt(Preemption):
    """The cluster's decision, scripted: every worker agrees to stop at this step's check."""

    check_every = 10

    def __init__(self, step: int) -> None:
        self.step = step

    def before_step(self) -> None:
        pass

    def agreed_at(self, step: int) -> bool:
        return step == self.step


def make_loop(agreed_at: int, steps: int = 100) -> Any:
    pytest.importorskip("tensorflow")
    from worker.loop import Loop

    config = WorkerConfig(
        task=TASK,
        steps=steps,
        checkpoint_dir="/nonexistent/checkpoints",
        tensorboard_dir="/nonexistent/tensorboard",
        checkpoint_every=20,
        log_every=10,
    )
    return Loop(
        config=config,
        train_step=lambda iterator, n: None,
        window=FakeWindow(),
        saver=FakeSaver(),
        summaries=FakeSummaries(),
        profile=FakeProfile(),
        learning_rate=lambda: None,
        progress=ProgressWriter(None),
        with_accuracy=False,
        preemption=AgreedAt(agreed_at),
    )


@pytest.mark.tf
def test_the_loop_saves_at_the_agreed_step_and_stops():
    loop = make_loop(agreed_at=30)
    with pytest.raises(Preempted) as stopped:
        loop.run(iterator=None, start_step=0)
    assert stopped.value.step == 30
    assert loop.saver.saves == [20, 30]
    fields = loop.progress.fields
    assert (fields["step"], fields["checkpoint_step"], fields["preempted"]) == (30, 30, True)
    assert loop.summaries.closed


@pytest.mark.tf
def test_the_loop_does_not_save_a_step_twice():
    loop = make_loop(agreed_at=40)  # a --checkpoint-every step: already saved
    with pytest.raises(Preempted):
        loop.run(iterator=None, start_step=0)
    assert loop.saver.saves == [20, 40]


@pytest.mark.tf
def test_the_last_step_finishes_normally():
    loop = make_loop(agreed_at=100, steps=100)
    assert loop.run(iterator=None, start_step=0) == 100
    assert loop.saver.saves == [20, 40, 60, 80, 100]
    assert "preempted" not in loop.progress.fields


@pytest.mark.tf
def test_the_vote_is_read_only_on_check_steps():
    pytest.importorskip("tensorflow")
    from worker.preemption import Preemption

    flag = SigtermFlag()
    preemption = Preemption(flag, check_every=5)
    preemption.before_step()
    assert float(preemption.wish.numpy()) == 0.0
    flag.set()
    preemption.before_step()
    assert float(preemption.wish.numpy()) == 1.0
    preemption.votes.assign_add(1.0)  # what the step's reduction adds once a worker wishes
    assert [preemption.agreed_at(step) for step in (4, 5, 6, 10)] == [False, True, False, True]

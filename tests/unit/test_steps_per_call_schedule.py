"""--steps-per-call K / job.steps_per_call: the call schedule, the checks, the flag, and the loop.

The schedule and the checks are pure; the loop test drives worker.loop.Loop with a fake train
step that records each call's length (it needs TensorFlow only to import worker.saver and
worker.window).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.errors import InventoryError
from orchestrator.model.inventory import Job
from tests.fakes.planning import plan_workers
from tests.unit.test_tfconfig_and_plan import inventory
from worker import cli
from worker.config import ConfigError, WorkerConfig, round_up
from worker.progress import ProgressWriter
from worker.schedule import call_end, call_lengths

TASK = "worker.examples.shapes:task"


def test_calls_are_k_long_after_a_first_single_step() -> None:
    # first step alone, then up to the next multiple of K, then K at a time to the end
    assert call_lengths(0, 50, 10, stops=(1, 50), intervals=(10, 20)) == [1, 9, 10, 10, 10, 10]


def test_a_call_ends_at_every_step_the_host_must_see() -> None:
    assert call_end(0, 10, stops=(), intervals=(10,)) == 10
    assert call_end(10, 10, stops=(13,), intervals=(10,)) == 13  # e.g. a profile window edge
    assert call_end(10, 10, stops=(10, 20), intervals=()) == 20  # a stop at the start is past
    assert call_end(3, 10, stops=(), intervals=(10,)) == 10  # a resumed start realigns on K
    assert call_lengths(0, 25, 10, stops=(25,), intervals=(10,)) == [10, 10, 5]  # a short last


def test_k_of_one_is_one_step_per_call() -> None:
    assert call_lengths(7, 12, 1, stops=(8, 12), intervals=(10, 3)) == [1] * 5


def test_worker_flag_and_interval_checks(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    base = ["--task", TASK, "--steps", "100", "--log-every", "10", "--checkpoint-every", "50"]
    config = cli.parse_config([*base, "--steps-per-call", "5"], {})
    assert config.steps_per_call == 5
    assert config.preemption_check_every == 10  # the default 10 is already a multiple of 5
    config = cli.parse_config([*base, "--steps-per-call", "5", "--preemption-check-every", "7"], {})
    assert config.preemption_check_every == 10  # rounded up to a multiple of K
    assert cli.parse_config(base, {}).steps_per_call == 1
    with pytest.raises(ConfigError, match="--checkpoint-every 50 must be a multiple of"):
        cli.parse_config([*base, "--log-every", "20", "--steps-per-call", "20"], {})
    with pytest.raises(ConfigError, match="--log-every 10 must be a multiple of"):
        cli.parse_config([*base, "--checkpoint-every", "40", "--steps-per-call", "4"], {})
    with pytest.raises(ConfigError, match="--eval-every 12 must be a multiple of"):
        cli.parse_config([*base, "--steps-per-call", "5", "--eval-every", "12"], {})
    with pytest.raises(ConfigError, match="--steps-per-call must be a positive integer"):
        cli.parse_config([*base, "--steps-per-call", "0"], {})


def test_round_up() -> None:
    assert [round_up(v, 4) for v in (1, 4, 5, 8)] == [4, 4, 8, 8]


def write(tmp_path: Path, job: str) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(
        textwrap.dedent("""\
        defaults: {connection: local, workdir: ./work}
        hosts:
          - {name: w0, address: localhost, port: 23456}
        job:
        """)
        + textwrap.indent(textwrap.dedent(job), "  ")
    )
    return path


def test_inventory_key_and_its_checks(tmp_path: Path) -> None:
    good = "task: m:f\nsteps: 100\nsteps_per_call: 10\ncheckpoint_every: 50\nseed: 3\n"
    job = load_inventory(write(tmp_path, good)).job
    assert (job.steps_per_call, job.seed) == (10, 3)
    assert load_inventory(write(tmp_path, "task: m:f\nsteps: 9\n")).job.steps_per_call == 1
    with pytest.raises(InventoryError) as caught:
        load_inventory(write(tmp_path, "task: m:f\nsteps: 100\nsteps_per_call: 4\n"))
    problems = " | ".join(map(str, caught.value.problems))
    assert "job.log_every: 10 must be a multiple of steps_per_call (4)" in problems
    assert "(the default log_every is 10)" in problems
    assert "job.checkpoint_every: 100" not in problems  # 100 is a multiple of 4
    with pytest.raises(InventoryError, match=r"applies to job\.task only"):
        load_inventory(write(tmp_path, "script: inv.yaml\nsteps_per_call: 2\n"))


def test_the_flag_reaches_the_worker_only_when_set() -> None:
    job = Job(name="k", task="m:f", steps=100, steps_per_call=10, seed=0)
    argv = plan_workers(inventory(job), "r", {"a": "/w", "b": "/w", "c": "/w"})[0].argv
    assert argv[argv.index("--steps-per-call") + 1] == "10"
    assert argv[argv.index("--seed") + 1] == "0"
    plain = plan_workers(inventory(), "r", {"a": "/w", "b": "/w", "c": "/w"})[0].argv
    assert "--steps-per-call" not in plain and "--seed" not in plain


if TYPE_CHECKING:  # Recorder stands for these, and mypy holds it to their signatures
    from worker.preemption import Preemption
    from worker.saver import CheckpointSaver
    from worker.summaries import ProfileWindow, Summaries
    from worker.window import Window

    class Collaborators(Window, CheckpointSaver, Summaries, ProfileWindow, Preemption):
        def before_step(self, step: int | None = None) -> None: ...  # the profile's and the vote's

else:  # importing the saver and the window imports TensorFlow, which only tf-marked tests need
    Collaborators = object


class Recorder(Collaborators):
    """The host side of the loop's collaborators, recording at which steps each acts."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.logs: list[int] = []
        self.saves: list[int] = []
        self.saved_step: int | None = None
        self.check_every = 10
        self.steps = self  # window.steps.numpy()

    def numpy(self) -> float:
        return 1.0

    def train_step(self, iterator: Any, n: int) -> None:
        self.calls.append(n)

    def read_and_reset(self, with_accuracy: bool) -> tuple[float, None]:
        self.logs.append(sum(self.calls))
        return 1.0, None

    def save(self, step: int, *, wait: bool = False) -> None:
        self.saves.append(step)
        self.saved_step = step

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        pass

    def close(self) -> None:
        pass

    def before_step(self, step: int | None = None) -> None:
        pass

    def ends_at(self, step: int) -> bool:
        return False

    def boundaries(self) -> tuple[int, ...]:
        return (34, 38)  # a profile window of steps 35..38

    def agreed_at(self, step: int) -> bool:
        return False


@pytest.mark.tf
def test_the_loop_runs_k_steps_per_call_and_acts_at_multiples_of_k() -> None:
    pytest.importorskip("tensorflow")
    from worker.loop import Loop

    config = WorkerConfig(
        task=TASK, steps=95, checkpoint_dir="/nonexistent/c", tensorboard_dir="/nonexistent/t",
        checkpoint_every=40, log_every=20, steps_per_call=10, preemption_check_every=10,
    )  # fmt: skip
    fake = Recorder()
    loop = Loop(
        config=config, train_step=fake.train_step, window=fake, saver=fake, summaries=fake,
        profile=fake, learning_rate=lambda: None, progress=ProgressWriter(None),
        with_accuracy=False, preemption=fake,
    )  # fmt: skip
    assert loop.run(iterator=None, start_step=0) == 95
    assert fake.calls == [1, 9, 10, 10, 4, 4, 2, 10, 10, 10, 10, 10, 5]
    assert sum(fake.calls) == 95
    assert fake.logs == [20, 40, 60, 80, 95]
    assert fake.saves == [40, 80, 95]

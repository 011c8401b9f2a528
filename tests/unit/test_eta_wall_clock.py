"""The ETA from wall-clock progress (issue 56): steps made since the first step over the time
since, evaluations and checkpoints included; the latest steps/s only until that window is long
enough to say something."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.engine.observe.eta import WALL_WINDOW_SECONDS, run_eta, wall_rate, worker_eta
from orchestrator.model.vocabulary import WorkerState


@dataclass(frozen=True)
class Seen:
    step: int | None
    steps_per_sec: float | None
    first_step_at: float | None
    reported_at: float | None
    start_step: int | None = 0
    target_steps: int | None = 3000
    state: WorkerState = WorkerState.RUNNING


def test_the_wall_clock_rate_counts_evaluations_and_checkpoints() -> None:
    # 1500 steps in 300 s since the first step: 5 steps/s on the clock, while the training steps
    # alone ran at 10/s (half the time went to evaluations and checkpoints).
    worker = Seen(step=1500, steps_per_sec=10.0, first_step_at=1000.0, reported_at=1300.0)
    assert wall_rate(worker) == 5.0
    assert worker_eta(worker) == 300.0  # 1500 steps left at 5/s, not 150 s at 10/s


def test_a_resumed_attempt_counts_from_its_start_step() -> None:
    worker = Seen(step=1600, steps_per_sec=10.0, first_step_at=0.0, reported_at=100.0,
                  start_step=1100)  # fmt: skip
    assert wall_rate(worker) == 5.0 and worker_eta(worker) == 280.0


def test_before_the_window_the_latest_steps_per_second_stand_in() -> None:
    short = WALL_WINDOW_SECONDS / 2
    worker = Seen(step=100, steps_per_sec=10.0, first_step_at=0.0, reported_at=short)
    assert wall_rate(worker) is None and worker_eta(worker) == 290.0
    unknown = Seen(step=100, steps_per_sec=None, first_step_at=None, reported_at=None)
    assert worker_eta(unknown) is None


def test_the_run_finishes_with_its_slowest_worker() -> None:
    fast = Seen(step=1500, steps_per_sec=10.0, first_step_at=0.0, reported_at=150.0)
    slow = Seen(step=1500, steps_per_sec=10.0, first_step_at=0.0, reported_at=300.0)
    assert run_eta([fast, slow]) == 300.0

"""How long a run still needs: the one estimate `status`, `up`'s live view, the dashboard and the
notifications show. Pure.

A running worker's ETA is its steps left over its wall-clock rate: the steps it made since its
first step over the time since then, evaluations and checkpoints included (a rate of steps
alone ignored them and was 1.5-2x too low, and jumped with every log window); until
WALL_WINDOW_SECONDS have passed since its first step, the latest steps/s its progress file
reports. The run's is the longest of its workers' (the cluster finishes with its slowest
worker). None where nothing can be said: a worker not running (finished, failed, not started
yet), no step, no target or no rate yet, or the target reached; and where the estimate is not
one: past MAX_ETA_SECONDS, or not a finite number (the readers of model/reading.py keep absurd
rates out; this holds whatever a caller passes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

from orchestrator.model.vocabulary import WorkerState

MAX_ETA_SECONDS = 100 * 365 * 86400.0  # a century: beyond it the rate says nothing of the end
# Seconds of training after the first step before the wall-clock rate is trusted: before, one
# evaluation or checkpoint is most of the window.
WALL_WINDOW_SECONDS = 20.0


class StepRate(Protocol):
    """What the ETA reads of a worker (a WorkerStatus): not the progress file (model.answers)."""

    @property
    def state(self) -> WorkerState: ...
    @property
    def step(self) -> int | None: ...
    @property
    def target_steps(self) -> int | None: ...
    @property
    def steps_per_sec(self) -> float | None: ...
    @property
    def start_step(self) -> int | None: ...
    @property
    def first_step_at(self) -> float | None: ...
    @property
    def reported_at(self) -> float | None: ...


def eta_seconds(step: int | None, target: int | None, rate: float | None) -> float | None:
    """Seconds until `step` reaches `target` at `rate` steps/s."""
    if step is None or not target or rate is None or step >= target:
        return None
    if not (rate > 0 and math.isfinite(rate)):  # NaN, negative, infinite: no estimate
        return None
    try:
        seconds = (target - step) / rate
    except OverflowError:  # integers too large for a float
        return None
    return seconds if math.isfinite(seconds) and seconds <= MAX_ETA_SECONDS else None


def wall_rate(worker: StepRate) -> float | None:
    """Steps per wall-clock second since the worker's first step in this attempt, once that is
    WALL_WINDOW_SECONDS ago; None before (or without the times)."""
    step, start = worker.step, worker.start_step or 0
    first, last = worker.first_step_at, worker.reported_at
    if step is None or first is None or last is None or step <= start:
        return None
    elapsed = last - first
    if not (math.isfinite(elapsed) and elapsed >= WALL_WINDOW_SECONDS):
        return None
    return (step - start) / elapsed


def worker_eta(worker: StepRate) -> float | None:
    if worker.state is not WorkerState.RUNNING:
        return None
    rate = wall_rate(worker) or worker.steps_per_sec
    return eta_seconds(worker.step, worker.target_steps, rate)


def run_eta(workers: Iterable[StepRate]) -> float | None:
    """The longest ETA of the workers that have one."""
    etas = [eta for eta in map(worker_eta, workers) if eta is not None]
    return max(etas) if etas else None

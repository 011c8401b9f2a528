"""How long a run still needs: the one estimate `status`, `up`'s live view, the dashboard and the
notifications show. Pure.

A running worker's ETA is its steps left over its latest rate (the steps/s its progress file
reports); the run's is the longest of its workers' (the cluster finishes with its slowest
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


def worker_eta(worker: StepRate) -> float | None:
    if worker.state is not WorkerState.RUNNING:
        return None
    return eta_seconds(worker.step, worker.target_steps, worker.steps_per_sec)


def run_eta(workers: Iterable[StepRate]) -> float | None:
    """The longest ETA of the workers that have one."""
    etas = [eta for eta in map(worker_eta, workers) if eta is not None]
    return max(etas) if etas else None

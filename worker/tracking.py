"""The built-in loop's metrics in the run's MLflow run (job.tracking; docs/tracking.md).

The controller makes one MLflow run per orchestrate run and puts its identity in every worker's
environment (MLFLOW_TRACKING_URI, MLFLOW_RUN_ID). The chief (and the evaluator task) logs what
it writes to TensorBoard (loss, accuracy, val_*, ...) into that run at the step it belongs to,
on a thread of its own: a slow or unreachable tracker never holds up a step, and never fails
the training. MLflow is imported only when MLFLOW_RUN_ID is set, before the first step.

No step twice: MLflow keeps every value logged for a metric, so a step trained again after a
resume from an earlier checkpoint would be a second point at that step. As it starts, the chief
reads once the highest step the run already holds for each metric, and logs only the steps
beyond: the first attempt's values of the steps trained again stay, the new attempt's values
at those steps are not logged (`fresh`).

What a chief had queued and not sent when it was killed is lost (a failed attempt's survivors
are killed at once), as TensorBoard loses what its writer had not flushed: a gap in the curve,
never a step twice. A chief that exits sends what is queued first (`close_all`).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.contract import MLFLOW_RUN_ENV, MLFLOW_URI_ENV
from worker.output import log

CLOSE_LIMIT = 10.0  # seconds the worker's end waits for the values still queued
_OPEN: list[MetricLog] = []  # sent at the process's end (close_all), whatever ended it


def fresh(
    step: int, values: Mapping[str, float | None], logged: Mapping[str, int | None]
) -> dict[str, float]:
    """The values to log at `step`: measured (not None) and past the last step the run holds
    for their metric (`logged`: None, or absent, when it holds none)."""
    out = {}
    for name, value in values.items():
        last = logged.get(name)
        if value is not None and (last is None or step > last):
            out[name] = float(value)
    return out


class MetricLog:
    """Metrics into one MLflow run, in order, from a background thread."""

    def __init__(self, uri: str | None, run_id: str) -> None:
        self.uri = uri
        self.run_id = run_id
        self.logged: dict[str, int | None] = {}  # per metric: the run's last step at our start
        self.jobs: queue.Queue[tuple[int, Mapping[str, float | None], int] | None] = queue.Queue()
        self.failed = False
        # MLflow's import here, before the first step (a few seconds of start-up, the chief's
        # only): on a thread beside TensorFlow it took longer than a short attempt, whose
        # values were then never sent.
        try:
            self.client, self.metric = _client(uri)
        except ImportError as exc:
            self.failed = True
            log(f"worker: mlflow: not installed here ({exc}); metrics not logged to MLflow")
        self.thread = threading.Thread(target=self._loop, name="mlflow-metrics", daemon=True)
        if not self.failed:
            self.thread.start()
            _OPEN.append(self)  # at the process's end (a failed attempt too) what is queued is sent

    @classmethod
    def from_env(cls, is_chief: bool, environ: Mapping[str, str] = os.environ) -> MetricLog | None:
        """The chief's log when the controller gave the workers an MLflow run; else None."""
        run_id = environ.get(MLFLOW_RUN_ENV)
        if not is_chief or not run_id:
            return None
        return cls(environ.get(MLFLOW_URI_ENV), run_id)

    def log(self, step: int, values: Mapping[str, float | None]) -> None:
        if not self.failed:
            self.jobs.put((step, dict(values), int(time.time() * 1000)))

    def close(self, limit: float = CLOSE_LIMIT) -> None:
        """Send what is queued (waiting at most `limit` seconds); later values are dropped."""
        if self.thread.is_alive():
            self.jobs.put(None)
            self.thread.join(limit)

    def _loop(self) -> None:
        try:
            self._read_logged()  # at once: the steps come seconds later, after TensorFlow's start
            while (job := self.jobs.get()) is not None:
                step, values, at = job
                self._log(self.client, self.metric, step, values, at)
        except Exception as exc:  # a tracker's failure never fails the training
            self.failed = True
            log(f"worker: mlflow: metrics no longer logged: {type(exc).__name__}: {exc}")

    def _read_logged(self) -> None:
        """Where the run stood when this worker started: the last step of each metric it has
        (none for a new run, one read per metric for a resumed one)."""
        names = self.client.get_run(self.run_id).data.metrics.keys()
        for name in names:
            history = self.client.get_metric_history(self.run_id, name)
            self.logged[name] = max((m.step for m in history), default=None)

    def _log(
        self, client: Any, metric: Callable[..., Any], step: int,
        values: Mapping[str, float | None], at: int,
    ) -> None:  # fmt: skip
        chosen = fresh(step, values, self.logged)
        if chosen:
            client.log_batch(self.run_id, metrics=[metric(k, v, at, step)
                                                   for k, v in chosen.items()])  # fmt: skip


def close_all(limit: float = CLOSE_LIMIT) -> None:
    """At the worker's end (worker/__main__, which leaves with os._exit, so no atexit runs):
    what every open log still holds is sent, within `limit` seconds in all."""
    deadline = time.monotonic() + limit
    while _OPEN:
        _OPEN.pop().close(max(0.0, deadline - time.monotonic()))


def _client(uri: str | None) -> tuple[Any, Callable[..., Any]]:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri), Metric

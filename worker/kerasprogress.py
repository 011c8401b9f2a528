"""`keras_progress()`: what a `model.fit` script reports, with one line in its callbacks.

    from worker import keras_progress
    model.fit(dataset, epochs=..., callbacks=[backup, keras_progress()])

The callback writes the progress file the controller polls (worker.progress): the step (the
optimizer's own count, so it goes on from where BackupAndRestore resumed), the target, the loss
and accuracy, steps/s, each epoch's validation figures, and the step of each save it sees in the
job's checkpoint directory. With them a `model.fit` job gets what the built-in loop has: `status`
and the dashboard's curves, an ETA, stall detection and goodput; and with job.tracking the
chief logs the same figures into the run's MLflow run. Without the controller
(ORCHESTRATE_PROGRESS_FILE unset) it does nothing.

The saves it sees are files that changed under the job's checkpoint directory: the chief's own
at once; another worker sees the chief's in a shared directory only as they land, which can be
after its own epoch ended (its checkpoint step then lags, or misses the last save).

It works with tf.keras 2 (tf_keras, `job.keras: legacy`) and Keras 3 (`job.keras: jax`, or Keras 3
on one host): its base class is the Keras of the job's setting (worker.kerasflavor), or the one
passed in `keras=`. Neither Keras nor TensorFlow is imported before it is called.
"""

from __future__ import annotations

import os
import time
from types import ModuleType
from typing import Any

from orchestrator.contract import (
    ACCURACY,
    CHECKPOINT_DIR_ENV,
    CHECKPOINT_STEP,
    LOSS,
    START_STEP,
    STEP,
    STEPS_PER_SEC,
    TARGET_STEPS,
    TARGET_STEPS_ENV,
    VAL_ACCURACY,
    VAL_LOSS,
)
from worker.helpers import is_chief
from worker.progress import script_writer
from worker.tracking import MetricLog

TRACKED = (LOSS, ACCURACY, VAL_LOSS, VAL_ACCURACY)  # what the chief logs into MLflow
WRITE_EVERY = 1.0  # seconds between two writes during an epoch: a file write per batch is waste


def keras_progress(keras: ModuleType | None = None, every: float = WRITE_EVERY) -> Any:
    """A Keras callback reporting `model.fit`'s progress to orchestrate (see the module)."""
    if keras is None:
        from worker.kerasflavor import keras as job_keras

        keras = job_keras()

    class KerasProgress(keras.callbacks.Callback):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.reporter = FitReporter(every)

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.reporter.batch(optimizer_step(self.model), logs or {}, self.params)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.reporter.epoch(optimizer_step(self.model), logs or {})

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            self.reporter.epoch(optimizer_step(self.model), logs or {})

    return KerasProgress()


def optimizer_step(model: Any) -> int | None:
    """The optimizer's update count: the global step, restored with it by BackupAndRestore."""
    try:
        return int(model.optimizer.iterations.numpy())
    except (AttributeError, TypeError, ValueError):
        return None


def metric(logs: dict[str, Any], name: str, prefix: str = "") -> float | None:
    """`loss`, or the first `*accuracy` key (accuracy, sparse_categorical_accuracy, acc)."""
    if name == LOSS:
        value = logs.get(prefix + "loss")
    else:
        keys = [k for k in logs if k.startswith(prefix) and k.endswith(("accuracy", "acc"))]
        keys = [k for k in keys if prefix or not k.startswith("val_")]
        value = logs[keys[0]] if keys else None
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


class FitReporter:
    """The callback's bookkeeping, free of Keras: what to write after a batch or an epoch."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.writer = script_writer()
        self.last_write = 0.0
        self.rate_from: tuple[int, float] | None = None  # (step, time) of the rate's start
        self.started = False
        self.saves_seen = newest_save(os.environ.get(CHECKPOINT_DIR_ENV))
        # The run's MLflow run (job.tracking): the chief logs what it reports, as the built-in
        # loop does, at the optimizer's step (no step twice after a resume: worker.tracking).
        self.tracking = MetricLog.from_env(is_chief()) if self.writer is not None else None
        self.tracked: dict[str, int] = {}  # per figure, the last step logged to MLflow

    def batch(self, step: int | None, logs: dict[str, Any], params: dict[str, Any]) -> None:
        if self.writer is None or step is None:
            return
        now = time.monotonic()
        if not self.started:  # the first batch of this process: it began one step before
            self.started = True
            self.rate_from = (step, now)
            self.writer.write(**{START_STEP: step - 1, STEP: step, TARGET_STEPS: target(params)})
            return
        if now - self.last_write >= self.every:
            self.write(step, logs, now)

    def epoch(self, step: int | None, logs: dict[str, Any]) -> None:
        if self.writer is None or step is None:
            return
        now = time.monotonic()
        fields = {VAL_LOSS: metric(logs, LOSS, "val_"), VAL_ACCURACY: metric(logs, "", "val_")}
        saved = newest_save(os.environ.get(CHECKPOINT_DIR_ENV))
        if saved is not None and saved != self.saves_seen:  # BackupAndRestore, ModelCheckpoint
            self.saves_seen = saved
            fields[CHECKPOINT_STEP] = step
        self.write(step, logs, now, **{k: v for k, v in fields.items() if v is not None})

    def write(self, step: int, logs: dict[str, Any], now: float, **extra: Any) -> None:
        assert self.writer is not None
        fields: dict[str, Any] = {STEP: step, **extra}
        loss, accuracy = metric(logs, LOSS), metric(logs, ACCURACY)
        if loss is not None:
            fields[LOSS] = loss
        if accuracy is not None:
            fields[ACCURACY] = accuracy
        if self.rate_from is not None and now > self.rate_from[1] and step > self.rate_from[0]:
            fields[STEPS_PER_SEC] = (step - self.rate_from[0]) / (now - self.rate_from[1])
            self.rate_from = (step, now)
        self.writer.write(**fields)
        self.last_write = now
        self.track(step, fields)

    def track(self, step: int, fields: dict[str, Any]) -> None:
        """Each figure into the MLflow run once per step: the end of training repeats the last
        epoch's step, and an epoch's end adds its validation figures at a batch's step."""
        if self.tracking is None:
            return
        values = {name: fields[name] for name in TRACKED
                  if name in fields and self.tracked.get(name, -1) < step}  # fmt: skip
        self.tracked.update(dict.fromkeys(values, step))
        if values:
            self.tracking.log(step, values)


def target(params: dict[str, Any]) -> int | None:
    """The job's `steps:` when it sets one, else fit's epochs x steps per epoch."""
    from_job = os.environ.get(TARGET_STEPS_ENV, "")
    if from_job.isdigit():
        return int(from_job)
    epochs, steps = params.get("epochs"), params.get("steps")
    return epochs * steps if isinstance(epochs, int) and isinstance(steps, int) else None


def newest_save(directory: str | None) -> float | None:
    """The newest modification time under the checkpoint directory (two levels: BackupAndRestore
    writes into a folder of its own), None without one."""
    if not directory or not os.path.isdir(directory):
        return None
    newest = None
    for root, folders, files in os.walk(directory):
        depth = root[len(directory) :].count(os.sep)
        if depth >= 2:
            folders[:] = []
        for name in files:
            try:
                mtime = os.stat(os.path.join(root, name)).st_mtime
            except OSError:
                continue
            newest = mtime if newest is None else max(newest, mtime)
    return newest

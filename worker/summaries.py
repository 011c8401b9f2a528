"""TensorBoard output of a run: scalars, sample inputs, and a trace of a few steps.

Written by the chief only; the other workers get a writer that drops everything, so the loop calls
the same methods on every worker. Values that need the whole cluster (loss, accuracy) are reduced
by collectives inside the step function on every worker before they get here: nothing in this
module runs a collective, so the chief doing more here than the others cannot desynchronise them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from worker import images
from worker.output import log
from worker.tracking import MetricLog

SUMMARY_FLUSH_MILLIS = 10_000
SAMPLE_IMAGES = 16  # tiled 4x4 into the "inputs/grid" image
TRACE_NAME = "train_step"


def current_learning_rate(optimizer: Any, fallback: float | None) -> float | None:
    """The optimizer's learning rate now; Keras 3 evaluates a schedule at the current iteration.

    Falls back to the task's declared value for optimizers without a readable learning_rate.
    """
    try:
        return float(optimizer.learning_rate)
    except (AttributeError, TypeError, ValueError):
        return fallback


class Summaries:
    def __init__(self, directory: str, is_chief: bool) -> None:
        self.directory = directory
        self.is_chief = is_chief
        if is_chief:
            self._writer = tf.summary.create_file_writer(
                directory, flush_millis=SUMMARY_FLUSH_MILLIS
            )
        else:
            self._writer = tf.summary.create_noop_writer()
        # The run's MLflow run (job.tracking), the chief's scalars only, as TensorBoard's.
        self._tracking = MetricLog.from_env(is_chief)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        """One scalar per name; None values (nothing measured yet) are skipped."""
        with self._writer.as_default(step=step):
            for name, value in values.items():
                if value is not None:
                    tf.summary.scalar(name, value)
        if self._tracking is not None:
            self._tracking.log(step, values)

    def inputs(self, dataset: tf.data.Dataset, step: int) -> None:
        """The first examples of the task's dataset as "inputs/sample" and "inputs/grid".

        Taken from the undistributed dataset, not the training iterator: reading from that would
        consume a batch on the chief only and put it out of step with the other workers.
        Silently nothing when the features are not single images.
        """
        if not self.is_chief or not _has_image_features(dataset.element_spec):
            return
        examples = list(dataset.take(SAMPLE_IMAGES).as_numpy_iterator())
        if not examples:
            return
        pictures = images.to_unit_range(np.stack([example[0] for example in examples]))
        labels = _labels(dataset.element_spec, examples)
        _, columns = images.grid_shape(len(examples))
        with self._writer.as_default(step=step):
            tf.summary.image(
                "inputs/sample",
                pictures[:1],
                max_outputs=1,
                description=_describe(labels and labels[:1], 1, "The first example"),
            )
            tf.summary.image(
                "inputs/grid",
                images.tile(pictures)[np.newaxis],
                max_outputs=1,
                description=_describe(labels, columns, f"The first {len(examples)} examples"),
            )

    def trace_on(self) -> None:
        # TF 2.21: profiler_outdir belongs to trace_on; trace_export only warns about it.
        tf.summary.trace_on(graph=True, profiler=True, profiler_outdir=self.directory)

    def trace_export(self, step: int) -> None:
        with self._writer.as_default(step=step), _without_double_stop_warning():
            tf.summary.trace_export(name=TRACE_NAME, step=step)
        self._writer.flush()

    def flush(self) -> None:
        """Now, not within SUMMARY_FLUSH_MILLIS: the evaluator writes one point per checkpoint."""
        self._writer.flush()

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
        if self._tracking is not None:
            self._tracking.close()


def _has_image_features(element_spec: Any) -> bool:
    if not isinstance(element_spec, tuple) or not element_spec:
        return False
    spec = element_spec[0]
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None:
        return False
    numeric = spec.dtype.is_integer or spec.dtype.is_floating
    return images.is_image_shape(spec.shape.as_list(), numeric)


def _labels(element_spec: Any, examples: list[Any]) -> list[Any] | None:
    """Class indices to print beside the images; None unless the labels are integer scalars."""
    if len(element_spec) < 2:
        return None
    spec = element_spec[1]
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank != 0 or not spec.dtype.is_integer:
        return None
    return [int(example[1]) for example in examples]


def _describe(labels: list[Any] | None, columns: int, what: str) -> str:
    text = f"{what} of the task's dataset, in dataset order (before shuffling)."
    if labels is None:
        return text
    return f"{text} Labels, laid out like the images:\n\n{images.labels_table(labels, columns)}"


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


@contextlib.contextmanager
def _without_double_stop_warning() -> Iterator[None]:
    """Hides one spurious warning of TF 2.21's trace_export.

    With profiler=True, trace_export stops the profiler and then calls trace_off(), which stops it
    again and logs "Error while stopping profiler: ... No profiler is running" although the
    profile was written. The warning would send users looking for a problem that is not there.
    """
    logger = logging.getLogger("tensorflow")
    drop = _DropMessage("Error while stopping profiler")
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


class ProfileWindow:
    """--profile-steps START END on the chief: trace on before START, export after END."""

    def __init__(
        self, steps: tuple[int, int] | None, summaries: Summaries, first: int, last: int
    ) -> None:
        self._summaries = summaries
        self._steps = None
        if steps is None or not summaries.is_chief:
            return
        start, end = steps
        if start < first or end > last:
            log(
                f"worker: --profile-steps {start} {end} lies outside this run's steps "
                f"{first}..{last}; not profiling"
            )
            return
        self._steps = steps

    def before_step(self, step: int) -> None:
        if self._steps is not None and step == self._steps[0]:
            self._summaries.trace_on()

    def boundaries(self) -> tuple[int, ...]:
        """Steps a call must end on: the one before START (the trace starts between calls) and
        END (the export follows it)."""
        return () if self._steps is None else (self._steps[0] - 1, self._steps[1])

    def ends_at(self, step: int) -> bool:
        return self._steps is not None and step == self._steps[1]

    def export(self, step: int) -> None:
        """Call after step END has finished on the device, or the trace misses its ops."""
        self._summaries.trace_export(step)
        start, end = self._steps or (step, step)
        log(f"worker: profile of steps {start}..{end} written to {self._summaries.directory}")

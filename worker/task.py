"""The TrainingTask contract between a user's code and the worker's training loop.

A user writes a function (named on the command line as MODULE:FUNCTION) that returns a
TrainingTask. The task holds *factories*, not objects: the worker must create the
MultiWorkerMirroredStrategy before any other TensorFlow operation, and the model and optimizer must
be built inside the strategy's scope. So importing the user's module and calling FUNCTION() must not
run TensorFlow operations (importing tensorflow is fine); the factories are called later, by the
worker, at the right moment.

TensorFlow and Keras are imported lazily here, so `import worker.task` stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import keras
    import tensorflow as tf


class TaskError(ValueError):
    """The task named on the command line cannot be loaded or is not a valid TrainingTask."""


def adam() -> keras.optimizers.Optimizer:
    """The default optimizer factory: Adam with Keras's default learning rate, 1e-3, from the
    Keras the job asks for (job.keras: Keras 3, or Keras 2 under legacy)."""
    from worker.kerasflavor import keras

    return keras().optimizers.Adam(learning_rate=1e-3)


def sparse_categorical_crossentropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """The default loss: one cross-entropy value per example, from logits and integer labels.

    Per example (no reduction) because under a distribution strategy the loop averages over the
    GLOBAL batch with tf.nn.compute_average_loss; a mean over the local batch would be wrong.
    """
    from worker.kerasflavor import keras

    return keras().losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


@dataclass(frozen=True)
class TrainingTask:
    """What to train.

    model: builds a keras.Model (called inside strategy.scope()), of the Keras the job asks for:
        `worker.keras()` or `tf.keras` (Keras 2 under job.keras: legacy, else Keras 3).
    dataset: builds an UNBATCHED tf.data.Dataset of (features, label) examples; the worker shards,
        shuffles, repeats and batches it.
    optimizer: builds a Keras optimizer (called inside strategy.scope()).
    loss: per-example loss(labels, logits) -> Tensor of shape [batch].
    learning_rate: only for the TensorBoard summaries; it does not configure the optimizer.
    num_classes: if set, the model's last output dimension is checked against it.
    shuffle_buffer: examples in the shuffle buffer of each worker's input pipeline.
    eval_dataset: builds a FINITE, UNBATCHED tf.data.Dataset of (features, label) examples to
        evaluate on (val_loss, val_accuracy): after the last step, every --eval-every steps, and
        in `python -m worker.evaluate`. Every example counts once, on whichever worker; like
        `dataset` it must give the same examples in the same order each time it is built.

    Under job.keras: jax (worker.jaxloop: Keras 3 on JAX, no TensorFlow on the hosts) `dataset`
    and `eval_dataset` return a (features, labels) pair of NumPy arrays instead, one example
    per row, the same each time (a tf.data.Dataset there is an error that says so); the worker
    shards, shuffles, repeats and batches them itself. `model`, `optimizer` and `loss` are
    Keras 3's (`worker.keras()` is), `loss` written with keras.ops, not tf. worker.examples.shapes
    returns either, by KERAS_BACKEND.
    """

    model: Callable[[], keras.Model]
    dataset: Callable[[], tf.data.Dataset]
    optimizer: Callable[[], keras.optimizers.Optimizer] = adam
    loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] = sparse_categorical_crossentropy
    learning_rate: float | None = None
    num_classes: int | None = None
    shuffle_buffer: int = 1024
    eval_dataset: Callable[[], tf.data.Dataset] | None = None

    def __post_init__(self) -> None:
        for name in ("model", "dataset", "optimizer", "loss", "eval_dataset"):
            if name == "eval_dataset" and self.eval_dataset is None:
                continue
            if not callable(getattr(self, name)):
                raise TaskError(
                    f"TrainingTask.{name} must be callable, got {getattr(self, name)!r}"
                )
        if self.num_classes is not None and self.num_classes < 1:
            raise TaskError(f"TrainingTask.num_classes must be positive, got {self.num_classes}")
        if self.shuffle_buffer < 1:
            raise TaskError(
                f"TrainingTask.shuffle_buffer must be positive, got {self.shuffle_buffer}"
            )


def load_task(spec: str) -> TrainingTask:
    """Imports MODULE, calls FUNCTION() and checks it returned a TrainingTask.

    Every failure becomes a TaskError whose message names the spec and the cause, so the command
    line can report it in one line.
    """
    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an ImportError, or any error raised by the module's top level
        raise TaskError(f"cannot import task {spec!r}: {exc}") from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise TaskError(
            f"cannot import task {spec!r}: {module_name} has no function {function_name!r}"
        )
    try:
        task: Any = function()
    except Exception as exc:
        raise TaskError(f"task {spec!r} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(task, TrainingTask):
        raise TaskError(f"task {spec!r} returned {type(task).__name__}, not a TrainingTask")
    return task

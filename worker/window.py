"""The metrics window: loss and accuracy summed on the device between two log steps, in
sum-on-read variables (local_sum) that the stop vote (worker.preemption.Preemption) uses too."""

from __future__ import annotations

import tensorflow as tf


def local_sum(name: str, dtype: tf.DType) -> tf.Variable:
    """A sum each replica adds to locally; reading it (between steps, on every worker at the same
    step) sums the replicas' copies across workers in one collective. Keras metrics work so."""
    return tf.Variable(
        tf.zeros((), dtype),
        trainable=False,
        name=name,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )


class Window:
    """Loss and accuracy summed over the steps since the last log, kept on the device.

    Each replica adds its own share to sum-on-read variables inside the step, so a step's only
    collective is the gradients' all-reduce (the minimal loop also reduces its loss every step);
    reading the sums on a log step (every worker at the same step) adds them up across workers.
    The host fetches values only on log steps; what is logged is the mean over the whole window,
    not just the last batch. Without a strategy (unit tests) the sums are plain variables.
    """

    def __init__(self, global_batch: int, strategy: tf.distribute.Strategy | None = None) -> None:
        self.global_batch = global_batch
        self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.correct_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.steps = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        if strategy is not None:
            with strategy.scope():
                self.loss_sum = local_sum("loss_sum", tf.float64)
                self.correct_sum = local_sum("correct_sum", tf.float64)

    def add(self, loss: tf.Tensor, correct: tf.Tensor) -> None:
        self.loss_sum.assign_add(tf.cast(loss, tf.float64))
        self.correct_sum.assign_add(tf.cast(correct, tf.float64))

    def read_and_reset(self, with_accuracy: bool) -> tuple[float | None, float | None]:
        """(mean loss, accuracy) over the window; (None, None) if no step was taken."""
        steps = float(self.steps.numpy())
        if steps == 0:
            return None, None
        loss = float(self.loss_sum.numpy()) / steps
        accuracy = float(self.correct_sum.numpy()) / (steps * self.global_batch)
        for variable in (self.loss_sum, self.correct_sum, self.steps):
            variable.assign(0.0)
        return loss, accuracy if with_accuracy else None

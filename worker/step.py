"""One training step, compiled: a replica's gradient step, and the tf.function that runs one
step or K of them per call on every replica of the strategy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from worker.preemption import Preemption
from worker.sharded_eval import correct_mask
from worker.task import TrainingTask
from worker.trainstate import TrainState
from worker.window import Window


def gradient_step(
    state: TrainState,
    task: TrainingTask,
    window: Window,
    with_accuracy: bool,
    batch: tuple[Any, tf.Tensor],
) -> None:
    """One replica's step (inside strategy.run): the loss over the global batch, its gradients
    applied, and the replica's loss and correct count added to the window."""
    model, (features, labels) = state.model, batch
    with tf.GradientTape() as tape:
        logits = model(features, training=True)
        per_example = tf.cast(task.loss(labels, logits), tf.float32)
        # Divide by the GLOBAL batch: the optimizer sums gradients over replicas.
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=window.global_batch)
        if model.losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
    gradients = tape.gradient(loss, model.trainable_variables)
    state.optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    correct = tf.reduce_sum(correct_mask(labels, logits)) if with_accuracy else tf.constant(0.0)
    # Local sums only: the only collective of a step is the gradients' all-reduce; the window
    # is summed across workers when the host reads it.
    window.add(loss, correct)


def make_train_step(
    strategy: tf.distribute.Strategy,
    state: TrainState,
    task: TrainingTask,
    window: Window,
    with_accuracy: bool,
    *,
    preemption: Preemption,
    steps_per_call: int = 1,
) -> Callable[[Any, int], None]:
    """A callable (iterator, n) running n steps on every replica, adding each replica's loss,
    correct count and stop wish to the window's and preemption's sum-on-read variables.

    With steps_per_call 1 it is one tf.function per step (n is always 1). Above 1 the steps run
    in a loop inside one tf.function (n from 1 to K, a tensor, so every n shares one trace): each
    iteration is exactly the body of the one-step function, so the numerics are the same, and the
    Python dispatch and the host-side call overhead are paid once per call instead of per step.
    """

    def step_fn(features: Any, labels: tf.Tensor) -> None:
        gradient_step(state, task, window, with_accuracy, (features, labels))
        preemption.votes.assign_add(preemption.wish.read_value())

    def one_step(iterator: Any) -> None:
        strategy.run(step_fn, args=next(iterator))
        window.steps.assign_add(1.0)

    if steps_per_call == 1:
        single = tf.function(one_step)

        def train_step(iterator: Any, n: int) -> None:
            assert n == 1, n
            single(iterator)

        return train_step

    @tf.function
    def train_steps(iterator: Any, n: tf.Tensor) -> None:
        # autograph turns this into a tf.while_loop: one graph, n iterations, no Python between.
        for _ in tf.range(n):
            one_step(iterator)

    def train_many(iterator: Any, n: int) -> None:
        assert 1 <= n <= steps_per_call, n
        train_steps(iterator, tf.constant(n, dtype=tf.int32))

    return train_many

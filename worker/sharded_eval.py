"""Evaluation over a whole finite dataset, exact and in lockstep on every worker.

Each input pipeline (one per worker) takes its shard of the eval examples, each with weight 1, and
pads it with copies of the dataset's first example of weight 0 up to the same number of batches on
every worker. So every worker runs the same number of steps (the collectives stay in lockstep, even
when the shards differ in size), no example is dropped and none counts twice: summing loss x
weight, correct x weight and weight over all replicas gives the exact example-weighted mean over
the dataset. A single process (worker.evaluate, the default strategy) runs the same code with one
pipeline and agrees with the cluster up to float rounding.

val_loss is the task's data loss only: regularization losses (model.losses) belong to training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from orchestrator.contract import VAL_ACCURACY, VAL_LOSS
from worker.task import TaskError, TrainingTask

WEIGHT = 1.0  # of a real example; padding examples weigh 0


@dataclass(frozen=True)
class EvalResult:
    loss: float
    accuracy: float | None  # None when the labels are not class indices
    examples: int

    def as_dict(self) -> dict[str, Any]:
        return {VAL_LOSS: self.loss, VAL_ACCURACY: self.accuracy, "examples": self.examples}


def steps_for(examples: int, pipelines: int, replicas_per_pipeline: int, batch: int) -> int:
    """Steps that cover the largest shard, when every replica takes `batch` examples a step.

    `dataset.shard(pipelines, i)` gives pipeline i the examples i, i + pipelines, ...: the largest
    shard has ceil(examples / pipelines) of them, and a step consumes replicas_per_pipeline
    batches of each pipeline.
    """
    largest_shard = math.ceil(examples / pipelines)
    return math.ceil(largest_shard / (replicas_per_pipeline * batch))


def count_examples(dataset: tf.data.Dataset) -> int:
    """The number of examples of a finite dataset; counted by reading it when tf.data cannot tell.

    Every worker counts the same deterministic dataset, so every worker arrives at the same
    number of steps without a collective.
    """
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise TaskError(
            "TrainingTask.eval_dataset is infinite (it repeats); evaluation needs a finite "
            "dataset: drop the .repeat()"
        )
    if cardinality == tf.data.UNKNOWN_CARDINALITY:
        cardinality = int(dataset.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))
    if cardinality == 0:
        raise TaskError("TrainingTask.eval_dataset has no examples")
    return cardinality


def _weighted(weight: float) -> Any:
    def add_weight(features: Any, label: Any) -> Any:
        return features, label, tf.constant(weight, tf.float32)

    return add_weight


class Evaluator:
    """Evaluates `model` over the task's eval dataset under `strategy`; call evaluate() on every
    worker at the same steps (it runs collectives: one reduction per step)."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        model: Any,
        task: TrainingTask,
        dataset: tf.data.Dataset,
        per_replica_batch: int,
    ) -> None:
        self.strategy = strategy
        self.examples = count_examples(dataset)
        self.with_accuracy = has_integer_labels(dataset.element_spec)
        self.steps = 0
        padding = dataset.take(1).map(_weighted(0.0)).repeat()

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            pipelines = context.num_input_pipelines
            replicas = context.num_replicas_in_sync // pipelines
            # The same on every pipeline: computed from the whole dataset's size.
            self.steps = steps_for(self.examples, pipelines, replicas, per_replica_batch)
            return (
                dataset.shard(pipelines, context.input_pipeline_id)
                .map(_weighted(WEIGHT))
                .concatenate(padding)
                .batch(per_replica_batch, drop_remainder=True)
                .take(self.steps * replicas)
                .prefetch(tf.data.AUTOTUNE)
            )

        self.dataset = strategy.distribute_datasets_from_function(dataset_fn)
        # Sums of loss x weight, correct x weight and weight, in float64 across steps.
        self.totals = tf.Variable(tf.zeros([3], tf.float64), trainable=False, name="eval_totals")
        self._step = self._make_step(model, task)

    def _make_step(self, model: Any, task: TrainingTask) -> Any:
        strategy, with_accuracy = self.strategy, self.with_accuracy

        def step_fn(features: Any, labels: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
            logits = model(features, training=False)
            per_example = tf.cast(task.loss(labels, logits), tf.float32)
            loss_sum = tf.reduce_sum(per_example * weights)
            correct = (
                tf.reduce_sum(correct_mask(labels, logits) * weights)
                if with_accuracy
                else tf.constant(0.0)
            )
            return tf.stack([loss_sum, correct, tf.reduce_sum(weights)])

        @tf.function
        def eval_step(iterator: Any) -> None:
            per_replica = strategy.run(step_fn, args=next(iterator))
            totals = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            self.totals.assign_add(tf.cast(totals, tf.float64))

        return eval_step

    def evaluate(self) -> EvalResult:
        self.totals.assign(tf.zeros([3], tf.float64))
        iterator = iter(self.dataset)
        for _ in range(self.steps):
            self._step(iterator)
        loss_sum, correct, count = (float(value) for value in self.totals.numpy())
        if round(count) != self.examples:  # a broken invariant, not a user mistake
            raise RuntimeError(f"evaluated {count} examples, expected {self.examples}")
        return EvalResult(
            loss=loss_sum / count,
            accuracy=correct / count if self.with_accuracy else None,
            examples=self.examples,
        )


def has_integer_labels(element_spec: Any) -> bool:
    """Accuracy (argmax of the logits equals the label) only makes sense for class indices."""
    label_spec = element_spec[1]
    return isinstance(label_spec, tf.TensorSpec) and label_spec.dtype.is_integer


def correct_mask(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """1.0 where argmax(logits) equals the label, else 0.0; one value per example."""
    predicted = tf.argmax(logits, axis=-1, output_type=tf.int64)
    actual = tf.cast(tf.reshape(labels, tf.shape(predicted)), tf.int64)
    return tf.cast(tf.equal(predicted, actual), tf.float32)

"""The built-in loop's data under `job.keras: jax`: each process's shard of the task's NumPy
arrays, repeated and shuffled, as a function of the step; and the eval shard, padded.

NumPy only. The batch of a step depends on the step alone (the epoch it falls in seeds the
shuffle), so a run resumed at step S feeds exactly the batches an uninterrupted run fed after
S: no iterator state needs saving with the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from worker.task import TaskError

SHUFFLE_SEED = 20240611  # any fixed number: every run, and every resumed run, shuffles alike


def arrays_of(made: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The (features, labels) NumPy arrays a task's factory returned under keras: jax, checked;
    anything else (a tf.data.Dataset above all) is a TaskError that says what to return."""
    if type(made).__module__.startswith("tensorflow"):
        raise TaskError(
            f"TrainingTask.{what} returned a tf.data.Dataset, but job.keras: jax runs without "
            "TensorFlow: return a (features, labels) pair of NumPy arrays, one example per row "
            "(worker.examples.shapes does so when KERAS_BACKEND is jax)"
        )
    if not (isinstance(made, tuple | list) and len(made) == 2):
        raise TaskError(f"TrainingTask.{what} returned {type(made).__name__}; under job.keras: "
                        "jax it must return a (features, labels) pair of NumPy arrays")  # fmt: skip
    features, labels = (np.asarray(part) for part in made)
    if features.ndim < 1 or labels.ndim < 1 or len(features) != len(labels) or not len(labels):
        raise TaskError(
            f"TrainingTask.{what} returned {len(features)} features and {len(labels)} labels: "
            "expected as many of each, at least one"
        )
    return features, labels


def shard(count: int, process: int, processes: int) -> np.ndarray:
    """The example indices of this process: every processes-th from its own."""
    return np.arange(process, count, processes)


def local_batch(global_batch: int, processes: int) -> int:
    if global_batch % processes:
        raise TaskError(f"the batch size {global_batch} does not split over {processes} workers")
    return global_batch // processes


def batch_indices(step: int, examples: int, batch: int, process: int) -> np.ndarray:
    """Positions (into this process's shard of `examples`) of the batch that trains step+1:
    epoch by epoch, each a fresh permutation, the remainder of an epoch dropped."""
    per_epoch = examples // batch
    if per_epoch == 0:
        raise TaskError(f"a worker's shard holds {examples} examples, fewer than its batch {batch}")
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([SHUFFLE_SEED, epoch, process]).permutation(examples)
    return order[index * batch : (index + 1) * batch]


def train_batches(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    start_step: int,
    batch: int,
    process: int,
    processes: int,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """This process's batches from the one after start_step on, forever."""
    mine = shard(len(labels), process, processes)
    x, y = features[mine], labels[mine]
    step = start_step
    while True:
        picked = batch_indices(step, len(y), batch, process)
        yield x[picked], y[picked]
        step += 1


def eval_batches(
    features: np.ndarray, labels: np.ndarray, batch: int, process: int, processes: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """This process's eval shard in batches of `batch`, with weights: 1 for its examples, 0 for
    the padding that gives every process the same number of full batches (the batches are
    collective). Every example counts once, on one process."""
    mine = shard(len(labels), process, processes)
    largest = -(-len(labels) // processes)  # the first process's shard: the largest
    steps = max(1, -(-largest // batch))
    size = steps * batch
    padded = np.zeros(size, dtype=np.int64)
    padded[: len(mine)] = mine
    weights = np.zeros(size, dtype=np.float32)
    weights[: len(mine)] = 1.0
    return [
        (features[padded[i : i + batch]], labels[padded[i : i + batch]], weights[i : i + batch])
        for i in range(0, size, batch)
    ]

"""The bundled shapes task, paced: each example its input pipeline reads waits PACE_S first (a
tf.py_function in the dataset; each worker reads every example, its shard and the others'), so
two workers with the default batch of 64 train about 25 steps a second at most.

For the tests whose run must still be training when they act (`down`, `down --save`, `status`
while it trains) and read it through the CLI meanwhile, which takes seconds on the busy machine
of the lanes: flat out, the run took both cores all that time from the other lanes' tests.
The waiting costs no CPU; the steps are the real ones.

    job: {task: tests.tasks.paced:task, env: {PYTHONPATH: <the checkout>}, ...}
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import numpy as np

from worker.examples import shapes
from worker.task import TrainingTask

if TYPE_CHECKING:
    import tensorflow as tf

PACE_S = 0.0005


def wait_a_little(x: np.ndarray) -> np.ndarray:
    time.sleep(PACE_S)
    return x


def build_dataset() -> tf.data.Dataset:
    import tensorflow as tf

    def paced(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        (waited,) = tf.py_function(wait_a_little, [x], [x.dtype])
        waited.set_shape(x.shape)
        return waited, y

    dataset = shapes.build_dataset()
    assert isinstance(dataset, tf.data.Dataset)  # the TensorFlow loop's, not keras: jax's
    return dataset.map(paced)


def task() -> TrainingTask:
    # A small shuffle buffer: the first batch waits for the buffer to fill, paced too.
    return dataclasses.replace(shapes.task(), dataset=build_dataset, shuffle_buffer=64)

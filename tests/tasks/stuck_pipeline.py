"""A tiny task whose input pipeline blocks on one worker: a tf.py_function in its dataset waits
forever once the second worker's first attempt has read BLOCK_AFTER examples. Its main thread
then waits in the compiled step (the batch never comes), its peer in the all-reduce.

    job: {task: tests.tasks.stuck_pipeline:task, ...}
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING

import numpy as np

from worker.task import TrainingTask

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

BLOCK_AFTER = int(os.environ.get("BLOCK_AFTER", "120"))
_read = [0]


def build_model() -> keras.Model:
    import keras

    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(2)], name="tiny")


def wait_here(x: np.ndarray) -> np.ndarray:
    _read[0] += 1
    if _read[0] > BLOCK_AFTER and _blocks():
        threading.Event().wait()  # forever: only the stall watch ends it
    return x


def _blocks() -> bool:
    index = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index")
    return index == 1 and "/attempt-0/" in os.environ.get("ORCHESTRATE_RUN_DIR", "")


def build_dataset() -> tf.data.Dataset:
    import tensorflow as tf

    rng = np.random.default_rng(3)
    features = rng.normal(size=(64, 4)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int32)

    def through_python(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        (x,) = tf.py_function(wait_here, [x], [tf.float32])
        x.set_shape([4])
        return x, y

    return tf.data.Dataset.from_tensor_slices((features, labels)).map(through_python)


def task() -> TrainingTask:
    return TrainingTask(build_model, build_dataset, num_classes=2, shuffle_buffer=8)

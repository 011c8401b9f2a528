"""A task whose checkpoint is large (67 MB), so that a save lasts long enough to be hit.

One wide Dense layer holds nearly all of it: 1024 x 16384 float32 weights. The optimizer is plain
SGD, which has no slot variables, so the checkpoint is the weights alone and a worker stays under
1 GB (about 0.85 GB at its peak, most of it TensorFlow itself). A save takes about 0.1 s on two
CPU cores. The data is 64 random examples of two classes; what the model learns does not matter,
only the size of what it saves.

    python -m worker --task tests.tasks.big:task --steps 20 --batch-size 8 --checkpoint-every 5
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from worker.task import TrainingTask

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

FEATURES = 1024
HIDDEN = 16384  # FEATURES x HIDDEN = 16.8M parameters, 67 MB of float32
NUM_EXAMPLES = 64
SEED = 7


def build_model() -> keras.Model:
    import keras

    return keras.Sequential(
        [
            keras.Input(shape=(FEATURES,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(2),  # logits
        ],
        name="big",
    )


def build_dataset() -> tf.data.Dataset:
    import tensorflow as tf

    rng = np.random.default_rng(SEED)
    features = rng.normal(size=(NUM_EXAMPLES, FEATURES)).astype(np.float32)
    labels = (features.sum(axis=1) > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def sgd() -> keras.optimizers.Optimizer:
    import keras

    return keras.optimizers.SGD(learning_rate=1e-3)


def task() -> TrainingTask:
    return TrainingTask(
        build_model, build_dataset, optimizer=sgd, num_classes=2, shuffle_buffer=NUM_EXAMPLES
    )

"""A bundled example task: tell four shapes apart in small generated grayscale images.

Its model, optimizer and loss come from the Keras the job asks for (`job.keras`), so it trains
under Keras 3 and under Keras 2 (`keras: legacy`) alike.

The data is generated with numpy from a fixed seed (training hosts may have no network), and the
task is small enough to learn on CPUs in a few hundred steps, so it serves as the smoke test of a
cluster: if loss falls and accuracy climbs, the workers really train together. Its eval split
(other generated images) gives the val_accuracy shown after the run.

    python -m worker --task worker.examples.shapes:task --steps 300
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.contract import KERAS_BACKEND_ENV, KERAS_JAX
from worker.kerasflavor import keras as chosen_keras
from worker.task import TrainingTask

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

IMAGE_SIZE = 16
CLASS_NAMES = ("square", "circle", "triangle", "plus")
NUM_EXAMPLES = 4096
SEED = 1234
# The eval split: other images (another seed), and on purpose not a multiple of the batch size
# or the worker count: the evaluation counts every example exactly once all the same.
NUM_EVAL_EXAMPLES = 1001
EVAL_SEED = 4321
LEARNING_RATE = 3e-3


def make_images(n: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """n images (float32, shape [n, 16, 16, 1], values in [0, 1]) and labels (int32, shape [n]).

    Each image holds one filled shape of random size, position and brightness, plus Gaussian noise.
    The same (n, seed) always gives the same arrays.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(CLASS_NAMES), size=n).astype(np.int32)
    images = np.empty((n, IMAGE_SIZE, IMAGE_SIZE, 1), dtype=np.float32)
    for i, label in enumerate(labels):
        images[i, :, :, 0] = _draw(int(label), rng)
    return images, labels


def _draw(label: int, rng: np.random.Generator) -> np.ndarray:
    size = int(rng.integers(7, 14))  # the shape's bounding box, in pixels
    top, left = (int(v) for v in rng.integers(0, IMAGE_SIZE - size + 1, size=2))
    # Pixel coordinates relative to the box, scaled to [-1, 1].
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32)
    y, x = (2 * ys + 1) / size - 1, (2 * xs + 1) / size - 1
    masks = (
        np.ones_like(x, dtype=bool),  # square
        x**2 + y**2 <= 1.0,  # circle
        np.abs(x) <= (y + 1) / 2,  # triangle, apex up
        (np.abs(x) <= 0.3) | (np.abs(y) <= 0.3),  # plus
    )
    image = np.zeros((IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    image[top : top + size, left : left + size] = masks[label] * rng.uniform(0.6, 1.0)
    image += rng.normal(0.0, 0.1, size=image.shape).astype(np.float32)
    return np.clip(image, 0.0, 1.0)


def build_model() -> keras.Model:
    keras = chosen_keras()  # Keras 3, or Keras 2 (tf_keras) under job.keras: legacy
    return keras.Sequential(
        [
            keras.Input(shape=(IMAGE_SIZE, IMAGE_SIZE, 1)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(len(CLASS_NAMES)),  # logits
        ],
        name="shapes_cnn",
    )


def build_dataset() -> tf.data.Dataset | tuple[np.ndarray, np.ndarray]:
    return _examples(NUM_EXAMPLES, SEED)


def build_eval_dataset() -> tf.data.Dataset | tuple[np.ndarray, np.ndarray]:
    return _examples(NUM_EVAL_EXAMPLES, EVAL_SEED)


def _examples(n: int, seed: int) -> tf.data.Dataset | tuple[np.ndarray, np.ndarray]:
    """A tf.data.Dataset for the TensorFlow loop; the NumPy arrays themselves under
    job.keras: jax (KERAS_BACKEND=jax), whose hosts have no TensorFlow (worker.task)."""
    images, labels = make_images(n, seed)
    if os.environ.get(KERAS_BACKEND_ENV) == KERAS_JAX:
        return images, labels
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((images, labels))


def build_optimizer() -> keras.optimizers.Optimizer:
    keras = chosen_keras()
    # Higher than Adam's default 1e-3: the point of the example is to learn visibly in ~300 steps.
    return keras.optimizers.Adam(learning_rate=LEARNING_RATE)


def task() -> TrainingTask:
    return TrainingTask(
        model=build_model,
        dataset=build_dataset,
        eval_dataset=build_eval_dataset,
        optimizer=build_optimizer,
        learning_rate=LEARNING_RATE,
        num_classes=len(CLASS_NAMES),
    )

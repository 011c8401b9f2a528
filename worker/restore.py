"""The use phase: a task's model with a checkpoint's weights, in one call.

    from worker.restore import restore_model
    model = restore_model("worker.examples.shapes:task", "~/orchestrate/shapes/checkpoints")
    logits = model(images)

The training loop's checkpoints hold the model, the optimizer and the step
(tf.train.Checkpoint(model=..., optimizer=..., step=...), named ckpt-STEP by the chief's
CheckpointManager). Restoring builds the task's model, calls it once on a batch of zeros so every
variable exists, and restores the model's variables and the step; the optimizer's slots in the file
are skipped. No distribution strategy is created: this runs in any process, after or beside other
TensorFlow code.

Naming and listing checkpoints (checkpoint_path, available_checkpoints) needs no TensorFlow, so a
bad name is reported before TensorFlow is imported.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.contract import LEGACY_KERAS_ENV
from worker import kerasflavor
from worker.config import ConfigError
from worker.task import TaskError, TrainingTask, load_task

if TYPE_CHECKING:
    import keras

# tf.train.CheckpointManager writes PREFIX-N.index and PREFIX-N.data-*; the worker's PREFIX is ckpt.
_CHECKPOINT_INDEX = re.compile(r"^(?P<name>.+-(?P<step>\d+))\.index$")


class CheckpointNotFound(ValueError):
    """The named checkpoint (or any checkpoint) is not in the directory; says what is there."""


def available_checkpoints(checkpoint_dir: str) -> list[str]:
    """The checkpoints in checkpoint_dir (names such as ckpt-40), oldest step first."""
    try:
        names = os.listdir(checkpoint_dir)
    except OSError:
        return []
    found = [m for m in map(_CHECKPOINT_INDEX.match, names) if m]
    return [m["name"] for m in sorted(found, key=lambda m: (int(m["step"]), m["name"]))]


def latest_checkpoint_name(checkpoint_dir: str) -> str | None:
    """The checkpoint TensorFlow's `checkpoint` state file names as the latest, if it exists."""
    try:
        with open(os.path.join(checkpoint_dir, "checkpoint"), encoding="utf-8") as state:
            for line in state:
                if line.startswith("model_checkpoint_path:"):
                    name = os.path.basename(line.split(":", 1)[1].strip().strip('"'))
                    return name if name in available_checkpoints(checkpoint_dir) else None
    except OSError:
        return None
    return None


def checkpoint_path(checkpoint_dir: str, name: str | None = None) -> str:
    """The path prefix of checkpoint `name` (ckpt-N) in checkpoint_dir, or of the latest one.

    Raises CheckpointNotFound naming the directory and the checkpoints it holds.
    """
    directory = os.path.abspath(os.path.expanduser(checkpoint_dir))
    if not os.path.isdir(directory):
        raise CheckpointNotFound(f"no such checkpoint directory: {directory}")
    available = available_checkpoints(directory)
    if not available:
        raise CheckpointNotFound(f"no checkpoint in {directory}")
    if name is None:
        chosen = latest_checkpoint_name(directory) or available[-1]
    else:
        chosen = os.path.basename(name.removesuffix(".index"))
        if chosen not in available:
            raise CheckpointNotFound(
                f"no checkpoint {name!r} in {directory}; available: {', '.join(available)}"
            )
    return os.path.join(directory, chosen)


@dataclass
class Restored:
    """A model with restored weights, and the step its checkpoint was saved at."""

    model: Any
    step: int
    path: str


def restore(
    task: TrainingTask | str, checkpoint_dir: str, checkpoint: str | None = None
) -> Restored:
    """Builds the task's model and restores a checkpoint into it (the latest unless named)."""
    import tensorflow as tf

    if isinstance(task, str):
        task = load_task(task)
    path = checkpoint_path(checkpoint_dir, checkpoint)
    dataset = task.eval_dataset() if task.eval_dataset is not None else task.dataset()
    model = task.model()
    model(zeros_batch(dataset.element_spec[0]), training=False)  # creates every variable
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    # expect_partial: the optimizer's values stay in the file, unused.
    tf.train.Checkpoint(model=model, step=step).restore(
        path
    ).assert_existing_objects_matched().expect_partial()
    return Restored(model=model, step=int(step.numpy()), path=path)


def restore_model(
    task: TrainingTask | str, checkpoint_dir: str, checkpoint: str | None = None
) -> keras.Model:
    """The task's model (a TrainingTask, or MODULE:FUNCTION) with a checkpoint's weights.

    checkpoint: a name such as "ckpt-40"; the latest checkpoint when None. Raises
    CheckpointNotFound when it is not there, TaskError when the task cannot be loaded.
    """
    return restore(task, checkpoint_dir, checkpoint).model


def zeros_batch(spec: Any) -> Any:
    import tensorflow as tf

    # A batch of one example, for any structure of features (a tensor, a tuple, a dict).
    return tf.nest.map_structure(lambda s: tf.zeros([1, *s.shape], s.dtype), spec)


__all__ = [
    "CheckpointNotFound",
    "Restored",
    "TaskError",
    "available_checkpoints",
    "checkpoint_path",
    "restore",
    "restore_model",
]


class UsageError(ValueError):
    """A mistake of the one who asked (a flag, a checkpoint of the other Keras): exit 2."""


def check_keras(checkpoint_dir: str) -> None:
    """Checkpoints written under the other Keras (the chief's marker) never restore: refused."""
    try:
        kerasflavor.check_restorable(checkpoint_dir, has_checkpoint=True)
    except ConfigError as exc:
        raise UsageError(
            f"{exc}. Here: run python -m worker.evaluate with {LEGACY_KERAS_ENV}=1 for the "
            "checkpoints of job.keras: legacy, without it for the others"
        ) from exc

"""Which Keras the job asked for (`job.keras`); checkpoints kept to the Keras that wrote them.

TensorFlow 2.16+ ships Keras 3. With TF_USE_LEGACY_KERAS=1 (what `job.keras: legacy` sets on every
worker) `tf.keras` is Keras 2, the tf_keras package. The built-in loop's defaults and the bundled
example build their model, optimizer and loss from `keras()`, so they follow the job's setting; a
task of your own can do the same (`from worker import keras`), or use `tf.keras`.

Keras 2 and Keras 3 lay out a model's and an optimizer's variables differently, so a checkpoint
written under one does not restore under the other. The chief records the setting beside its
checkpoints (KERAS_MARKER_FILE), and a restore under the other setting is refused with a message
that names both, instead of failing deep inside tf.train.Checkpoint. Checkpoints without the marker
were written before it existed, by Keras 3.
"""

from __future__ import annotations

import json
import os
from types import ModuleType

from orchestrator.contract import (
    KERAS_DEFAULT,
    KERAS_LEGACY,
    KERAS_MARKER_FILE,
    LEGACY_KERAS_ENV,
    install_hint,
    legacy_keras_requested,
)
from worker.config import ConfigError


def setting() -> str:
    """The setting: legacy when this process runs with TF_USE_LEGACY_KERAS, else default."""
    return KERAS_LEGACY if legacy_keras_requested(os.environ) else KERAS_DEFAULT


def keras() -> ModuleType:
    """The Keras module of the job's setting: tf_keras (Keras 2) under legacy, else Keras 3."""
    if setting() == KERAS_LEGACY:
        try:
            import tf_keras
        except ImportError as exc:
            raise ConfigError(
                f"{LEGACY_KERAS_ENV}=1 (job.keras: legacy) but tf_keras is not installed: "
                + install_hint("legacy-keras", "on this host")
            ) from exc
        return tf_keras
    import keras as keras3

    return keras3


def _recorded(checkpoint_dir: str) -> str | None:
    try:
        with open(os.path.join(checkpoint_dir, KERAS_MARKER_FILE), encoding="utf-8") as file:
            value = json.load(file).get("keras")
    except (OSError, ValueError, AttributeError):
        return None
    return value if value in (KERAS_DEFAULT, KERAS_LEGACY) else None


def check_restorable(checkpoint_dir: str, has_checkpoint: bool) -> None:
    """Raises ConfigError when the checkpoints there were written under the other setting."""
    if not has_checkpoint:
        return
    written = _recorded(checkpoint_dir) or KERAS_DEFAULT
    wanted = setting()
    if written == wanted:
        return
    raise ConfigError(
        f"the checkpoints in {checkpoint_dir} were written with job.keras: {written}, but this "
        f"run has job.keras: {wanted}; Keras 2 and Keras 3 store models and optimizers "
        f"differently and cannot restore each other's checkpoints. Set job.keras: {written} "
        "again to resume, or use another checkpoint_dir to start afresh"
    )


def record(checkpoint_dir: str) -> None:
    """The chief notes the setting beside its checkpoints (once per run is enough)."""
    os.makedirs(checkpoint_dir, exist_ok=True)
    path = os.path.join(checkpoint_dir, KERAS_MARKER_FILE)
    temp = f"{path}.tmp"
    with open(temp, "w", encoding="utf-8") as file:
        json.dump({"keras": setting(), "module": keras().__name__,
                   "version": getattr(keras(), "__version__", None)}, file)  # fmt: skip
    os.replace(temp, path)

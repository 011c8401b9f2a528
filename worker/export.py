"""The finished model, written at the end of a successful run (--export keras | saved_model).

    keras         the full model, for keras.models.load_model: Keras 3 writes
                  EXPORT_DIR/model.keras, tf.keras 2 (TF_USE_LEGACY_KERAS=1) a SavedModel
                  directory EXPORT_DIR/model/
    saved_model   an inference-only SavedModel, EXPORT_DIR/saved_model/, for tf.saved_model.load
                  (its `serve` function and serving_default signature take the features, return
                  the model's outputs) and TensorFlow Serving; model.export() under both Kerases

MultiWorkerMirroredStrategy's rule for saving applies: every worker saves (reading some
distributed variables is collective), the chief into the real directory, the others into a
temporary directory they remove at once. The chief writes a sibling staging directory first and
swaps it in whole, so EXPORT_DIR only ever holds one complete export, of the latest run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any

from orchestrator.contract import (
    EXPORT_FORMATS,
    EXPORT_KERAS2_DIR,
    EXPORT_KERAS_FILE,
    EXPORT_SAVED_MODEL_DIR,
)

EXPORT_KERAS, EXPORT_SAVED_MODEL = EXPORT_FORMATS
KERAS_FILE = EXPORT_KERAS_FILE  # Keras 3
KERAS2_DIR = EXPORT_KERAS2_DIR  # tf.keras 2: the full model as a SavedModel directory
SAVED_MODEL_DIR = EXPORT_SAVED_MODEL_DIR


def keras_major(model: Any) -> int:
    """3 for a Keras 3 model, 2 for tf.keras 2 (the tf_keras package), from the model's classes.

    The class, not `import keras`: with TF_USE_LEGACY_KERAS=1 a task builds tf_keras models while
    the keras package installed beside it is Keras 3.
    """
    for cls in type(model).__mro__:
        root = cls.__module__.split(".")[0]
        if root == "tf_keras":
            return 2
        if root == "keras":
            import keras

            return int(keras.__version__.split(".")[0])
    raise TypeError(f"cannot export {type(model).__name__}: not a Keras model")


def write_model(model: Any, fmt: str, directory: str) -> str:
    """Writes the model into `directory` (which exists) in format fmt; returns what it wrote."""
    major = keras_major(model)
    if fmt == EXPORT_KERAS:
        if major >= 3:
            path = os.path.join(directory, KERAS_FILE)
            model.save(path)
        else:
            path = os.path.join(directory, KERAS2_DIR)
            model.save(path, save_format="tf")
    elif fmt == EXPORT_SAVED_MODEL:
        path = os.path.join(directory, SAVED_MODEL_DIR)
        if major >= 3:
            model.export(path, format="tf_saved_model", verbose=False)
        else:
            model.export(path)
    else:
        raise ValueError(f"unknown export format {fmt!r}; expected one of {EXPORT_FORMATS}")
    return path


def export_model(
    model: Any, fmt: str, export_dir: str, *, is_chief: bool, temp_parent: str | None = None
) -> str | None:
    """Every worker calls this at the same point; the chief's export path is returned."""
    if not is_chief:
        if temp_parent is not None:
            os.makedirs(temp_parent, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="worker-export-", dir=temp_parent)
        try:
            write_model(model, fmt, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            if temp_parent is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(temp_parent)  # gone too once no worker of this host uses it
        return None
    export_dir = os.path.abspath(export_dir)
    parent, name = os.path.split(export_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.partial-", dir=parent)
    try:
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; others may read the model
        written = write_model(model, fmt, staging)
        _swap_in(staging, export_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return os.path.join(export_dir, os.path.basename(written))


def _swap_in(staging: str, target: str) -> None:
    """Replaces target by staging; a crash in between leaves target or target.old-*, never a mix."""
    old = None
    if os.path.lexists(target):
        parent, name = os.path.split(target)
        old = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
        os.rmdir(old)  # a fresh unused name for the rename
        os.replace(target, old)
    os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)

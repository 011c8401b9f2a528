"""The built-in loop's checkpoints under `job.keras: jax`: NumPy files the chief writes, named
and listed as TensorFlow's CheckpointManager names and lists its own.

A checkpoint is one file, CHECKPOINT_NAME-STEP.npz (the model's weights, the optimizer's
variables and the step), written to a temporary name and renamed, and then named in the
directory's `checkpoint` state file (model_checkpoint_path / all_model_checkpoint_paths, the
format the controller's agent reads: orchestrator/hostside/files.py). So the controller's ckpt-N
listing, its spreading of the latest checkpoint to the other hosts, its mirror and `up`'s
"nothing to train" check work unchanged, and a kill mid-save leaves the previous checkpoint the
latest.

NumPy only (no JAX, no TensorFlow): the arrays are handed in and out.
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.contract import (
    CHECKPOINT_STATE_FILE,
    checkpoint_state_names,
    checkpoint_state_text,
)
from worker.progress import replace_text

# The TensorFlow loop's prefix too (worker.trainstate, which imports TensorFlow): the controller
# reads the step from the name (orchestrator/engine/store/checkpoints.checkpoint_step).
CHECKPOINT_NAME = "ckpt"
STATE_FILE = CHECKPOINT_STATE_FILE
SUFFIX = ".npz"
STEP_KEY = "saved_step"  # beside w0, w1... (the weights) and o0, o1... (the optimizer)


@dataclass(frozen=True)
class Saved:
    """What a checkpoint holds."""

    step: int
    weights: list[np.ndarray]
    optimizer: list[np.ndarray]


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_NAME}-{step}"


def listed(directory: str) -> list[str]:
    """The checkpoints the state file names, oldest first, the latest last ([] without one)."""
    try:
        with open(os.path.join(directory, STATE_FILE), encoding="utf-8") as handle:
            return checkpoint_state_names(handle.read())
    except OSError:
        return []


def _write_state(directory: str, names: Sequence[str]) -> None:
    replace_text(os.path.join(directory, STATE_FILE), checkpoint_state_text(names))


def save(directory: str, saved: Saved, max_to_keep: int) -> str:
    """Writes the checkpoint, names it the latest, prunes to max_to_keep; returns its name."""
    os.makedirs(directory, exist_ok=True)
    name = checkpoint_name(saved.step)
    arrays = {f"w{i}": w for i, w in enumerate(saved.weights)}
    arrays.update({f"o{i}": v for i, v in enumerate(saved.optimizer)})
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **{STEP_KEY: np.int64(saved.step)}, **arrays)  # type: ignore[arg-type]
        os.chmod(temp, 0o644)
        os.replace(temp, os.path.join(directory, name + SUFFIX))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    names = [n for n in listed(directory) if n != name] + [name]
    kept, dropped = names[-max_to_keep:], names[:-max_to_keep]
    _write_state(directory, kept)  # last: a kill before it leaves the previous one the latest
    for old in dropped:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, old + SUFFIX))
    return name


def load(directory: str) -> tuple[Saved | None, str | None]:
    """The newest checkpoint that loads, and a note when a newer one did not (None, None:
    none at all)."""
    note = None
    for name in reversed(listed(directory)):
        path = os.path.join(directory, name + SUFFIX)
        try:
            with np.load(path) as data:
                weights = _numbered(data, "w")
                optimizer = _numbered(data, "o")
                return Saved(int(data[STEP_KEY]), weights, optimizer), note
        except (OSError, ValueError, KeyError) as error:
            note = f"checkpoint {name} could not be loaded ({error}); resumed from an earlier one"
    return None, note


def _numbered(data: np.lib.npyio.NpzFile, prefix: str) -> list[np.ndarray]:
    count = sum(1 for key in data.files if key.startswith(prefix) and key[1:].isdigit())
    return [data[f"{prefix}{i}"] for i in range(count)]


def remove_interrupted_saves(directory: str) -> None:
    """A save killed midway leaves its temporary file; the chief removes them before saving."""
    for path in glob.glob(os.path.join(glob.escape(directory), f".{CHECKPOINT_NAME}-*.tmp")):
        with contextlib.suppress(OSError):
            os.unlink(path)

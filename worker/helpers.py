"""Helpers for your own training script (a `script:` job): what every multi-worker tutorial
re-implements. Standard library only: importing them costs nothing and runs no TensorFlow op, so
they may be called before the strategy is created.

    import tensorflow as tf
    from worker import is_chief, write_dir

    strategy = tf.distribute.MultiWorkerMirroredStrategy()   # first, on every worker
    ...
    model.fit(dataset, epochs=3)
    # Saving is collective: every worker saves, but only the chief's copy is kept.
    with write_dir("saved_model") as target:
        model.save(target)

Without orchestrate (no TF_CONFIG) the script is a one-worker cluster: it is the chief and writes
the real directory. Scripts that do not use these helpers keep working unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from orchestrator.contract import (
    CHECKPOINT_DIR_ENV,
    KERAS_PROCESS_ID_ENV,
    RUN_DIR_ENV,
    TARGET_STEPS_ENV,
    TF_CONFIG_ENV,
    TF_INDEX,
    TF_TASK,
    TF_TYPE,
)


def _task(env: Mapping[str, str]) -> tuple[str | None, int]:
    try:
        task = json.loads(env.get(TF_CONFIG_ENV) or "{}").get(TF_TASK) or {}
    except (ValueError, AttributeError):
        task = {}
    return task.get(TF_TYPE), int(task.get(TF_INDEX) or 0)


def task_index(env: Mapping[str, str] | None = None) -> int:
    """This worker's index in TF_CONFIG's cluster (0 without TF_CONFIG)."""
    return _task(os.environ if env is None else env)[1]


def is_chief(env: Mapping[str, str] | None = None) -> bool:
    """Whether this worker keeps the checkpoints, saved models and summaries: the "chief" task if
    the cluster names one, else worker 0 (the rule MultiWorkerMirroredStrategy follows); under
    `job.keras: jax` process 0 (keras.distribution's coordinator); or a process outside a
    cluster."""
    env = os.environ if env is None else env
    task_type, index = _task(env)
    if task_type is None and KERAS_PROCESS_ID_ENV in env:  # job.keras: jax: no TF_CONFIG
        return env[KERAS_PROCESS_ID_ENV] == "0"
    return task_type in (None, "chief") or (task_type == "worker" and index == 0)


def checkpoint_dir(default: str = "checkpoints") -> str:
    """The job's checkpoint directory (job.checkpoint_dir), or `default` outside orchestrate."""
    return os.environ.get(CHECKPOINT_DIR_ENV) or default


def target_steps(default: int | None = None, env: Mapping[str, str] | None = None) -> int | None:
    """The step the job must reach (the inventory's job.steps, ORCHESTRATE_TARGET_STEPS), or
    `default` when the job sets none or outside orchestrate. A worker that exits 0 below it,
    after reporting a step, fails the run as "stopped short"."""
    value = (os.environ if env is None else env).get(TARGET_STEPS_ENV, "")
    try:
        steps = int(value)
    except ValueError:
        return default
    return steps if steps > 0 else default


@contextmanager
def write_dir(path: str, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Where this worker writes a collective save (model.save, a checkpoint) of `path`.

    The chief gets `path` itself (created). Every other worker gets a fresh temporary directory,
    removed when the block ends: all workers must take part in the save, but their copies would
    race with the chief's files on a shared disk and pile up elsewhere.
    """
    if is_chief(env):
        os.makedirs(path, exist_ok=True)
        yield path
        return
    base = (os.environ if env is None else env).get(RUN_DIR_ENV) or None
    temp = tempfile.mkdtemp(prefix=f"write-dir-worker-{task_index(env)}-", dir=base)
    try:
        yield temp
    finally:
        shutil.rmtree(temp, ignore_errors=True)

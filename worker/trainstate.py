"""The training state (model, optimizer, step and the checkpoint that holds them), its restore
from the newest loadable checkpoint, and the first progress write that says where training starts.

Shared by every loop of the worker, under any strategy (worker.mirrored, worker.parameter_server).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from worker import kerasflavor
from worker.config import ConfigError, WorkerConfig
from worker.output import log
from worker.progress import ProgressWriter
from worker.progress import write_start as write_first
from worker.restore import zeros_batch
from worker.task import TrainingTask

# tf.train.CheckpointManager's file prefix: the chief's checkpoints are CHECKPOINT_NAME-STEP.*
CHECKPOINT_NAME = "ckpt"


@dataclass
class TrainState:
    """The objects a checkpoint holds; `step` is the number of steps taken."""

    model: Any
    optimizer: Any
    step: tf.Variable
    checkpoint: tf.train.Checkpoint


def build_state(
    strategy: tf.distribute.Strategy, task: TrainingTask, element_spec: Any
) -> TrainState:
    """Creates model, optimizer and step inside the scope, with all variables built.

    Built eagerly (model called once on zeros, optimizer.build) rather than on the first step, so a
    checkpoint restore finds every variable and is matched strictly, not deferred.
    """
    features_spec = element_spec[0]
    with strategy.scope():
        model = task.model()
        outputs = model(zeros_batch(features_spec), training=False)
        optimizer = task.optimizer()
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    if task.num_classes is not None and outputs.shape[-1] != task.num_classes:
        raise ValueError(
            f"the model outputs {outputs.shape[-1]} values per example but the task says "
            f"num_classes={task.num_classes}"
        )
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    return TrainState(model=model, optimizer=optimizer, step=step, checkpoint=checkpoint)


def restore(state: TrainState, checkpoint_dir: str) -> tuple[int | None, str | None]:
    """Restores the newest loadable checkpoint in checkpoint_dir: its step (None if there is
    none) and a note when it had to fall back to an earlier one.

    Every worker restores the same files: on one machine the directory is shared, across machines
    the controller copies every checkpoint of the chief's state file to every host before the
    start. So a latest checkpoint that cannot be loaded (a truncated file, a full disk during the
    save) fails the same way on every worker, and all fall back to the same earlier one. With
    checkpoints present but none loadable the worker refuses to start from step 0: training on
    would overwrite them.
    """
    listed = tf.train.get_checkpoint_state(checkpoint_dir)
    kerasflavor.check_restorable(checkpoint_dir, bool(listed and listed.model_checkpoint_path))
    if listed is None or not listed.model_checkpoint_path:
        leftovers = sorted(glob.glob(os.path.join(checkpoint_dir, f"{CHECKPOINT_NAME}-*.index")))
        if leftovers:
            raise ConfigError(
                f"{checkpoint_dir} holds checkpoints ({os.path.basename(leftovers[-1])}, ...) but "
                "no 'checkpoint' state file naming the latest: refusing to start from step 0 "
                "over them; restore the state file or move the checkpoints away"
            )
        log(f"worker: no checkpoint in {checkpoint_dir}, starting at step 0")
        return None, None
    latest = listed.model_checkpoint_path
    earlier = [p for p in listed.all_model_checkpoint_paths if p != latest]
    failures: list[str] = []
    for listed_path in [latest, *reversed(earlier)]:
        path = os.path.join(checkpoint_dir, listed_path)  # an absolute one stays as it is
        try:
            state.checkpoint.restore(path).assert_existing_objects_matched()
        except Exception as exc:
            text = str(exc).strip()
            reason = text.splitlines()[0][:200] if text else type(exc).__name__
            failures.append(f"{os.path.basename(path)}: {reason}")
            log(f"worker: checkpoint {os.path.basename(path)} cannot be loaded ({reason})")
            continue
        step = int(state.step.numpy())
        note = None
        if failures:
            note = f"fell back to checkpoint {os.path.basename(path)} (step {step}): " + "; ".join(
                failures
            )
            log(f"worker: {note}")
        log(f"worker: restored checkpoint at step {step} from {checkpoint_dir}")
        return step, note
    raise ConfigError(
        f"no checkpoint in {checkpoint_dir} can be loaded ({'; '.join(failures)}): refusing to "
        "start from step 0 over them; move the damaged checkpoints away to start afresh"
    )


def device_names(task_index: int) -> list[str]:
    """This worker's own devices, as "/device:CPU:0".

    With a cluster, list_logical_devices() names every worker's devices in full
    ("/job:worker/replica:0/task:1/device:CPU:0"); the progress file already says which task it is,
    so it lists only the local ones, short.
    """
    names = []
    for device in tf.config.list_logical_devices():
        spec = tf.DeviceSpec.from_string(device.name)
        if spec.task in (None, task_index):
            names.append(f"/device:{spec.device_type}:{spec.device_index}")
    return names


def write_start(
    progress: ProgressWriter,
    config: WorkerConfig,
    start_step: int,
    restored_step: int | None,
    num_replicas: int,
) -> None:
    """The first progress write (worker.progress.write_start), with this worker's devices."""
    write_first(
        progress,
        start_step=start_step,
        restored_step=restored_step,
        target_steps=config.steps,
        task_index=config.cluster.task_index,
        num_workers=config.cluster.num_workers,
        devices=device_names(config.cluster.task_index),
        num_replicas=num_replicas,
    )


def resume_state(
    strategy: tf.distribute.Strategy, task: TrainingTask, config: WorkerConfig
) -> tuple[tf.data.Dataset, TrainState, ProgressWriter, int]:
    """The task's dataset and its model and optimizer under `strategy`, restored from the
    latest checkpoint, and the progress file that says where training starts (every loop's
    first steps, under any strategy)."""
    dataset = task.dataset()
    state = build_state(strategy, task, dataset.element_spec)
    restored_step, note = restore(state, config.checkpoint_dir)
    start_step = restored_step or 0
    progress = ProgressWriter(config.progress_file)
    write_start(progress, config, start_step, restored_step, strategy.num_replicas_in_sync)
    if note:
        progress.write(note=note)  # status shows it beside the worker
    return dataset, state, progress, start_step

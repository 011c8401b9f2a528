"""The built-in worker under `job.keras: jax`: Keras 3 on JAX across processes by
keras.distribution, over the loop kit (worker.loop's Loop, worker.progress, worker.preemption's
signal, worker.export) with the pieces of worker.jaxparts, as worker.mirrored is under
MultiWorkerMirroredStrategy and worker.parameter_server under ParameterServerStrategy.

  keras.distribution.initialize() (the KERAS_DISTRIBUTION_* variables orchestrate sets) ->
  DataParallel over every process's devices, auto_shard_dataset off -> one seed everywhere ->
  the task's NumPy arrays, each process its shard -> model and optimizer (compiled, for the
  export's sake) -> the latest checkpoint -> steps (worker.jaxstep: a jitted step over the
  global batch, each process feeding its share; the gradients are averaged over all of them)
  with logs, progress, the chief's checkpoints, evaluations and stop checks -> a final
  evaluation and, with --export keras, the chief's model.keras.

No TensorFlow: a keras: jax host has none (docs/keras3.md says why). The task's dataset and
eval_dataset factories return NumPy arrays here (worker.task); the loop's batches are a function
of the step (worker.jaxdata), so a resumed run trains on what an uninterrupted one would have.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from orchestrator.contract import KERAS_PROCESS_ID_ENV
from worker import jaxdata
from worker.config import ConfigError, WorkerConfig
from worker.export import EXPORT_KERAS, export_model
from worker.jaxparts import (
    Evaluator,
    HostWindow,
    NoProfile,
    Saver,
    Scalars,
    StopVote,
    restore,
)
from worker.jaxstep import Trainer
from worker.loop import Loop
from worker.output import log
from worker.preemption import SigtermFlag, watch_sigterm
from worker.progress import ProgressWriter, write_start
from worker.task import TrainingTask

ACCURACY_METRIC = "sparse_categorical_accuracy"


def run(config: WorkerConfig, task: TrainingTask) -> int:
    """Trains task up to config.steps; returns the final step. Raises Preempted on SIGTERM."""
    if config.export_format not in (None, EXPORT_KERAS):
        raise ConfigError(f"--export {config.export_format} writes a TensorFlow SavedModel; "
                          f"under job.keras: jax export {EXPORT_KERAS}")  # fmt: skip
    import jax
    import keras

    if os.environ.get(KERAS_PROCESS_ID_ENV) is not None:  # orchestrate set the cluster's
        keras.distribution.initialize()  # variables; run by hand without them: one process
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False)
    )
    sigterm = watch_sigterm()
    process, processes = jax.process_index(), jax.process_count()
    features, labels = jaxdata.arrays_of(task.dataset(), "dataset")
    batch = jaxdata.local_batch(config.batch_size, processes)
    keras.utils.set_random_seed(shared_seed(config.seed))  # the same initial weights everywhere
    model, optimizer, with_accuracy = build(task, features, labels)
    restored_step, note = restore(model, optimizer, config.checkpoint_dir)
    start_step = restored_step or 0
    progress = ProgressWriter(config.progress_file)
    write_start(progress, start_step=start_step, restored_step=restored_step,
                target_steps=config.steps, task_index=process, num_workers=processes,
                devices=[f"/device:{d.platform.upper()}:{i}"  # as the TensorFlow loop names them
                         for i, d in enumerate(jax.local_devices())],
                num_replicas=jax.device_count())  # fmt: skip
    if note:
        progress.write(note=note)
    if start_step >= config.steps:
        log(f"worker: already at step {start_step} >= {config.steps}, nothing to do")
        finish(config, model, process)
        return start_step
    loop = build_loop(config, task, model=model, optimizer=optimizer, progress=progress,
                      sigterm=sigterm, with_accuracy=with_accuracy)  # fmt: skip
    batches = jaxdata.train_batches(features, labels, start_step=start_step, batch=batch,
                                    process=process, processes=processes)  # fmt: skip
    final_step = loop.run(batches, start_step)
    loop.saver.before_read()  # type: ignore[attr-defined]  # the last step's values
    finish(config, model, process)
    return final_step


def shared_seed(seed: int | None) -> int:
    """--seed, else one the first process draws and every process receives: every process must
    initialise the same weights (each builds its own copy of the model)."""
    if seed is not None:
        return seed
    from jax.experimental import multihost_utils

    drawn = np.int32(np.random.default_rng().integers(0, 2**31 - 1))
    return int(multihost_utils.broadcast_one_to_all(drawn))


def build(task: TrainingTask, features: np.ndarray, labels: np.ndarray) -> tuple[Any, Any, bool]:
    """The task's model and optimizer, compiled with its loss and, for class-index labels,
    accuracy (the exported model.keras loads compiled; the step is worker.jaxstep's); the
    optimizer's variables made, so a checkpoint can fill them before the first step."""
    model, optimizer = task.model(), task.optimizer()
    if not model.built:
        model.build((None, *features.shape[1:]))
    if task.num_classes is not None and model.output_shape[-1] != task.num_classes:
        raise ConfigError(f"the task's model outputs {model.output_shape[-1]} values, but its "
                          f"num_classes is {task.num_classes}")  # fmt: skip
    with_accuracy = np.issubdtype(labels.dtype, np.integer)
    model.compile(optimizer=optimizer, loss=task.loss,
                  metrics=[ACCURACY_METRIC] if with_accuracy else None)  # fmt: skip
    optimizer.build(model.trainable_variables)
    return model, optimizer, bool(with_accuracy)


def build_loop(
    config: WorkerConfig,
    task: TrainingTask,
    *,
    model: Any,
    optimizer: Any,
    progress: ProgressWriter,
    sigterm: SigtermFlag,
    with_accuracy: bool,
) -> Loop:
    import jax

    process, processes = jax.process_index(), jax.process_count()
    window = HostWindow()
    trainer = Trainer(model, optimizer, task.loss, window, with_accuracy)
    evaluator = None
    if task.eval_dataset is not None:
        x, y = jaxdata.arrays_of(task.eval_dataset(), "eval_dataset")
        batch = jaxdata.local_batch(config.batch_size, processes)
        evaluator = Evaluator(model, task.loss, jaxdata.eval_batches(x, y, batch, process,
                              processes), with_accuracy, len(y))  # fmt: skip
        evaluator.before_read = trainer.sync
        log(f"worker: evaluating {evaluator.examples} examples in {evaluator.steps} steps "
            + (f"every {config.eval_every} steps and " if config.eval_every else "")
            + "after the last step")  # fmt: skip
    saver = Saver(model, optimizer, config.checkpoint_dir, config.max_to_keep, process == 0)
    saver.before_read = trainer.sync
    return Loop(
        config=config,
        train_step=trainer,
        window=window,  # type: ignore[arg-type]
        saver=saver,  # type: ignore[arg-type]
        summaries=Scalars(process == 0),  # type: ignore[arg-type]
        profile=NoProfile(),  # type: ignore[arg-type]
        learning_rate=lambda: _learning_rate(optimizer, task.learning_rate),
        progress=progress,
        with_accuracy=with_accuracy,
        preemption=StopVote(sigterm, config.preemption_check_every),  # type: ignore[arg-type]
        evaluator=evaluator,  # type: ignore[arg-type]
    )


def _learning_rate(optimizer: Any, fallback: float | None) -> float | None:
    try:
        return float(optimizer.learning_rate)
    except (AttributeError, TypeError, ValueError):
        return fallback


def finish(config: WorkerConfig, model: Any, process: int) -> None:
    """Every process logs its weights' digest (equal digests: the processes trained in sync);
    with --export keras the chief writes model.keras."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight, dtype=np.float32).tobytes())
    log(f"worker: final weights sha256 {digest.hexdigest()}")
    if config.export_format is None:
        return
    # Every process saves: Keras gathers each variable across the processes as it writes
    # (a collective), the chief into the export directory, the others into a temporary one.
    written = export_model(model, config.export_format, config.export_dir,
                           is_chief=process == 0, temp_parent=config.temp_export_dir)  # fmt: skip
    if written is not None:
        log(f"worker: exported the model to {written}")

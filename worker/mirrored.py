"""The built-in worker under MultiWorkerMirroredStrategy or MirroredStrategy: its entry, over the
loop kit (worker.strategy, worker.trainstate, worker.dataset, worker.window, worker.step,
worker.saver, worker.loop, worker.preemption), as worker.parameter_server is under
ParameterServerStrategy.

A custom loop, not Keras model.fit: in TensorFlow 2.21 Keras 3's fit fails under
MultiWorkerMirroredStrategy (PerReplica ValueError, keras-team/keras#20585), while Keras 3 layers
and optimizers work inside strategy.run.

Order matters and is fixed by run():
  configure_devices (tf.config) -> strategy (first TensorFlow op) -> SIGTERM handler -> model/
  optimizer in scope -> restore -> sharded, repeated dataset -> steps, with logs, summaries,
  progress, collective checkpoints, evaluations and preemption checks -> a final evaluation and,
  with --export, the model written out (every worker saves, as with checkpoints).

MirroredStrategy (--strategy mirrored) runs the same loop on one host over its local devices: one
input pipeline, several replicas, and it is always the chief.

Every worker runs the same number of steps (the dataset repeats forever and the step count comes
from the command line and the shared checkpoint), which is what keeps the collectives in lockstep.
For the same reason a SIGTERM does not stop a worker on its own: every worker stops at the same
step, after the same checkpoint (worker.preemption's Preemption).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from worker.config import WorkerConfig
from worker.dataset import SHUFFLE_SEED, distribute_dataset
from worker.devices import configure_devices
from worker.export import export_model
from worker.loop import Loop
from worker.output import log
from worker.preemption import Preemption, SigtermFlag, sigterm_while_connecting, watch_sigterm
from worker.progress import ProgressWriter
from worker.saver import CheckpointSaver, remove_interrupted_saves
from worker.sharded_eval import Evaluator, has_integer_labels
from worker.step import make_train_step
from worker.strategy import check_batch_split, create_strategy
from worker.summaries import ProfileWindow, Summaries, current_learning_rate
from worker.task import TrainingTask
from worker.trainstate import TrainState, resume_state
from worker.window import Window

# The distributed dataset's iterator stays referenced until the process leaves (worker/__main__
# ends with os._exit, which runs no destructor). Freed when the loop returned, TensorFlow's
# MultiDeviceIterator destructor blocked for 30-40 s on a worker whose peer had already exited:
# a non-chief ended 37 s after its last step in about half of the bundled example's runs on a
# loaded 2-core machine (its stacks: at `loop.run`'s line, after the call), the chief long gone,
# and the run's goodput counted those seconds as shutdown.
_KEPT_ITERATORS: list[Any] = []


def run(config: WorkerConfig, task: TrainingTask) -> int:
    """Trains task up to config.steps; returns the final step. Raises Preempted on SIGTERM."""
    configure_devices(config.devices)  # tf.config works only before the runtime starts
    # The strategy before any other TensorFlow operation.
    strategy = create_strategy(config.strategy, config.devices)
    sigterm = watch_sigterm()
    if config.seed is not None:
        # After the strategy (the first TensorFlow op), before the model's weights exist.
        import keras

        keras.utils.set_random_seed(config.seed)
    check_batch_split(config.batch_size, strategy.num_replicas_in_sync)
    dataset, state, progress, start_step = resume_state(strategy, task, config)
    if start_step >= config.steps:
        log(f"worker: already at step {start_step} >= {config.steps}, nothing to do")
        # Every worker takes this branch alike, so the export's collective save still matches.
        export(config, state, strategy)
        return start_step
    summaries = Summaries(config.tensorboard_dir, strategy.extended.should_checkpoint)
    if summaries.is_chief:
        remove_interrupted_saves(config.checkpoint_dir)
    if start_step == 0:
        summaries.inputs(dataset, step=0)
    loop = build_loop(
        config,
        strategy=strategy,
        task=task,
        state=state,
        summaries=summaries,
        progress=progress,
        start_step=start_step,
        element_spec=dataset.element_spec,
        sigterm=sigterm,
    )
    seed = SHUFFLE_SEED + start_step
    dist_dataset = distribute_dataset(
        strategy, dataset, config.batch_size, task.shuffle_buffer, seed
    )
    # As late as possible: TensorFlow records a SIGTERM about a second after it came.
    if sigterm_while_connecting(config):
        sigterm.set()
        log("worker: SIGTERM received while the workers connected; stopping at the first check")
    iterator = iter(dist_dataset)
    _KEPT_ITERATORS.append(iterator)
    final_step = loop.run(iterator, start_step)
    export(config, state, strategy)
    return final_step


def export(config: WorkerConfig, state: TrainState, strategy: tf.distribute.Strategy) -> None:
    """With --export, every worker saves the model; the chief's copy goes to config.export_dir."""
    if config.export_format is None:
        return
    written = export_model(
        state.model,
        config.export_format,
        config.export_dir,
        is_chief=strategy.extended.should_checkpoint,
        temp_parent=config.temp_export_dir,
    )
    if written is not None:
        log(f"worker: exported the model at step {int(state.step.numpy())} to {written}")


def build_loop(
    config: WorkerConfig,
    *,
    strategy: tf.distribute.Strategy,
    task: TrainingTask,
    state: TrainState,
    summaries: Summaries,
    progress: ProgressWriter,
    start_step: int,
    element_spec: Any,
    sigterm: SigtermFlag,
) -> Loop:
    """The loop and its parts; the profile window is relative to this run's first step."""
    with_accuracy = has_integer_labels(element_spec)
    evaluator = None
    if task.eval_dataset is not None:
        evaluator = Evaluator(
            strategy,
            state.model,
            task,
            task.eval_dataset(),
            per_replica_batch=config.batch_size // strategy.num_replicas_in_sync,
        )
        log(
            f"worker: evaluating {evaluator.examples} examples in {evaluator.steps} steps "
            + (f"every {config.eval_every} steps and " if config.eval_every else "")
            + "after the last step"
        )
    window = Window(config.batch_size, strategy)
    preemption = Preemption(sigterm, config.preemption_check_every, strategy)
    return Loop(
        config=config,
        train_step=make_train_step(
            strategy,
            state,
            task,
            window,
            with_accuracy,
            preemption=preemption,
            steps_per_call=config.steps_per_call,
        ),
        window=window,
        saver=CheckpointSaver(state, config, summaries.is_chief),
        summaries=summaries,
        profile=ProfileWindow(config.profile_steps, summaries, start_step + 1, config.steps),
        learning_rate=lambda: current_learning_rate(state.optimizer, task.learning_rate),
        progress=progress,
        with_accuracy=with_accuracy,
        preemption=preemption,
        evaluator=evaluator,
    )

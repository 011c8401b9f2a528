"""The built-in loop under ParameterServerStrategy (--strategy parameter-server).

The chief drives a tf.distribute.coordinator.ClusterCoordinator: the model's and optimizer's
variables live on the ps tasks, and each step is a closure scheduled on whichever worker is free,
over that worker's own input pipeline (create_per_worker_dataset). A worker lost mid-run costs
only its closures in flight: the coordinator schedules them again on the others and takes the
worker back once its server answers at the same address (orchestrate starts it again there). A
lost ps fails the chief's step: the cluster restarts from the chief's latest checkpoint.

The chief counts the steps itself (a closure run twice after a worker's loss still counts once):
it schedules them up to the next log, checkpoint, evaluation or preemption check, waits for them
all (coordinator.join), then does there what the same worker.loop.Loop does under
MultiWorkerMirroredStrategy: the same logs, progress, summaries, checkpoints (the chief's alone:
it reads the variables from the ps), evaluations (on the chief, over the whole eval split) and
its SIGTERM (the chief saves and exits 75; the workers and ps are only stopped).

Worker and ps tasks run their tf.distribute.Server until they are stopped (serve).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from worker.config import WorkerConfig
from worker.devices import configure_devices
from worker.export import export_model
from worker.loop import Loop
from worker.output import log
from worker.preemption import Preemption, watch_sigterm
from worker.saver import CheckpointSaver, remove_interrupted_saves
from worker.sharded_eval import Evaluator, has_integer_labels
from worker.step import gradient_step
from worker.summaries import ProfileWindow, Summaries, current_learning_rate
from worker.task import TrainingTask
from worker.trainstate import TrainState, resume_state
from worker.window import Window


def serve(config: WorkerConfig) -> None:
    """A worker or ps task: its server, until the process is stopped."""
    configure_devices(config.devices)  # before the server starts the runtime
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    log(f"worker: serving as {resolver.task_type} {resolver.task_id} for the chief")
    server.join()


class ChiefPreemption(Preemption):
    """Only the chief decides when to stop under ParameterServerStrategy: its own SIGTERM, seen
    at a check step (no vote: the workers take no part)."""

    def before_step(self) -> None:
        pass

    def agreed_at(self, step: int) -> bool:
        return step % self.check_every == 0 and self.flag.received


def per_worker_iterator(
    strategy: tf.distribute.Strategy,
    coordinator: Any,
    task: TrainingTask,
    global_batch: int,
) -> Any:
    """Each worker's own pipeline over the task's examples, shuffled its own way and repeated
    (a step takes one worker's whole batch: its closure may run on any worker)."""

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch)
        return (
            task.dataset()
            .shuffle(task.shuffle_buffer, reshuffle_each_iteration=True)
            .repeat()
            .batch(batch, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )

    def per_worker_dataset() -> Any:
        return strategy.distribute_datasets_from_function(dataset_fn)

    return iter(coordinator.create_per_worker_dataset(per_worker_dataset))


def make_ps_train_step(
    strategy: tf.distribute.Strategy,
    coordinator: Any,
    step: Callable[[tuple[Any, tf.Tensor]], None],
    window: Window,
) -> Callable[[Any, int], None]:
    """A callable (iterator, n) that schedules n steps on the workers and waits for all."""

    @tf.function
    def worker_step(iterator: Any) -> None:
        def step_fn(features: Any, labels: tf.Tensor) -> None:
            step((features, labels))
            window.steps.assign_add(1.0)

        strategy.run(step_fn, args=next(iterator))

    def train_many(iterator: Any, n: int) -> None:
        for _ in range(n):
            coordinator.schedule(worker_step, args=(iterator,))
        coordinator.join()  # raises what a closure raised (a lost ps: UnavailableError)

    return train_many


def run(config: WorkerConfig, task: TrainingTask) -> int:
    """The chief: trains task up to config.steps; returns the final step. Raises Preempted on
    SIGTERM, after saving."""
    configure_devices(config.devices)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    if config.seed is not None:
        import keras

        keras.utils.set_random_seed(config.seed)
    dataset, state, progress, start_step = resume_state(strategy, task, config)
    if start_step >= config.steps:
        log(f"worker: already at step {start_step} >= {config.steps}, nothing to do")
        export(config, state)
        return start_step
    summaries = Summaries(config.tensorboard_dir, is_chief=True)
    remove_interrupted_saves(config.checkpoint_dir)
    if start_step == 0:
        summaries.inputs(dataset, step=0)
    with_accuracy = has_integer_labels(dataset.element_spec)
    sigterm = watch_sigterm()
    with strategy.scope():  # plain variables on the ps, which every worker's steps add to
        window = Window(config.batch_size)
    step = make_ps_train_step(
        strategy,
        coordinator,
        lambda batch: gradient_step(state, task, window, with_accuracy, batch),
        window,
    )
    loop = Loop(
        # Steps are scheduled up to the next log, checkpoint, evaluation or check, then joined:
        # as many in flight as there are steps to the next of those, not one per call.
        config=dataclasses.replace(config, steps_per_call=config.steps),
        train_step=step,
        window=window,
        saver=CheckpointSaver(state, config, is_chief=True),
        summaries=summaries,
        profile=ProfileWindow(config.profile_steps, summaries, start_step + 1, config.steps),
        learning_rate=lambda: current_learning_rate(state.optimizer, task.learning_rate),
        progress=progress,
        with_accuracy=with_accuracy,
        preemption=ChiefPreemption(sigterm, config.preemption_check_every),
        evaluator=chief_evaluator(config, state, task),
    )
    iterator = per_worker_iterator(strategy, coordinator, task, config.batch_size)
    # Again: the per-worker datasets' creation puts the default action back (measured: the chief
    # died of `down`'s SIGTERM instead of saving); a SIGTERM counted before still counts.
    sigterm.install()
    final_step = loop.run(iterator, start_step)
    export(config, state)
    return final_step


def chief_evaluator(
    config: WorkerConfig, state: TrainState, task: TrainingTask
) -> Evaluator | None:
    """The task's evaluation, run by the chief itself (outside the strategy's scope: the model
    reads its variables from the ps), over the whole eval split as under MultiWorkerMirrored."""
    if task.eval_dataset is None:
        return None
    evaluator = Evaluator(tf.distribute.get_strategy(), state.model, task, task.eval_dataset(),
                          per_replica_batch=config.batch_size)  # fmt: skip
    log(
        f"worker: evaluating {evaluator.examples} examples in {evaluator.steps} steps "
        + (f"every {config.eval_every} steps and " if config.eval_every else "")
        + "after the last step, on the chief"
    )
    return evaluator


def export(config: WorkerConfig, state: TrainState) -> None:
    """With --export, the chief writes the model (its variables read from the ps)."""
    if config.export_format is None:
        return
    written = export_model(state.model, config.export_format, config.export_dir, is_chief=True,
                           temp_parent=config.temp_export_dir)  # fmt: skip
    if written is not None:
        log(f"worker: exported the model at step {int(state.step.numpy())} to {written}")

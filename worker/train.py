"""The training loop of one worker, under MultiWorkerMirroredStrategy or MirroredStrategy.

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
step, after the same checkpoint (worker.preemption, Preemption below).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from orchestrator.contract import (
    CHECKPOINT_AT,
    CHECKPOINT_SECONDS,
    EVAL_SECONDS,
    FIRST_STEP_AT,
    STEP_CALL_SECONDS,
    STEP_SECONDS,
    STEP_TIMING_ENV,
)
from worker import asyncsave, kerasflavor
from worker.config import STRATEGY_MIRRORED, ConfigError, DeviceSettings, WorkerConfig
from worker.devices import configure_devices
from worker.evaluation import EvalResult, Evaluator, correct_mask, has_integer_labels
from worker.export import export_model
from worker.output import log
from worker.preemption import Preempted, SigtermFlag, tf_notice_received
from worker.progress import ProgressWriter
from worker.restore import zeros_batch
from worker.schedule import call_end
from worker.summaries import ProfileWindow, Summaries, current_learning_rate
from worker.task import TrainingTask

# Base seed of the shuffle. The start step is added so a resumed run does not replay the exact
# batches of the run it resumes (the iterator position is not checkpointed).
SHUFFLE_SEED = 20_000
# tf.train.CheckpointManager's file prefix: the chief's checkpoints are CHECKPOINT_NAME-STEP.*
CHECKPOINT_NAME = "ckpt"


def create_strategy(kind: str, settings: DeviceSettings) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy reads TF_CONFIG; without it, it runs as a one-worker cluster.

    MirroredStrategy takes every local logical GPU, or, without GPU, every logical CPU (so
    --logical-cpus K gives K replicas); it ignores TF_CONFIG, which config has checked.
    """
    split = splits_gpus(settings)
    if kind == STRATEGY_MIRRORED:
        # TF 2.21 picks NCCL unless it counts more logical than physical GPUs, and it counts the
        # hidden ones too: --visible-gpus 0 --logical-gpus 2 on an 8-GPU host would give NCCL two
        # ranks on one card, which NCCL does not support. Reducing on one device always works.
        ops = tf.distribute.ReductionToOneDevice() if split else None
        return tf.distribute.MirroredStrategy(cross_device_ops=ops)
    options = None
    if split:  # the same reason: no NCCL between logical GPUs of one card
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def splits_gpus(settings: DeviceSettings) -> bool:
    """Several logical GPUs per card (configure_devices ignored --logical-gpus without GPU).

    Physical, not logical, devices: listing logical ones would start the runtime, and
    MultiWorkerMirroredStrategy must come first.
    """
    return bool(settings.logical_gpus and settings.logical_gpus > 1) and bool(
        tf.config.list_physical_devices("GPU")
    )


def check_batch_split(global_batch: int, num_replicas: int) -> None:
    """Every replica takes the same share of the global batch.

    Only known once the strategy has counted the devices; without this check TensorFlow fails in
    get_per_replica_batch_size with a traceback.
    """
    if global_batch % num_replicas:
        raise ConfigError(
            f"--batch-size {global_batch} is the global batch size and must be divisible by the "
            f"number of replicas ({num_replicas})"
        )


def watch_sigterm() -> SigtermFlag:
    """Replaces TensorFlow's SIGTERM handler with one that only counts, for Preemption.

    Must follow the strategy: with a cluster in TF_CONFIG, the strategy installs TensorFlow's own
    handler (tsl SigtermNotifier) while it connects, over whatever was there before.
    """
    flag = SigtermFlag()
    flag.install()
    return flag


def sigterm_while_connecting(config: WorkerConfig) -> bool:
    """Whether a worker got SIGTERM while TensorFlow's handler was still in place.

    Only a cluster has that handler (and the coordination service it reports to).
    """
    return (
        config.strategy != STRATEGY_MIRRORED and config.cluster.num_workers > 1
    ) and tf_notice_received()


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


def distribute_dataset(
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    global_batch: int,
    shuffle_buffer: int,
    seed: int,
) -> tf.distribute.DistributedDataset:
    """Each input pipeline (one per worker) takes its shard of the examples, repeated forever."""

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica_batch = context.get_per_replica_batch_size(global_batch)
        return (
            dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
            .shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
            .repeat()
            # drop_remainder: every replica gets full batches, so the global batch is constant.
            .batch(per_replica_batch, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )

    return strategy.distribute_datasets_from_function(dataset_fn)


class Preemption:
    """Turns a SIGTERM on any worker into the same stop decision, at the same step, on all of them.

    `wish` is 1.0 on a worker once it got SIGTERM. Every step adds it, on every replica, to that
    replica's copy of `votes`, a sum-on-read variable (no collective in the step). Reading `votes`
    between steps sums the copies across all workers in one collective, so read after the same
    step (multiples of check_every, at the end of a call) it is the same number on every worker
    and gives every worker the same answer. Reading makes the host wait for the step and costs
    that collective, hence only every check_every steps. Without a strategy (unit tests) `votes`
    is a plain variable.
    """

    def __init__(
        self, flag: SigtermFlag, check_every: int, strategy: tf.distribute.Strategy | None = None
    ) -> None:
        self.flag = flag
        self.check_every = check_every
        self.wish = tf.Variable(0.0, trainable=False, name="stop_wish")
        self.votes = tf.Variable(0.0, trainable=False, name="stop_votes")
        if strategy is not None:
            with strategy.scope():
                self.votes = local_sum("stop_votes", tf.float32)
        self._cast = False

    def before_step(self) -> None:
        """Host side, between steps: sets the wish once the signal has come (one assignment)."""
        if self.flag.received and not self._cast:
            self.wish.assign(1.0)
            self._cast = True

    def agreed_at(self, step: int) -> bool:
        """Call after step `step`; True on every worker or on none."""
        return step % self.check_every == 0 and float(self.votes.numpy()) > 0


def local_sum(name: str, dtype: tf.DType) -> tf.Variable:
    """A sum each replica adds to locally; reading it (between steps, on every worker at the same
    step) sums the replicas' copies across workers in one collective. Keras metrics work so."""
    return tf.Variable(
        tf.zeros((), dtype),
        trainable=False,
        name=name,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )


class Window:
    """Loss and accuracy summed over the steps since the last log, kept on the device.

    Each replica adds its own share to sum-on-read variables inside the step, so a step's only
    collective is the gradients' all-reduce (the minimal loop also reduces its loss every step);
    reading the sums on a log step (every worker at the same step) adds them up across workers.
    The host fetches values only on log steps; what is logged is the mean over the whole window,
    not just the last batch. Without a strategy (unit tests) the sums are plain variables.
    """

    def __init__(self, global_batch: int, strategy: tf.distribute.Strategy | None = None) -> None:
        self.global_batch = global_batch
        self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.correct_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.steps = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        if strategy is not None:
            with strategy.scope():
                self.loss_sum = local_sum("loss_sum", tf.float64)
                self.correct_sum = local_sum("correct_sum", tf.float64)

    def add(self, loss: tf.Tensor, correct: tf.Tensor) -> None:
        self.loss_sum.assign_add(tf.cast(loss, tf.float64))
        self.correct_sum.assign_add(tf.cast(correct, tf.float64))

    def read_and_reset(self, with_accuracy: bool) -> tuple[float | None, float | None]:
        """(mean loss, accuracy) over the window; (None, None) if no step was taken."""
        steps = float(self.steps.numpy())
        if steps == 0:
            return None, None
        loss = float(self.loss_sum.numpy()) / steps
        accuracy = float(self.correct_sum.numpy()) / (steps * self.global_batch)
        for variable in (self.loss_sum, self.correct_sum, self.steps):
            variable.assign(0.0)
        return loss, accuracy if with_accuracy else None


def gradient_step(
    state: TrainState,
    task: TrainingTask,
    window: Window,
    with_accuracy: bool,
    batch: tuple[Any, tf.Tensor],
) -> None:
    """One replica's step (inside strategy.run): the loss over the global batch, its gradients
    applied, and the replica's loss and correct count added to the window."""
    model, (features, labels) = state.model, batch
    with tf.GradientTape() as tape:
        logits = model(features, training=True)
        per_example = tf.cast(task.loss(labels, logits), tf.float32)
        # Divide by the GLOBAL batch: the optimizer sums gradients over replicas.
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=window.global_batch)
        if model.losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
    gradients = tape.gradient(loss, model.trainable_variables)
    state.optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    correct = tf.reduce_sum(correct_mask(labels, logits)) if with_accuracy else tf.constant(0.0)
    # Local sums only: the only collective of a step is the gradients' all-reduce; the window
    # is summed across workers when the host reads it.
    window.add(loss, correct)


def make_train_step(
    strategy: tf.distribute.Strategy,
    state: TrainState,
    task: TrainingTask,
    window: Window,
    with_accuracy: bool,
    *,
    preemption: Preemption,
    steps_per_call: int = 1,
) -> Callable[[Any, int], None]:
    """A callable (iterator, n) running n steps on every replica, adding each replica's loss,
    correct count and stop wish to the window's and preemption's sum-on-read variables.

    With steps_per_call 1 it is one tf.function per step (n is always 1). Above 1 the steps run
    in a loop inside one tf.function (n from 1 to K, a tensor, so every n shares one trace): each
    iteration is exactly the body of the one-step function, so the numerics are the same, and the
    Python dispatch and the host-side call overhead are paid once per call instead of per step.
    """

    def step_fn(features: Any, labels: tf.Tensor) -> None:
        gradient_step(state, task, window, with_accuracy, (features, labels))
        preemption.votes.assign_add(preemption.wish.read_value())

    def one_step(iterator: Any) -> None:
        strategy.run(step_fn, args=next(iterator))
        window.steps.assign_add(1.0)

    if steps_per_call == 1:
        single = tf.function(one_step)

        def train_step(iterator: Any, n: int) -> None:
            assert n == 1, n
            single(iterator)

        return train_step

    @tf.function
    def train_steps(iterator: Any, n: tf.Tensor) -> None:
        # autograph turns this into a tf.while_loop: one graph, n iterations, no Python between.
        for _ in tf.range(n):
            one_step(iterator)

    def train_many(iterator: Any, n: int) -> None:
        assert 1 <= n <= steps_per_call, n
        train_steps(iterator, tf.constant(n, dtype=tf.int32))

    return train_many


class CheckpointSaver:
    """Checkpoints. Saving is collective: every worker must save, at the same step.

    The chief writes the real directory through a CheckpointManager (which prunes to max_to_keep);
    the other workers write to a temporary directory and delete it right after, so their copies
    neither accumulate nor race with the chief's files.

    With `config.async_checkpoints` a save returns once the values are copied to host memory
    and TensorFlow writes the files in a thread (CheckpointOptions(enable_async=True)); the
    manager names the checkpoint in its state file only once the write is complete, so a kill
    mid-write resumes from the previous one. The others then keep one temporary directory (a
    manager with max_to_keep 1), removed by close(). A save with `wait` (the last one, a
    preemption's) blocks until it and any earlier write are on disk. `on_written` is told a
    checkpoint's step once it is on disk: the progress file's checkpoint_step never names one a
    kill could still lose.
    """

    def __init__(self, state: TrainState, config: WorkerConfig, is_chief: bool) -> None:
        self._checkpoint = state.checkpoint
        self._step = state.step
        self._is_chief = is_chief
        self._temp_dir = config.temp_checkpoint_dir
        self._async = config.async_checkpoints
        self._manager = None
        self._temp_manager: tf.train.CheckpointManager | None = None
        self._kept_temp: str | None = None
        self.saved_step: int | None = None  # the step of this run's last save
        # Called with a checkpoint's step once it is on disk (the loop reports it then).
        self.on_written: Callable[[int], None] = lambda step: None
        self._reported = -1
        self._report_lock = threading.Lock()
        if self._async:
            asyncsave.patch()
        if is_chief:
            kerasflavor.record(config.checkpoint_dir)
            self._manager = tf.train.CheckpointManager(
                state.checkpoint,
                config.checkpoint_dir,
                max_to_keep=config.max_to_keep,
                checkpoint_name=CHECKPOINT_NAME,
            )

    def save(self, step: int, *, wait: bool = False) -> None:
        self._step.assign(step)
        self.saved_step = step
        background = self._async and not wait
        if not background:
            self._checkpoint.sync()  # an earlier write in the background first: files in order
        options = tf.train.CheckpointOptions(enable_async=background)
        if self._manager is not None:
            self._manager.save(checkpoint_number=step, options=options)
        elif background:
            self._background_temp().save(checkpoint_number=step, options=options)
        else:
            self._save_in_temp(step)
        if background:  # told once TensorFlow's writer thread has written it
            threading.Thread(target=self._when_written, args=(step,), daemon=True).start()
        else:
            self._written(step)

    def _when_written(self, step: int) -> None:
        try:
            self._checkpoint.sync()  # returns once the write and its state file are done
        except Exception as error:  # the loop's next save, or close, raises it again
            log(f"worker: the checkpoint of step {step} was not written: {error}")
            return
        self._written(step)

    def _written(self, step: int) -> None:
        """`on_written` once per checkpoint, in order (a late waiter never goes back)."""
        with self._report_lock:
            if step <= self._reported:
                return
            self._reported = step
        self.on_written(step)

    def _save_in_temp(self, step: int) -> None:
        """A non-chief's blocking save: a fresh temporary directory, deleted after."""
        self.close()
        temp_dir = self._make_temp_dir()
        try:
            manager = tf.train.CheckpointManager(self._checkpoint, temp_dir, max_to_keep=1)
            manager.save(checkpoint_number=step)
        finally:
            shutil.rmtree(temp_dir, ignore_errors=True)
            if self._temp_dir is not None:
                # RUN_DIR/tmp-checkpoints goes too once no worker on this host uses it.
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(temp_dir))

    def _background_temp(self) -> tf.train.CheckpointManager:
        """A non-chief's one temporary directory for saves written in the background."""
        if self._temp_manager is None:
            self._kept_temp = self._make_temp_dir()
            self._temp_manager = tf.train.CheckpointManager(
                self._checkpoint, self._kept_temp, max_to_keep=1
            )
        return self._temp_manager

    def close(self) -> None:
        """Waits for a write in the background; a non-chief's temporary directory goes."""
        self._checkpoint.sync()
        if self._kept_temp is not None:
            shutil.rmtree(self._kept_temp, ignore_errors=True)
            self._kept_temp, self._temp_manager = None, None

    def _make_temp_dir(self) -> str:
        # A fresh directory per save: the previous one was deleted with everything in it.
        if self._temp_dir is None:
            return tempfile.mkdtemp(prefix="worker-checkpoint-")
        os.makedirs(self._temp_dir, exist_ok=True)
        return self._temp_dir


def remove_interrupted_saves(checkpoint_dir: str) -> None:
    """Deletes what a save killed midway left in the chief's checkpoint directory.

    TensorFlow 2.21 writes CHECKPOINT_NAME-N_temp/ first (the data as *.tempstate*, renamed when
    complete), moves the files out to CHECKPOINT_NAME-N.*, removes the directory, and only then
    names the checkpoint in the `checkpoint` state file. A kill before the state file is written
    leaves the previous checkpoint as the latest, but the directory stays, as large as a
    checkpoint, and a later save of step N does not remove the stale files in it. Call on the
    chief only, before its first save: nothing else writes that directory.
    """
    for path in glob.glob(os.path.join(glob.escape(checkpoint_dir), f"{CHECKPOINT_NAME}-*_temp")):
        shutil.rmtree(path, ignore_errors=True)
        log(f"worker: removed {os.path.basename(path)}, left by an interrupted checkpoint save")


class Loop:
    """Runs the steps from start_step to config.steps with logs, summaries, progress, checkpoints
    and evaluations (every config.eval_every steps and after the last one, with an evaluator).

    The host waits for the device only where it must read a value: after the first step (to log
    it), on log steps, on evaluations, on preemption checks, on checkpoint saves and at the end
    of a profiled window. Raises Preempted once a SIGTERM has been agreed on and the checkpoint
    saved.
    """

    def __init__(
        self,
        *,
        config: WorkerConfig,
        train_step: Callable[[Any, int], None],
        window: Window,
        saver: CheckpointSaver,
        summaries: Summaries,
        profile: ProfileWindow,
        learning_rate: Callable[[], float | None],
        progress: ProgressWriter,
        with_accuracy: bool,
        preemption: Preemption,
        evaluator: Evaluator | None = None,
    ) -> None:
        self.config = config
        self.evaluator = evaluator
        self.train_step = train_step
        self.window = window
        self.saver = saver
        self.summaries = summaries
        self.profile = profile
        self.learning_rate = learning_rate
        self.progress = progress
        self.with_accuracy = with_accuracy
        self.preemption = preemption
        saver.on_written = self._written  # checkpoint_step, once the checkpoint is on disk
        self._mark = (0, 0.0)  # (step, time) at which the current rate window started
        # Seconds spent inside the step calls since the window started (None: not timed).
        self._in_calls: float | None = 0.0 if timing_enabled() else None

    def run(self, iterator: Any, start_step: int) -> int:
        steps = self.config.steps
        step = start_step
        while step < steps:
            # Every host-side action below happens at the end of a call: call_end stops a call
            # at each step where one is due, so the checks below see the same steps as with K=1.
            last = self._call_end(step, start_step)
            self.profile.before_step(step + 1)
            self.preemption.before_step()
            if self._in_calls is None:
                self.train_step(iterator, last - step)
            else:
                called = time.perf_counter()
                self.train_step(iterator, last - step)
                self._in_calls += time.perf_counter() - called
            step = last
            if step == start_step + 1:
                self.window.steps.numpy()  # wait for the step: the first one traces and connects
                log("worker: first step done")
                self.progress.write(step=step)  # the supervisor starts standbys only after it
                self._restart_window(step)
            if self.profile.ends_at(step):
                self.window.steps.numpy()  # the trace must contain the step's ops, so wait
                self.profile.export(step)
            if step % self.config.log_every == 0 or step == steps:
                self._log(step)
            if step % self.config.checkpoint_every == 0 or step == steps:
                self._save(step, wait=step == steps)  # the last one is on disk before the exit
            # After the save: an evaluation that fails loses no training.
            if self._evaluates_at(step):
                self._evaluate(step)
            # The last step ends the run anyway, with its checkpoint and exit 0.
            if step < steps and self.preemption.agreed_at(step):
                self._stop(step)
        self.summaries.close()
        self.saver.close()
        self.progress.write(step=steps)
        log(f"worker: finished at step {steps}")
        return steps

    def _save(self, step: int, *, wait: bool) -> None:
        """A checkpoint, its blocked seconds added to the progress file's (goodput)."""
        started = time.perf_counter()
        self.saver.save(step, wait=wait)
        blocked = time.perf_counter() - started
        log(f"worker: saved checkpoint at step {step} (blocked {blocked:.3f} s)")
        self.progress.add_seconds(CHECKPOINT_SECONDS, blocked, step=step)

    def _written(self, step: int) -> None:
        self.progress.write(checkpoint_step=step)

    def _call_end(self, step: int, start_step: int) -> int:
        config = self.config
        stops = (start_step + 1, config.steps, *self.profile.boundaries())
        intervals = [config.log_every, config.checkpoint_every, self.preemption.check_every]
        if self.evaluator is not None and config.eval_every is not None:
            intervals.append(config.eval_every)
        return call_end(step, config.steps_per_call, stops, tuple(intervals))

    def _evaluates_at(self, step: int) -> bool:
        every = self.config.eval_every
        return self.evaluator is not None and (
            step == self.config.steps or (every is not None and step % every == 0)
        )

    def _evaluate(self, step: int) -> EvalResult:
        """On every worker at the same step: the evaluation runs collectives."""
        assert self.evaluator is not None
        started = time.perf_counter()
        result = self.evaluator.evaluate()
        log(
            f"eval step {step} val_loss {_fmt(result.loss, 4)} val_accuracy "
            f"{_fmt(result.accuracy, 4)} examples {result.examples} "
            f"seconds {time.perf_counter() - started:.1f}"
        )
        self.summaries.scalars(step, {"val_loss": result.loss, "val_accuracy": result.accuracy})
        self.progress.add_seconds(EVAL_SECONDS, time.perf_counter() - started,
                                  val_loss=result.loss, val_accuracy=result.accuracy,
                                  eval_step=step)  # fmt: skip
        # The evaluation's time is not the steps': start the next rate window afresh.
        self._restart_window(step)
        return result

    def _stop(self, step: int) -> None:
        """Every worker gets here at the same step: the save is collective like the others."""
        started = time.perf_counter()
        if self.saver.saved_step != step:
            self.saver.save(step, wait=True)  # the preemption's save is on disk before the exit
        self.saver.close()  # an earlier one written in the background too
        self.progress.add_seconds(CHECKPOINT_SECONDS, time.perf_counter() - started)
        log(f"worker: preempted: saved checkpoint at step {step}")
        self.summaries.close()
        self.progress.write(step=step, checkpoint_step=step, preempted=True)
        raise Preempted(step)

    def _restart_window(self, step: int) -> None:
        self._mark = (step, time.perf_counter())
        if self._in_calls is not None:
            self._in_calls = 0.0

    def _log(self, step: int) -> None:
        loss, accuracy = self.window.read_and_reset(self.with_accuracy)
        mark_step, mark_time = self._mark
        now = time.perf_counter()
        rate = (step - mark_step) / (now - mark_time) if step > mark_step else None
        timing = {}
        if self._in_calls is not None and rate is not None:
            steps = step - mark_step
            timing = {STEP_CALL_SECONDS: self._in_calls / steps, STEP_SECONDS: 1 / rate}
        self._restart_window(step)
        log(
            f"step {step} loss {_fmt(loss, 4)} accuracy {_fmt(accuracy, 4)} steps/s {_fmt(rate, 1)}"
        )
        self.summaries.scalars(
            step,
            {
                "loss": loss,
                "accuracy": accuracy,
                "learning_rate": self.learning_rate(),
                "steps_per_sec": rate,
                "examples_per_sec": None if rate is None else rate * self.config.batch_size,
            },
        )
        self.progress.write(step=step, loss=loss, accuracy=accuracy, steps_per_sec=rate, **timing)


def timing_enabled() -> bool:
    """The step calls are timed (two clock reads per call) unless the bench turns it off."""
    return os.environ.get(STEP_TIMING_ENV) != "0"


def _fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


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
    """The first progress write: every key present, the values known before any step."""
    progress.write(
        step=start_step,
        start_step=start_step,
        target_steps=config.steps,
        loss=None,
        accuracy=None,
        checkpoint_step=restored_step,
        steps_per_sec=None,
        task_index=config.cluster.task_index,
        num_workers=config.cluster.num_workers,
        devices=device_names(config.cluster.task_index),
        num_replicas=num_replicas,
        preempted=False,
        val_loss=None,
        val_accuracy=None,
        eval_step=None,
        # Goodput: the built-in loop measures both (0 so far), a script may not (unknown).
        **{
            STEP_CALL_SECONDS: None,
            STEP_SECONDS: None,
            FIRST_STEP_AT: None,
            CHECKPOINT_AT: None,
            CHECKPOINT_SECONDS: 0.0,
            EVAL_SECONDS: 0.0,
        },
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
    final_step = loop.run(iter(dist_dataset), start_step)
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

"""`python -m worker.evaluate --watch`: the evaluator task, the TensorFlow side of
worker.evaluator_watch.

Runs on one process with TensorFlow's default strategy (never a cluster, whatever TF_CONFIG says:
an "evaluator" TF_CONFIG is accepted and removed before TensorFlow starts). The task's model is
built once; each checkpoint the watch picks is restored into it and evaluated over the task's
whole eval dataset by worker.sharded_eval's Evaluator, the code the training loop evaluates with.
Each result goes to the log (stdout), to TensorBoard (scalars val_loss and val_accuracy at the
checkpoint's step, in the `eval` run beside the training's events) and to the progress file
($ORCHESTRATE_PROGRESS_FILE: step, eval_step, val_loss, val_accuracy, evaluated, skipped,
checkpoint; one history line per evaluation for the dashboard's curve). The last line on stdout is
one JSON object: how it ended and the last evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from collections.abc import Mapping
from typing import Any

from orchestrator.contract import (
    EVALUATED_CHECKPOINT,
    EXIT_OK,
    PROGRESS_FILE_ENV,
    RUN_DIR_ENV,
    STEP,
    TF_CONFIG_ENV,
    VAL_ACCURACY,
    VAL_LOSS,
    register_stack_dump,
)
from worker.evaluator_watch import (
    DEFAULT_POLL_SECONDS,
    EVALUATOR_TASK_TYPE,
    Outcome,
    Tally,
    Watch,
    default_tensorboard_dir,
    tf_config_problem,
)
from worker.output import log
from worker.progress import ProgressWriter
from worker.restore import UsageError, available_checkpoints, check_keras, zeros_batch
from worker.task import TrainingTask, load_task


def check_watch_args(args: argparse.Namespace) -> None:
    if args.steps is None:
        raise UsageError("--watch needs --steps N: the training's final step")
    if args.steps < 1:
        raise UsageError(f"--steps must be a positive integer, got {args.steps}")
    if args.checkpoint is not None:
        raise UsageError("--checkpoint names one checkpoint; --watch evaluates each newest one")
    if args.poll is None:
        args.poll = DEFAULT_POLL_SECONDS
    if not args.poll > 0:
        raise UsageError(f"--poll must be a positive number of seconds, got {args.poll}")
    problem = tf_config_problem(os.environ)
    if problem:
        raise UsageError(problem)


def watch(args: argparse.Namespace) -> int:
    """Raises UsageError, TaskError (exit 2), WatchError or TensorFlow's errors (exit 1)."""
    check_watch_args(args)
    os.environ.pop(TF_CONFIG_ENV, None)  # one process: nothing may build a cluster from it
    register_stack_dump(os.environ.get(RUN_DIR_ENV))
    stop = threading.Event()
    _on_sigterm(stop)
    task = load_task(args.task)
    if task.eval_dataset is None:
        raise UsageError(f"task {args.task!r} has no eval_dataset to evaluate")
    checkpoint_dir, tensorboard_dir = _directories(args)
    from worker.summaries import Summaries

    checkpoint, evaluator = _build(task, args.batch_size)
    _on_sigterm(stop)  # again: nothing TensorFlow started may have replaced it
    progress = ProgressWriter(os.environ.get(PROGRESS_FILE_ENV))
    progress.write(
        role=EVALUATOR_TASK_TYPE, step=0, target_steps=args.steps, examples=evaluator.examples,
        val_loss=None, val_accuracy=None, **Tally().fields(),
    )  # fmt: skip
    summaries = Summaries(tensorboard_dir, is_chief=True)
    last: dict[str, Any] = {}

    def evaluate(name: str) -> Mapping[str, Any]:
        check_keras(checkpoint_dir)
        # expect_partial: the optimizer's values stay in the file, unused.
        checkpoint.restore(
            os.path.join(checkpoint_dir, name)
        ).assert_existing_objects_matched().expect_partial()
        return evaluator.evaluate().as_dict()

    def report(name: str, at: int, metrics: Mapping[str, Any], tally: Tally) -> None:
        loss, accuracy = metrics[VAL_LOSS], metrics[VAL_ACCURACY]
        log(
            f"evaluator: {name} step {at} val_loss {loss:.4f} val_accuracy "
            + ("-" if accuracy is None else f"{accuracy:.4f}")
            + f" examples {metrics['examples']} evaluated {tally.evaluated} skipped {tally.skipped}"
        )
        summaries.scalars(at, {VAL_LOSS: loss, VAL_ACCURACY: accuracy})
        summaries.flush()
        progress.write(step=at, val_loss=loss, val_accuracy=accuracy, **tally.fields())
        last.update({EVALUATED_CHECKPOINT: name, STEP: at, **metrics})

    log(
        f"evaluator: watching {checkpoint_dir} up to step {args.steps}, evaluating "
        f"{evaluator.examples} examples in {evaluator.steps} steps; TensorBoard: {tensorboard_dir}"
    )
    try:
        outcome = Watch(
            checkpoint_dir, args.steps, list_checkpoints=available_checkpoints,
            evaluate=evaluate, report=report, log=log, stop=stop, poll_seconds=args.poll,
            fatal=(UsageError,),
        ).run()  # fmt: skip
    finally:
        summaries.close()
    _ended(outcome, last)
    return EXIT_OK


def _directories(args: argparse.Namespace) -> tuple[str, str]:
    """The checkpoint directory watched, its checkpoints' Keras checked, and where the val
    metrics go."""
    checkpoint_dir = os.path.abspath(os.path.expanduser(args.checkpoint_dir))
    # Checkpoints of the other Keras never restore: refused now if the chief's marker says so,
    # else at the first checkpoint (the marker is written before it).
    if available_checkpoints(checkpoint_dir):
        check_keras(checkpoint_dir)
    tensorboard_dir = (
        os.path.abspath(os.path.expanduser(args.tensorboard_dir))
        if args.tensorboard_dir
        else default_tensorboard_dir(checkpoint_dir)
    )
    return checkpoint_dir, tensorboard_dir


def _build(task: TrainingTask, batch_size: int) -> tuple[Any, Any]:
    """The task's model with every variable created, the checkpoint that restores into it (the
    model and the step) and the Evaluator over the task's whole eval dataset."""
    import tensorflow as tf

    from worker.sharded_eval import Evaluator

    assert task.eval_dataset is not None
    dataset = task.eval_dataset()
    model = task.model()
    model(zeros_batch(dataset.element_spec[0]), training=False)  # creates every variable
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    checkpoint = tf.train.Checkpoint(model=model, step=step)
    evaluator = Evaluator(
        tf.distribute.get_strategy(), model, task, dataset, per_replica_batch=batch_size
    )
    return checkpoint, evaluator


def _ended(outcome: Outcome, last: Mapping[str, Any]) -> None:
    """The log's last line, and stdout's: one JSON object, how it ended and the last evaluation."""
    tally = outcome.tally
    log(
        f"evaluator: {'final checkpoint evaluated' if outcome.how == 'final' else 'stopped'}: "
        f"evaluated {tally.evaluated}, skipped {tally.skipped}"
    )
    print(
        json.dumps({"outcome": outcome.how, "evaluated": tally.evaluated,
                    "skipped": tally.skipped, **last}),
        flush=True,
    )  # fmt: skip


def _on_sigterm(stop: threading.Event) -> None:
    """SIGTERM (the supervisor's stop) and a first Ctrl-C: finish, evaluate the newest, exit 0.
    A second Ctrl-C interrupts at once."""

    def handle(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT and stop.is_set():
            raise KeyboardInterrupt
        stop.set()  # no print here: a handler writing to stdout mid-write would raise

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)

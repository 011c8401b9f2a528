"""Evaluate a checkpoint of a task on one process and print the metrics as one JSON object.

    python -m worker.evaluate --task worker.examples.shapes:task \\
        --checkpoint-dir ~/orchestrate/shapes/checkpoints [--checkpoint ckpt-300]

Or, with --watch, be the evaluator task beside a training (worker.evaluator_watch decides what
to evaluate):

    python -m worker.evaluate --watch --task MODULE:FUNCTION --checkpoint-dir DIR --steps N \\
        [--batch-size B] [--poll SECONDS] [--tensorboard-dir DIR]

evaluates each newest checkpoint of the chief as it appears, writes val_loss and val_accuracy to
TensorBoard (DIR/../tensorboard/eval by default) and to $ORCHESTRATE_PROGRESS_FILE (with the
counts evaluated and skipped), and exits 0 once it has evaluated the checkpoint of step N, or on
SIGTERM after finishing the evaluation under way and evaluating the newest checkpoint not
evaluated yet. A TF_CONFIG of task type "evaluator" is accepted (and removed from the
environment before TensorFlow starts: it evaluates on this process alone, no cluster).

Builds the task's model, restores the checkpoint (the latest by default; worker.restore), runs
the task's whole eval dataset through it with the same code the training loop evaluates with
(worker.sharded_eval: every example counted once, example-weighted), and prints
{"checkpoint", "step", "examples", "val_loss", "val_accuracy"}. So it reports what the run's final
evaluation reported for the final checkpoint, up to float rounding.

Exit codes: 0 success; 1 an error while evaluating (the traceback); 2 a user mistake (a bad flag,
a task that cannot be loaded or has no eval_dataset, no such checkpoint, a TF_CONFIG of another
task type; one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from orchestrator.contract import (
    EVALUATED_CHECKPOINT,
    EXIT_OK,
    EXIT_TRAINING_ERROR,
    EXIT_USAGE,
    FLAG_BATCH_SIZE,
    FLAG_CHECKPOINT_DIR,
    FLAG_STEPS,
    FLAG_TASK,
    FLAG_WATCH,
    STEP,
    task_problem,
)
from worker.evaluator_watch import DEFAULT_POLL_SECONDS
from worker.restore import CheckpointNotFound, UsageError, check_keras, checkpoint_path
from worker.task import TaskError, load_task

DEFAULT_BATCH_SIZE = 64


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, like the worker's own command line
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m worker.evaluate",
        description="Restore a checkpoint into a task's model, evaluate the task's eval_dataset "
        "on this process, print the metrics as JSON.",
    )
    parser.add_argument(
        FLAG_TASK,
        required=True,
        metavar="MODULE:FUNCTION",
        help="function returning a worker.task.TrainingTask with an eval_dataset",
    )
    parser.add_argument(
        FLAG_CHECKPOINT_DIR, required=True, metavar="DIR", help="the run's checkpoint directory"
    )
    parser.add_argument(
        "--checkpoint",
        metavar="NAME",
        help="the checkpoint to restore, such as ckpt-300 (default: the latest)",
    )
    parser.add_argument(
        FLAG_WATCH,
        action="store_true",
        help="the evaluator task: evaluate each newest checkpoint as it appears, until the one "
        "of --steps (or SIGTERM)",
    )
    parser.add_argument(
        FLAG_STEPS,
        type=int,
        metavar="N",
        help="with --watch: the training's final step; exit after evaluating its checkpoint",
    )
    parser.add_argument(
        "--poll",
        type=float,
        metavar="SECONDS",
        help="with --watch: seconds between looks at the checkpoint directory (default: "
        f"{DEFAULT_POLL_SECONDS:g})",
    )
    parser.add_argument(
        "--tensorboard-dir",
        metavar="DIR",
        help="with --watch: where the val metrics go (default: 'tensorboard/eval' beside the "
        "checkpoint directory)",
    )
    parser.add_argument(
        FLAG_BATCH_SIZE,
        type=int,
        default=DEFAULT_BATCH_SIZE,
        metavar="B",
        help="examples per batch; the metrics do not depend on it",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(list(argv))
        if task_problem(args.task):
            raise UsageError(f"--task must look like MODULE:FUNCTION, got {args.task!r}")
        if args.batch_size < 1:
            raise UsageError(f"--batch-size must be a positive integer, got {args.batch_size}")
        if args.watch:
            from worker.evaluator_task import watch

            return watch(args)
        check_one_shot(args)
        path = checkpoint_path(args.checkpoint_dir, args.checkpoint)  # before TensorFlow: fast
        check_keras(os.path.dirname(path))
        task = load_task(args.task)
        if task.eval_dataset is None:
            raise UsageError(f"task {args.task!r} has no eval_dataset to evaluate")
        from worker.restore import restore
        from worker.sharded_eval import Evaluator

        restored = restore(task, args.checkpoint_dir, args.checkpoint)
        import tensorflow as tf

        evaluator = Evaluator(
            tf.distribute.get_strategy(),
            restored.model,
            task,
            task.eval_dataset(),
            per_replica_batch=args.batch_size,
        )
        result = evaluator.evaluate()
    except (UsageError, CheckpointNotFound, TaskError) as exc:
        print(f"worker.evaluate: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Exception:
        traceback.print_exc()
        return EXIT_TRAINING_ERROR
    name = os.path.basename(path)
    printed = {EVALUATED_CHECKPOINT: name, STEP: restored.step, **result.as_dict()}
    print(json.dumps(printed), flush=True)
    return EXIT_OK


def check_one_shot(args: argparse.Namespace) -> None:
    watch_only = {
        FLAG_STEPS: args.steps,
        "--poll": args.poll,
        "--tensorboard-dir": args.tensorboard_dir,
    }
    for flag, value in watch_only.items():
        if value is not None:
            raise UsageError(f"{flag} goes with --watch")


if __name__ == "__main__":
    sys.exit(main())

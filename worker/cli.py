"""Command line of the worker, and the one place that picks its exit code.

Exit codes:
  0   success.
  1   an error while training: the traceback.
  2   a user mistake found before training (bad flag, bad environment, task that cannot be loaded,
      a device setting this host cannot honour): one line on stderr, no traceback.
  75  stopped on SIGTERM after saving a checkpoint; run again to resume (EX_TEMPFAIL of
      sysexits.h). In a cluster every worker stops at the same step with this code, whichever of
      them got the signal (worker.preemption).
TensorFlow is imported only once the configuration and the task are known to be good, so mistakes
are reported in well under a second.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import NoReturn

from orchestrator.contract import (
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_TRAINING_ERROR,
    EXIT_USAGE,
    EXPORT_FORMATS,
    FLAG_BATCH_SIZE,
    FLAG_CHECKPOINT_DIR,
    FLAG_CHECKPOINT_EVERY,
    FLAG_EVAL_EVERY,
    FLAG_EXPORT,
    FLAG_EXPORT_DIR,
    FLAG_GPU_MEMORY_GROWTH,
    FLAG_GPU_MEMORY_LIMIT_MB,
    FLAG_LOG_EVERY,
    FLAG_LOGICAL_GPUS,
    FLAG_MAX_TO_KEEP,
    FLAG_PROFILE_STEPS,
    FLAG_SEED,
    FLAG_STEPS,
    FLAG_STEPS_PER_CALL,
    FLAG_STRATEGY,
    FLAG_SYNC_CHECKPOINTS,
    FLAG_TASK,
    FLAG_VISIBLE_GPUS,
    KERAS_BACKEND_ENV,
    KERAS_JAX,
)
from worker import config as cfg
from worker.preemption import Preempted
from worker.task import TaskError, TrainingTask, load_task


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing usage and exiting.

    argparse's own error() prints a usage block and the message on two or more lines; the controller
    shows the worker's stderr to the user, so one line naming the problem reads better.
    """

    def error(self, message: str) -> NoReturn:
        raise cfg.ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    # The order of the calls is the order of --help.
    parser = _Parser(
        prog="python -m worker",
        description="Run one worker for a TrainingTask: MultiWorkerMirroredStrategy with "
        "TF_CONFIG from the environment, or MirroredStrategy on this host alone.",
    )
    parser.add_argument(
        FLAG_TASK,
        required=True,
        metavar="MODULE:FUNCTION",
        help="function returning a worker.task.TrainingTask",
    )
    parser.add_argument(FLAG_STEPS, required=True, type=int, help="train until this global step")
    _add_checkpoint_flags(parser)
    _add_loop_flags(parser)
    _add_strategy_and_trace_flags(parser)
    _add_eval_flags(parser)
    _add_device_flags(parser)
    return parser


def _add_checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        FLAG_CHECKPOINT_DIR,
        metavar="DIR",
        help=f"default: ${cfg.RUN_DIR_ENV}/checkpoints, else ./checkpoints",
    )
    parser.add_argument(
        FLAG_CHECKPOINT_EVERY,
        type=int,
        default=cfg.DEFAULT_CHECKPOINT_EVERY,
        metavar="K",
        help="save every K steps and at the last step",
    )
    parser.add_argument(
        FLAG_MAX_TO_KEEP,
        type=int,
        default=cfg.DEFAULT_MAX_TO_KEEP,
        metavar="M",
        help="checkpoints the chief keeps",
    )
    parser.add_argument(
        FLAG_SYNC_CHECKPOINTS,
        action="store_true",
        help="every save blocks the step loop until its files are written (by default a save "
        "returns once the values are copied and TensorFlow writes them in the background; the "
        "last save and a preemption's always block)",
    )


def _add_loop_flags(parser: argparse.ArgumentParser) -> None:
    """How the training loop steps: batch, logging, preemption checks, seed, steps per call."""
    parser.add_argument(
        FLAG_BATCH_SIZE,
        type=int,
        default=cfg.DEFAULT_BATCH_SIZE,
        metavar="B",
        help="GLOBAL batch size, split evenly over the replicas (all workers' devices)",
    )
    parser.add_argument(
        FLAG_LOG_EVERY,
        type=int,
        default=cfg.DEFAULT_LOG_EVERY,
        metavar="L",
        help="log, write progress and summaries every L steps",
    )
    parser.add_argument(
        "--preemption-check-every",
        type=int,
        default=cfg.DEFAULT_PREEMPTION_CHECK_EVERY,
        metavar="P",
        help="every P steps all workers check whether any got SIGTERM; if one did, all save a "
        f"checkpoint at that step and exit {EXIT_PREEMPTED} (rounded up to a multiple of K)",
    )
    parser.add_argument(
        FLAG_SEED,
        type=int,
        metavar="S",
        help="seed the model's initial weights (Python, NumPy, TensorFlow, Keras): runs with the "
        "same seed and settings train alike",
    )
    parser.add_argument(
        FLAG_STEPS_PER_CALL,
        type=int,
        default=cfg.DEFAULT_STEPS_PER_CALL,
        metavar="K",
        help="run K steps inside one tf.function call (same numerics, less Python per step); "
        "L, the checkpoint interval and the eval interval must be multiples of K",
    )


def _add_strategy_and_trace_flags(parser: argparse.ArgumentParser) -> None:
    """The TensorBoard directory, the strategy and profiling (kept together for --help's order)."""
    parser.add_argument(
        "--tensorboard-dir",
        metavar="DIR",
        help="default: 'tensorboard' next to the checkpoint directory",
    )
    parser.add_argument(
        FLAG_STRATEGY,
        choices=cfg.STRATEGIES,
        default=cfg.STRATEGY_MULTI_WORKER,
        help="multi-worker: MultiWorkerMirroredStrategy over TF_CONFIG's cluster (default); "
        "mirrored: MirroredStrategy over this host's devices only (no TF_CONFIG); "
        "parameter-server: ParameterServerStrategy, the chief's ClusterCoordinator sends the "
        "steps to the workers, the ps hold the variables, worker and ps tasks only serve",
    )
    parser.add_argument(
        FLAG_PROFILE_STEPS,
        nargs=2,
        type=int,
        metavar=("START", "END"),
        help="the chief traces steps START..END (graph and profiler) into the TensorBoard dir",
    )


def _add_eval_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "evaluation and export",
        "a task with an eval_dataset is evaluated over all of it after the last step "
        "(val_loss, val_accuracy in the log, progress and TensorBoard)",
    )
    group.add_argument(
        FLAG_EVAL_EVERY,
        type=int,
        metavar="E",
        help="also evaluate every E steps, on every worker together (needs an eval_dataset)",
    )
    group.add_argument(
        FLAG_EXPORT,
        choices=EXPORT_FORMATS,
        help="at the end of a successful run write the model to --export-dir: keras (the full "
        "model, model.keras) or saved_model (an inference SavedModel, saved_model/)",
    )
    group.add_argument(
        FLAG_EXPORT_DIR,
        metavar="DIR",
        help="default: 'export' next to the checkpoint directory; replaced whole by each export",
    )


def _add_device_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "devices",
        "applied with tf.config before the strategy; GPU flags are ignored, with a "
        "warning, on a host without GPU",
    )
    group.add_argument(
        FLAG_GPU_MEMORY_GROWTH,
        action="store_true",
        help="allocate GPU memory as needed instead of all of it at start",
    )
    group.add_argument(
        FLAG_GPU_MEMORY_LIMIT_MB, type=int, metavar="N", help="cap each (logical) GPU at N MiB"
    )
    group.add_argument(
        FLAG_VISIBLE_GPUS, metavar="LIST", help="comma-separated GPU indices to use, e.g. 0,1"
    )
    group.add_argument(
        FLAG_LOGICAL_GPUS,
        type=int,
        metavar="K",
        help="split each visible GPU into K logical GPUs of --gpu-memory-limit-mb each",
    )
    group.add_argument(
        "--logical-cpus",
        type=int,
        metavar="K",
        help="split the CPU into K logical devices (for testing multi-device code on a CPU host)",
    )


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> cfg.WorkerConfig:
    """Flags and environment to a checked WorkerConfig; raises ConfigError on any mistake."""
    args = build_parser().parse_args(list(argv))
    return cfg.from_args(args, env)


def check_task_fits(config: cfg.WorkerConfig, task: TrainingTask) -> None:
    """Flags that need something of the task."""
    if config.eval_every is not None and task.eval_dataset is None:
        raise cfg.ConfigError(
            f"--eval-every {config.eval_every}: task {config.task!r} has no eval_dataset; add "
            "TrainingTask(eval_dataset=...) or drop eval_every"
        )


# What the training raised, kept with its traceback until the process exits (worker/__main__
# leaves with os._exit). The traceback's frames hold the loop's distributed dataset iterators;
# freeing them as main returned ran TensorFlow's iterator destructors, which blocked until the
# stop's SIGKILL (a worker that took over a standby, preempted by `down`: "killed" after the 10 s
# grace, its checkpoint saved).
_RAISED: list[BaseException] = []


def main(argv: Sequence[str] | None = None) -> int:
    # -h/--help still prints and exits 0 through argparse's own SystemExit.
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = parse_config(argv, os.environ)
        if config.cluster.serves:  # a ParameterServerStrategy worker or ps: the chief steps
            return _serve(config)
        task = load_task(config.task)
        check_task_fits(config, task)
    except (cfg.ConfigError, TaskError) as exc:
        print(f"worker: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    try:
        _train(config, task)
    except (cfg.ConfigError, TaskError) as exc:
        # A setting only the host can refute (a GPU index it lacks, a batch that does not split
        # over its devices), or a dataset that only TensorFlow can measure (an infinite or empty
        # eval dataset): still a user mistake, found before the first step.
        print(f"worker: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Preempted as exc:
        _RAISED.append(exc)
        return EXIT_PREEMPTED  # the loop has logged the step and written the progress file
    except Exception as exc:
        _RAISED.append(exc)
        traceback.print_exc()
        sys.stderr.flush()
        return EXIT_TRAINING_ERROR
    return EXIT_OK


def _train(config: cfg.WorkerConfig, task: TrainingTask) -> None:
    """The loop of the config's strategy; TensorFlow is imported only now that the inputs are
    known to be good."""
    if os.environ.get(KERAS_BACKEND_ENV) == KERAS_JAX:  # job.keras: jax: no TensorFlow at all
        from worker import jaxloop

        jaxloop.run(config, task)
    elif config.cluster.parameter_server:
        from worker import parameter_server

        parameter_server.run(config, task)
    else:
        from worker import mirrored

        mirrored.run(config, task)


def _serve(config: cfg.WorkerConfig) -> int:
    """A ParameterServerStrategy worker or ps task: its server, until it is stopped (never
    returns in a run: the chief's end stops it)."""
    from worker import parameter_server

    parameter_server.serve(config)
    return EXIT_OK

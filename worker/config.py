"""The worker's configuration: parsed flags plus environment, checked once, frozen.

Pure on purpose: no TensorFlow, no writes, and the environment is passed in rather than read from
os.environ, so every rule here is unit-tested without starting a process. The only ambient input is
the current directory, through os.path.abspath.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

# Environment variables the controller sets on each worker process.
TF_CONFIG_ENV = "TF_CONFIG"
PROGRESS_FILE_ENV = "ORCHESTRATE_PROGRESS_FILE"
RUN_DIR_ENV = "ORCHESTRATE_RUN_DIR"

DEFAULT_CHECKPOINT_EVERY = 100
DEFAULT_MAX_TO_KEEP = 3
DEFAULT_BATCH_SIZE = 64
DEFAULT_LOG_EVERY = 10

# MODULE:FUNCTION, where MODULE is a dotted Python name and FUNCTION an identifier.
_TASK_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


class ConfigError(ValueError):
    """A flag or environment variable the worker cannot use; the message names it and the value."""


@dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the cluster, as TF_CONFIG describes it."""

    task_index: int = 0
    num_workers: int = 1

    @property
    def is_chief(self) -> bool:
        # With only "worker" tasks, MultiWorkerMirroredStrategy makes worker 0 the chief.
        return self.task_index == 0


@dataclass(frozen=True)
class WorkerConfig:
    """Everything the training loop needs to know besides the task itself. Paths are absolute."""

    task: str
    steps: int
    checkpoint_dir: str
    tensorboard_dir: str
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    max_to_keep: int = DEFAULT_MAX_TO_KEEP
    batch_size: int = DEFAULT_BATCH_SIZE
    log_every: int = DEFAULT_LOG_EVERY
    progress_file: str | None = None
    # Where non-chief workers write their throw-away checkpoints; None: a fresh tempfile.mkdtemp.
    temp_checkpoint_dir: str | None = None
    cluster: ClusterInfo = ClusterInfo()


def parse_tf_config(text: str | None) -> ClusterInfo:
    """Reads task index and worker count from TF_CONFIG; absent or empty means a lone worker."""
    if text is None or not text.strip():
        return ClusterInfo()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({exc.msg}): {text!r}") from exc
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    task = spec.get("task") if isinstance(spec, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ConfigError(f"TF_CONFIG needs 'cluster' and 'task' objects: {text!r}")
    workers = cluster.get("worker")
    if not isinstance(workers, list) or not workers:
        raise ConfigError(f"TF_CONFIG cluster needs a non-empty 'worker' list: {text!r}")
    # Only plain worker clusters: the controller never writes 'chief' or 'evaluator' tasks, and
    # accepting them would make task_index ambiguous in the progress file.
    other_roles = sorted(set(cluster) - {"worker"})
    if other_roles or task.get("type") != "worker":
        raise ConfigError(f"TF_CONFIG: only 'worker' tasks are supported: {text!r}")
    index = task.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(workers):
        raise ConfigError(
            f"TF_CONFIG task index must be an integer in 0..{len(workers) - 1}, got {index!r}"
        )
    return ClusterInfo(task_index=index, num_workers=len(workers))


def from_args(args: argparse.Namespace, env: Mapping[str, str]) -> WorkerConfig:
    """Checks the parsed flags against each other and the environment, and fills in defaults."""
    if not _TASK_SPEC.match(args.task):
        raise ConfigError(f"--task must look like MODULE:FUNCTION, got {args.task!r}")
    for flag in ("steps", "checkpoint_every", "max_to_keep", "batch_size", "log_every"):
        _require_positive(flag, getattr(args, flag))
    cluster = parse_tf_config(env.get(TF_CONFIG_ENV))
    # Every worker takes the same share of the global batch; TensorFlow would fail later and less
    # clearly (get_per_replica_batch_size) if the split is uneven.
    if args.batch_size % cluster.num_workers:
        raise ConfigError(
            f"--batch-size {args.batch_size} is the global batch size and must be divisible by "
            f"the number of workers ({cluster.num_workers})"
        )
    run_dir = _abspath(env.get(RUN_DIR_ENV))
    checkpoint_dir = _abspath(args.checkpoint_dir) or _default_checkpoint_dir(run_dir)
    tensorboard_dir = _abspath(args.tensorboard_dir) or os.path.join(
        os.path.dirname(checkpoint_dir), "tensorboard"
    )
    temp_dir = None
    if run_dir is not None:
        # One subdirectory per task index, in case several workers share a run directory.
        temp_dir = os.path.join(run_dir, "tmp-checkpoints", f"worker-{cluster.task_index}")
    return WorkerConfig(
        task=args.task,
        steps=args.steps,
        checkpoint_dir=checkpoint_dir,
        tensorboard_dir=tensorboard_dir,
        checkpoint_every=args.checkpoint_every,
        max_to_keep=args.max_to_keep,
        batch_size=args.batch_size,
        log_every=args.log_every,
        progress_file=_abspath(env.get(PROGRESS_FILE_ENV)),
        temp_checkpoint_dir=temp_dir,
        cluster=cluster,
    )


def _require_positive(flag: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")


def _abspath(path: str | None) -> str | None:
    # An empty variable counts as unset: `export X=` is a common way to "turn something off".
    return os.path.abspath(path) if path else None


def _default_checkpoint_dir(run_dir: str | None) -> str:
    return os.path.join(run_dir, "checkpoints") if run_dir else os.path.abspath("checkpoints")

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Environment variables the controller sets on each worker process, and the task syntax: one
# definition shared with the controller, which validates the inventory against the same rules.
from orchestrator.contract import (
    CLUSTER_ORDER,
    DEFAULT_BATCH_SIZE,
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_LOG_EVERY,
    DEFAULT_MAX_TO_KEEP,
    DEFAULT_STEPS_PER_CALL,
    EXPORT_DIR_NAME,
    EXPORT_FORMATS,
    PROGRESS_FILE_ENV,
    ROLE_CHIEF,
    ROLE_EVALUATOR,
    ROLE_WORKER,
    RUN_DIR_ENV,
    STRATEGIES,
    STRATEGY_MIRRORED,
    STRATEGY_MULTI_WORKER,
    STRATEGY_PS,
    TENSORBOARD_DIR_NAME,
    TF_CLUSTER,
    TF_CONFIG_ENV,
    TF_INDEX,
    TF_TASK,
    TF_TYPE,
    device_setting_problems,
    task_problem,
)

# The defaults the inventory shares (checkpoint_every, batch_size...) are contract.py's.

# Steps between the checks whether any worker got SIGTERM (worker.preemption.Preemption). A
# check only reads a sum the steps reduce anyway; it costs a wait for the device, and a stop
# comes at most this many steps after the signal. Like --checkpoint-every, the same on every worker.
DEFAULT_PREEMPTION_CHECK_EVERY = 10

# The distribution strategies the worker can run under: contract.py's STRATEGIES.
# ParameterServerStrategy: the chief drives a ClusterCoordinator (worker.parameter_server);
# worker and ps tasks only serve.
PS_TASK_TYPES = CLUSTER_ORDER  # (contract.py names the strategies and task types)


class ConfigError(ValueError):
    """A flag or environment variable the worker cannot use; the message names it and the value."""


@dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the cluster, as TF_CONFIG describes it."""

    task_index: int = 0
    num_workers: int = 1
    task_type: str = "worker"  # "chief" or "ps" too under ParameterServerStrategy
    parameter_server: bool = False  # a chief, ps and workers (--strategy parameter-server)

    @property
    def is_chief(self) -> bool:
        if self.parameter_server:
            return self.task_type == "chief"
        # With only "worker" tasks, MultiWorkerMirroredStrategy makes worker 0 the chief.
        return self.task_index == 0

    @property
    def serves(self) -> bool:
        """A ParameterServerStrategy worker or ps: it runs a server until it is stopped, while
        the chief's ClusterCoordinator sends it the steps (worker) or keeps variables on it."""
        return self.parameter_server and self.task_type != "chief"


@dataclass(frozen=True)
class DeviceSettings:
    """tf.config settings applied before the strategy exists (see worker.devices).

    None or False means "leave TensorFlow's default". Checked by check_device_settings.
    """

    memory_growth: bool = False
    memory_limit_mb: int | None = None
    visible_gpus: tuple[int, ...] | None = None
    logical_gpus: int | None = None
    logical_cpus: int | None = None

    def gpu_flags(self) -> list[str]:
        """The GPU flags as given on the command line; empty when no GPU setting was asked for."""
        flags = []
        if self.memory_growth:
            flags.append("--gpu-memory-growth")
        if self.memory_limit_mb is not None:
            flags.append(f"--gpu-memory-limit-mb {self.memory_limit_mb}")
        if self.visible_gpus is not None:
            flags.append(f"--visible-gpus {','.join(map(str, self.visible_gpus))}")
        if self.logical_gpus is not None:
            flags.append(f"--logical-gpus {self.logical_gpus}")
        return flags


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
    preemption_check_every: int = DEFAULT_PREEMPTION_CHECK_EVERY
    progress_file: str | None = None
    # Where non-chief workers write their throw-away checkpoints; None: a fresh tempfile.mkdtemp.
    temp_checkpoint_dir: str | None = None
    cluster: ClusterInfo = ClusterInfo()
    strategy: str = STRATEGY_MULTI_WORKER
    # (START, END): trace and profile steps START..END, both included; None: no profiling.
    profile_steps: tuple[int, int] | None = None
    devices: DeviceSettings = DeviceSettings()
    # Evaluate the task's eval dataset every K steps (and always after the last step); None: at
    # the end only. Like --checkpoint-every, the same on every worker: evaluation is collective.
    eval_every: int | None = None
    # "keras" or "saved_model": write the model to export_dir at the end of a successful run.
    export_format: str | None = None
    export_dir: str = ""
    # Where non-chief workers write their throw-away exports; None: a fresh tempfile.mkdtemp.
    temp_export_dir: str | None = None
    # K steps run inside one tf.function call. log_every, checkpoint_every and eval_every are
    # multiples of K (from_args checks it); preemption_check_every is rounded up to one.
    steps_per_call: int = DEFAULT_STEPS_PER_CALL
    # Seeds Python, NumPy, TensorFlow and Keras before the model is built (the same initial
    # weights in every run); None: TensorFlow's default, different weights each run.
    seed: int | None = None
    # Checkpoint writes in the background (TensorFlow's async checkpoint); the last save and a
    # preemption's block either way. False: --sync-checkpoints (job.async_checkpoints: false).
    async_checkpoints: bool = True


def parse_tf_config(text: str | None, strategy: str = STRATEGY_MULTI_WORKER) -> ClusterInfo:
    """Reads task index and worker count from TF_CONFIG; absent or empty means a lone worker
    (not under parameter-server, which needs its chief, ps and workers)."""
    if (text is None or not text.strip()) and strategy == STRATEGY_PS:
        raise ConfigError(f"--strategy {STRATEGY_PS} needs TF_CONFIG with a chief, ps and "
                          "worker tasks (orchestrate writes it from the hosts' roles)")  # fmt: skip
    if text is None or not text.strip():
        return ClusterInfo()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({exc.msg}): {text!r}") from exc
    cluster = spec.get(TF_CLUSTER) if isinstance(spec, dict) else None
    task = spec.get(TF_TASK) if isinstance(spec, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ConfigError(f"TF_CONFIG needs 'cluster' and 'task' objects: {text!r}")
    workers = cluster.get(ROLE_WORKER)
    if not isinstance(workers, list) or not workers:
        raise ConfigError(f"TF_CONFIG cluster needs a non-empty 'worker' list: {text!r}")
    if strategy == STRATEGY_PS:
        return _parameter_server_cluster(cluster, task, text)
    # Under MultiWorkerMirroredStrategy: plain worker clusters only (worker 0 is the chief). An
    # evaluator task runs `python -m worker.evaluate --watch`, outside the cluster; chief and ps
    # tasks are ParameterServerStrategy's (--strategy parameter-server, or a job.script).
    if task.get(TF_TYPE) == ROLE_EVALUATOR:
        raise ConfigError("TF_CONFIG: an 'evaluator' task runs 'python -m worker.evaluate "
                          f"--watch', not the training loop: {text!r}")  # fmt: skip
    other_roles = sorted(set(cluster) - {ROLE_WORKER})
    if other_roles or task.get(TF_TYPE) != ROLE_WORKER:
        raise ConfigError(
            "TF_CONFIG: the training loop under MultiWorkerMirroredStrategy runs only 'worker' "
            f"tasks; chief and ps tasks need --strategy {STRATEGY_PS}: {text!r}"
        )
    index = task.get(TF_INDEX)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(workers):
        raise ConfigError(
            f"TF_CONFIG task index must be an integer in 0..{len(workers) - 1}, got {index!r}"
        )
    return ClusterInfo(task_index=index, num_workers=len(workers))


def _parameter_server_cluster(cluster: dict, task: dict, text: str) -> ClusterInfo:
    """TF_CONFIG under ParameterServerStrategy: one chief, at least one ps and one worker, and
    this task one of them."""
    sizes = {role: cluster.get(role) for role in PS_TASK_TYPES}
    if (
        set(cluster) - set(PS_TASK_TYPES)
        or not all(isinstance(tasks, list) and tasks for tasks in sizes.values())
        or len(sizes[ROLE_CHIEF] or ()) != 1
    ):
        raise ConfigError(f"TF_CONFIG: --strategy {STRATEGY_PS} needs a cluster of one "
                          f"'chief', and 'ps' and 'worker' lists: {text!r}")  # fmt: skip
    kind, index = task.get(TF_TYPE), task.get(TF_INDEX)
    if kind not in PS_TASK_TYPES:
        raise ConfigError(f"TF_CONFIG task type must be one of {', '.join(PS_TASK_TYPES)} "
                          f"under --strategy {STRATEGY_PS}, got {kind!r}")  # fmt: skip
    count = len(cluster[kind])
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ConfigError(
            f"TF_CONFIG task index must be an integer in 0..{count - 1}, got {index!r}"
        )
    return ClusterInfo(task_index=index, num_workers=len(cluster[ROLE_WORKER]), task_type=kind,
                       parameter_server=True)  # fmt: skip


def from_args(args: argparse.Namespace, env: Mapping[str, str]) -> WorkerConfig:
    """Checks the parsed flags against each other and the environment, and fills in defaults."""
    if task_problem(args.task):
        raise ConfigError(f"--task must look like MODULE:FUNCTION, got {args.task!r}")
    check_every, eval_every, steps_per_call = _checked_intervals(args)
    export_format = _checked_export_format(getattr(args, "export", None))
    strategy = getattr(args, "strategy", STRATEGY_MULTI_WORKER)
    if strategy == STRATEGY_PS and steps_per_call > 1:
        raise ConfigError(f"--steps-per-call {steps_per_call}: under --strategy {STRATEGY_PS} "
                          "each step is a closure the chief schedules on a worker; leave it "
                          "at 1")  # fmt: skip
    cluster = _checked_cluster(strategy, env, args.batch_size)
    dirs = _directories(args, env, cluster.task_index)
    return WorkerConfig(
        task=args.task,
        steps=args.steps,
        checkpoint_dir=dirs.checkpoint_dir,
        tensorboard_dir=dirs.tensorboard_dir,
        checkpoint_every=args.checkpoint_every,
        max_to_keep=args.max_to_keep,
        batch_size=args.batch_size,
        log_every=args.log_every,
        preemption_check_every=round_up(check_every, steps_per_call),
        progress_file=_abspath(env.get(PROGRESS_FILE_ENV)),
        temp_checkpoint_dir=dirs.temp_checkpoint_dir,
        cluster=cluster,
        strategy=strategy,
        profile_steps=check_profile_steps(getattr(args, "profile_steps", None)),
        devices=device_settings_from_args(args),
        eval_every=eval_every,
        export_format=export_format,
        export_dir=dirs.export_dir,
        temp_export_dir=dirs.temp_export_dir,
        steps_per_call=steps_per_call,
        seed=getattr(args, "seed", None),
        async_checkpoints=not getattr(args, "sync_checkpoints", False),
    )


def _checked_intervals(args: argparse.Namespace) -> tuple[int, int | None, int]:
    """Every step count checked positive, the intervals against steps_per_call; returns the
    three whose flags may be absent: (preemption_check_every, eval_every, steps_per_call)."""
    check_every = getattr(args, "preemption_check_every", DEFAULT_PREEMPTION_CHECK_EVERY)
    for flag in ("steps", "checkpoint_every", "max_to_keep", "batch_size", "log_every"):
        _require_positive(flag, getattr(args, flag))
    _require_positive("preemption_check_every", check_every)
    eval_every = getattr(args, "eval_every", None)
    if eval_every is not None:
        _require_positive("eval_every", eval_every)
    steps_per_call = getattr(args, "steps_per_call", DEFAULT_STEPS_PER_CALL)
    _require_positive("steps_per_call", steps_per_call)
    check_steps_per_call(
        steps_per_call,
        {"log_every": args.log_every, "checkpoint_every": args.checkpoint_every,
         "eval_every": eval_every},
    )  # fmt: skip
    return check_every, eval_every, steps_per_call


def _checked_export_format(export_format: str | None) -> str | None:
    if export_format is not None and export_format not in EXPORT_FORMATS:
        raise ConfigError(
            f"--export must be one of {', '.join(EXPORT_FORMATS)}, got {export_format!r}"
        )
    return export_format


def _checked_cluster(strategy: str, env: Mapping[str, str], batch_size: int) -> ClusterInfo:
    """TF_CONFIG's cluster under the strategy, checked to split the global batch evenly."""
    cluster = cluster_for_strategy(strategy, parse_tf_config(env.get(TF_CONFIG_ENV), strategy))
    # Every worker takes the same share of the global batch; TensorFlow would fail later and less
    # clearly (get_per_replica_batch_size) if the split is uneven. Under parameter-server each
    # step is one worker's, on a whole batch.
    if not cluster.parameter_server and batch_size % cluster.num_workers:
        raise ConfigError(
            f"--batch-size {batch_size} is the global batch size and must be divisible by "
            f"the number of workers ({cluster.num_workers})"
        )
    return cluster


@dataclass(frozen=True)
class _Directories:
    """Where a worker writes, all absolute; the temporary ones only under a run directory."""

    checkpoint_dir: str
    tensorboard_dir: str
    export_dir: str
    temp_checkpoint_dir: str | None
    temp_export_dir: str | None


def _directories(args: argparse.Namespace, env: Mapping[str, str], task_index: int) -> _Directories:
    run_dir = _abspath(env.get(RUN_DIR_ENV))
    checkpoint_dir = _abspath(args.checkpoint_dir) or _default_checkpoint_dir(run_dir)
    tensorboard_dir = _abspath(args.tensorboard_dir) or os.path.join(
        os.path.dirname(checkpoint_dir), TENSORBOARD_DIR_NAME
    )
    export_dir = _abspath(getattr(args, "export_dir", None)) or os.path.join(
        os.path.dirname(checkpoint_dir), EXPORT_DIR_NAME
    )
    temp_dir = temp_export_dir = None
    if run_dir is not None:
        # One subdirectory per task index, in case several workers share a run directory.
        temp_dir = os.path.join(run_dir, "tmp-checkpoints", f"worker-{task_index}")
        temp_export_dir = os.path.join(run_dir, "tmp-export")  # mkdtemp names inside it
    return _Directories(checkpoint_dir, tensorboard_dir, export_dir, temp_dir, temp_export_dir)


def check_steps_per_call(steps_per_call: int, intervals: Mapping[str, int | None]) -> None:
    """Logs, checkpoints and evaluations fall on call boundaries: their intervals are multiples
    of K. Refused rather than rounded: a user who asked for a checkpoint every 50 steps should not
    silently get one every 60."""
    if steps_per_call == 1:
        return
    for flag, every in intervals.items():
        if every is not None and every % steps_per_call:
            raise ConfigError(
                f"--{flag.replace('_', '-')} {every} must be a multiple of --steps-per-call "
                f"{steps_per_call}: the host sees the steps only at the end of each call"
            )


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value (the preemption check interval:
    a stop is agreed on at the end of a call, so at most one call later than asked)."""
    return -(-value // multiple) * multiple


def cluster_for_strategy(strategy: str, cluster: ClusterInfo) -> ClusterInfo:
    """MirroredStrategy is one process on one host: a cluster in TF_CONFIG is a mistake there.

    A one-worker TF_CONFIG is harmless (MirroredStrategy ignores TF_CONFIG in eager mode), so only
    a real cluster is refused; silently training alone while the others wait would be worse.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if strategy == STRATEGY_MIRRORED and cluster.num_workers > 1:
        raise ConfigError(
            f"--strategy {STRATEGY_MIRRORED} is single-host, but TF_CONFIG lists "
            f"{cluster.num_workers} workers; unset TF_CONFIG or use --strategy "
            f"{STRATEGY_MULTI_WORKER}"
        )
    return ClusterInfo() if strategy == STRATEGY_MIRRORED else cluster


def check_profile_steps(steps: Sequence[int] | None) -> tuple[int, int] | None:
    """--profile-steps START END: both >= 1 and START < END; None when the flag is absent."""
    if steps is None:
        return None
    start, end = steps
    if not 1 <= start < end:
        raise ConfigError(f"--profile-steps START END needs 1 <= START < END, got {start} {end}")
    return start, end


def parse_visible_gpus(text: str) -> tuple[int, ...]:
    """ "0,2" -> (0, 2): GPU indices as tf.config.list_physical_devices("GPU") numbers them."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise ConfigError(
            f"--visible-gpus must be comma-separated GPU indices such as 0,1, got {text!r}"
        )
    indices = tuple(int(part) for part in parts)
    duplicates = sorted({i for i in indices if indices.count(i) > 1})
    if duplicates:
        raise ConfigError(f"--visible-gpus names GPU {duplicates[0]} more than once: {text!r}")
    return indices


def device_settings_from_args(args: argparse.Namespace) -> DeviceSettings:
    visible = getattr(args, "visible_gpus", None)
    settings = DeviceSettings(
        memory_growth=bool(getattr(args, "gpu_memory_growth", False)),
        memory_limit_mb=getattr(args, "gpu_memory_limit_mb", None),
        visible_gpus=None if visible is None else parse_visible_gpus(visible),
        logical_gpus=getattr(args, "logical_gpus", None),
        logical_cpus=getattr(args, "logical_cpus", None),
    )
    check_device_settings(settings)
    return settings


def check_device_settings(settings: DeviceSettings) -> None:
    """Refuses the combinations TensorFlow would reject later, or silently not honour."""
    for flag, value in (
        ("gpu_memory_limit_mb", settings.memory_limit_mb),
        ("logical_gpus", settings.logical_gpus),
        ("logical_cpus", settings.logical_cpus),
    ):
        if value is not None:
            _require_positive(flag, value)
    problems = device_setting_problems(
        settings.memory_growth, settings.memory_limit_mb, settings.logical_gpus
    )
    if problems:
        setting, why = problems[0]
        raise ConfigError(f"{_flag(setting)} {_flags_in(why)}")


def _flag(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def _flags_in(text: str) -> str:
    """The shared rules name inventory settings; on the worker's command line they are flags."""
    return re.sub(r"\b(gpu_memory_growth|gpu_memory_limit_mb|logical_gpus)\b",
                  lambda m: _flag(m.group(1)), text)  # fmt: skip


def _require_positive(flag: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")


def _abspath(path: str | None) -> str | None:
    # An empty variable counts as unset: `export X=` is a common way to "turn something off".
    return os.path.abspath(path) if path else None


def _default_checkpoint_dir(run_dir: str | None) -> str:
    return os.path.join(run_dir, "checkpoints") if run_dir else os.path.abspath("checkpoints")

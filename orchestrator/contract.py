"""What the controller and the worker agree on: one definition of each, imported by both.

STANDARD LIBRARY ONLY, and no import of the rest of `orchestrator`: the worker imports this module
on training hosts, the controller imports it without TensorFlow, and the host programs
(orchestrator/hostside/) carry its source as `contract` (hostside/bundle.py), so it must run on a
host's Python 3.7 or newer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# Exit codes of `python -m worker`.
EXIT_OK = 0
EXIT_TRAINING_ERROR = 1
EXIT_USAGE = 2  # a flag, TF_CONFIG or task the worker cannot use: never heals by a restart
EXIT_PREEMPTED = 75  # SIGTERM: the cluster saved a checkpoint at one step and exited (EX_TEMPFAIL)

# Environment variables the controller sets on each worker process.
TF_CONFIG_ENV = "TF_CONFIG"
RUN_ID_ENV = "ORCHESTRATE_RUN_ID"
WORKER_ENV = "ORCHESTRATE_WORKER"
RUN_DIR_ENV = "ORCHESTRATE_RUN_DIR"
# In a worker's run directory, written by its host's agent before the SIGTERM of a stop that
# was asked for (`down`): the worker then says "stopped", not "preempted".
STOP_REQUEST_FILE = "stop_requested"
PROGRESS_FILE_ENV = "ORCHESTRATE_PROGRESS_FILE"
CHECKPOINT_DIR_ENV = "ORCHESTRATE_CHECKPOINT_DIR"
TARGET_STEPS_ENV = "ORCHESTRATE_TARGET_STEPS"  # a script job's steps: (worker.target_steps())
RESERVED_ENV_PREFIXES = (TF_CONFIG_ENV, "ORCHESTRATE_")
# A built-in worker (`python -m worker`) starts with Python's safe path (3.11+: its working
# directory is not put first on sys.path), so a `worker.py` of the user's there cannot replace
# orchestrate's package; the worker then appends the directory, so the user's own modules
# still import, and drops both variables, so the user's subprocesses start as usual.
SAFE_PATH_ENV = "PYTHONSAFEPATH"
USER_DIRECTORY_LAST_ENV = "ORCHESTRATE_USER_DIRECTORY_LAST"
# With job.tracking (docs/tracking.md): the run's identity in its tracker, the same for every
# worker of every attempt, so the built-in loop and a script's own mlflow.start_run() or
# wandb.init() join the one run the controller made. job.env may not set them.
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_RUN_ENV = "MLFLOW_RUN_ID"
MLFLOW_EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_ID"
MLFLOW_EXPERIMENT_NAME_ENV = "MLFLOW_EXPERIMENT_NAME"  # only while the run has no MLflow run id
WANDB_RUN_ENV = "WANDB_RUN_ID"
WANDB_RESUME_ENV = "WANDB_RESUME"
WANDB_PROJECT_ENV = "WANDB_PROJECT"
WANDB_ENTITY_ENV = "WANDB_ENTITY"
TRACKING_ENV = (MLFLOW_URI_ENV, MLFLOW_RUN_ENV, MLFLOW_EXPERIMENT_ENV, MLFLOW_EXPERIMENT_NAME_ENV,
                WANDB_RUN_ENV, WANDB_RESUME_ENV, WANDB_PROJECT_ENV, WANDB_ENTITY_ENV)  # fmt: skip
# Credentials of the trackers: only ever through job.secret_env, never job.env (the inventory).
TRACKING_SECRET_ENV = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "WANDB_API_KEY")

# --- the progress file (progress.json) ------------------------------------------------------------
# One JSON object per worker, rewritten whole at each write (worker/progress.py; the built-in loop,
# the evaluator and a script's report() write it), read by the controller (model/answers.py's
# Progress, engine/observe/status.py). Its keys, declared once: both sides spell them by these
# names.
STEP = "step"
START_STEP = "start_step"  # where this attempt began (the built-in loop's first write)
TARGET_STEPS = "target_steps"
LOSS = "loss"
ACCURACY = "accuracy"
STEPS_PER_SEC = "steps_per_sec"
CHECKPOINT_STEP = "checkpoint_step"
VAL_LOSS = "val_loss"  # the latest evaluation's (the built-in loop with eval data, the evaluator)
VAL_ACCURACY = "val_accuracy"
DEVICES = "devices"
WRITTEN_AT = "time"  # when the file (or a history line) was written, seconds since the epoch
EVALUATED_CHECKPOINT = "checkpoint"  # the evaluator's: the checkpoint it evaluated last
# What a script times with worker.progress.timed(KIND): its seconds go to CHECKPOINT_SECONDS or
# EVAL_SECONDS (below); goodput's phases have the same names.
TIMED_CHECKPOINT = "checkpoint"
TIMED_EVALUATION = "evaluation"

# --- the worker's command line (engine/workers/launch.py writes it, worker/cli.py parses it) -----
# `--strategy`: the worker's tf.distribute strategy (`job.strategy` in the inventory).
STRATEGY_MULTI_WORKER = "multi-worker"  # MultiWorkerMirroredStrategy: every host a worker
STRATEGY_MIRRORED = "mirrored"  # MirroredStrategy: one host, its GPUs
STRATEGY_PS = "parameter-server"  # ParameterServerStrategy: a chief, ps and workers
STRATEGIES = (STRATEGY_MULTI_WORKER, STRATEGY_MIRRORED, STRATEGY_PS)
# The built-in loop's defaults: the inventory's `job:` (model/inventory.py's Job) and the worker's
# flags (worker/cli.py, for a worker started by hand) start from the same values.
DEFAULT_CHECKPOINT_EVERY = 100
DEFAULT_MAX_TO_KEEP = 3
DEFAULT_BATCH_SIZE = 64
DEFAULT_LOG_EVERY = 10
# Training steps per tf.function call (--steps-per-call). One call costs a Python dispatch and a
# host wait wherever a value is read; K steps per call pay it once for K steps.
DEFAULT_STEPS_PER_CALL = 1
# The flags engine/workers/launch.py gives `python -m worker` (worker/cli.py parses them) and the
# evaluator's `python -m worker.evaluate --watch` (worker/evaluate.py): each spelled once.
WORKER_MODULE = "worker"
EVALUATE_MODULE = "worker.evaluate"
FLAG_TASK = "--task"
FLAG_STEPS = "--steps"
FLAG_CHECKPOINT_DIR = "--checkpoint-dir"
FLAG_CHECKPOINT_EVERY = "--checkpoint-every"
FLAG_MAX_TO_KEEP = "--max-to-keep"
FLAG_BATCH_SIZE = "--batch-size"
FLAG_LOG_EVERY = "--log-every"
FLAG_EVAL_EVERY = "--eval-every"
FLAG_STEPS_PER_CALL = "--steps-per-call"
FLAG_SEED = "--seed"
FLAG_SYNC_CHECKPOINTS = "--sync-checkpoints"
FLAG_EXPORT = "--export"
FLAG_EXPORT_DIR = "--export-dir"
FLAG_GPU_MEMORY_GROWTH = "--gpu-memory-growth"
FLAG_GPU_MEMORY_LIMIT_MB = "--gpu-memory-limit-mb"
FLAG_VISIBLE_GPUS = "--visible-gpus"
FLAG_LOGICAL_GPUS = "--logical-gpus"
FLAG_STRATEGY = "--strategy"
FLAG_PROFILE_STEPS = "--profile-steps"
FLAG_WATCH = "--watch"

# TensorBoard's directory, beside checkpoints/ in the job's directory.
TENSORBOARD_DIR_NAME = "tensorboard"

# --- a standby (worker/standby.py, hostside/standbys.py) ----------------------------------------
# The ready record a standby writes once it has imported the worker's packages, and the request
# that turns it into the worker (the launch request's argv, env and cwd).
READY_PID = "pid"
READY_AT = "at"
READY_IMPORT_SECONDS = "import_seconds"
READY_PACKAGE_DIRS = "package_dirs"
REQUEST_ARGV = "argv"
REQUEST_ENV = "env"
REQUEST_CWD = "cwd"

# Progress keys of the built-in loop's step timing (worker/loop.py writes them at each log step,
# engine/observe/pace.py reads them): the mean seconds per step spent inside the step calls, and the
# mean wall seconds per step, over the last log window. Their difference is the host's own time per
# step; in a synchronous job the others wait for the worker with the most of it.
STEP_CALL_SECONDS = "step_call_seconds"
STEP_SECONDS = "step_seconds"
STEP_TIMING_ENV = "ORCHESTRATE_STEP_TIMING"  # "0": no timing (bench/bench_step_timing.py)

# Progress keys behind a run's goodput (engine/observe/goodput.py): when this attempt's first step
# was done (worker/progress.py writes it at the first step past start_step, for scripts too), and
# the seconds the step loop was blocked in checkpoint saves and in evaluations, summed over the
# attempt (the built-in loop; a script with worker.progress.timed).
FIRST_STEP_AT = "first_step_at"
CHECKPOINT_AT = "checkpoint_at"  # when the progress file last took a new checkpoint_step
CHECKPOINT_SECONDS = "checkpoint_seconds"
EVAL_SECONDS = "eval_seconds"

# The files a worker writes into its run directory.
PROGRESS_FILE = "progress.json"
HISTORY_FILE = "progress-history.jsonl"  # bounded, one line per metric step: the curves
WORKER_LOG = "worker.log"

# --- TF_CONFIG ------------------------------------------------------------------------------------
# Built here once for every launcher: the engine's hosts (engine/workers/tfconfig.py), the Slurm
# launcher (hostside/slurm_launcher.py) and the pod launcher (hostside/pod_launcher.py). As
# TensorFlow specifies it: the cluster lists the training tasks by type, in task order within a
# type; a task is its type and its index within that type. The evaluator is in no cluster list: its
# task is {"type": "evaluator", "index": 0}. Under MultiWorkerMirroredStrategy every task is a
# worker (worker 0 is the chief).
ROLE_WORKER, ROLE_CHIEF, ROLE_PS, ROLE_EVALUATOR = "worker", "chief", "ps", "evaluator"
# TensorFlow's order of a cluster spec's task types (as its tutorials write them).
CLUSTER_ORDER = (ROLE_CHIEF, ROLE_WORKER, ROLE_PS)
# Its keys (the worker reads them: worker/config.py, worker/helpers.py).
TF_CLUSTER, TF_TASK, TF_TYPE, TF_INDEX = "cluster", "task", "type", "index"


def cluster_spec(endpoints: Sequence[str], roles: Sequence[str]) -> dict[str, list[str]]:
    """Each task type's endpoints (host:port), in task order; types without a task left out."""
    spec: dict[str, list[str]] = {}
    for role in CLUSTER_ORDER:
        # No zip(strict=): host programs run on Python 3.7.
        listed = [endpoints[i] for i, kind in enumerate(roles) if kind == role]
        if listed:
            spec[role] = listed
    return spec


def task_of(roles: Sequence[str], index: int) -> dict[str, Any]:
    """The task at `index`: its type and its index among the tasks of that type."""
    role = roles[index]
    return {TF_TYPE: role, TF_INDEX: sum(1 for kind in roles[:index] if kind == role)}


def tf_config(endpoints: Sequence[str], roles: Sequence[str], index: int) -> dict[str, Any]:
    """TF_CONFIG of the task at `index`; `endpoints` and `roles` give each task's, in order."""
    task = task_of(roles, index)
    if task[TF_TYPE] == ROLE_EVALUATOR:
        task = {TF_TYPE: ROLE_EVALUATOR, TF_INDEX: 0}
    return {TF_CLUSTER: cluster_spec(endpoints, roles), TF_TASK: task}


# --- a checkpoint directory's state file ----------------------------------------------------
# TensorFlow's list of a directory's checkpoints (tf.train.CheckpointManager writes it), which the
# JAX loop writes in the same format (worker/jaxsaver.py) and the host agent reads and rewrites
# (hostside/files.py): relative names, the latest first as model_checkpoint_path.
CHECKPOINT_STATE_FILE = "checkpoint"


def checkpoint_state_text(names: Sequence[str]) -> str:
    """The state file naming `names` (oldest first), the last one the latest."""
    return f'model_checkpoint_path: "{names[-1]}"\n' + "".join(
        f'all_model_checkpoint_paths: "{name}"\n' for name in names
    )


def checkpoint_state_names(text: str) -> list[str]:
    """The checkpoints a state file's text names, oldest first, the latest last ([] when it
    names no latest)."""
    latest, listed = None, []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        name = value.strip().strip('"').rsplit("/", 1)[-1]  # posixpath.basename
        if key == "model_checkpoint_path":
            latest = name
        elif key == "all_model_checkpoint_paths" and name not in listed:
            listed.append(name)
    if latest is None:
        return []
    return [name for name in listed if name != latest] + [latest]


# Distributions whose installed version names the host's TensorFlow.
TF_PACKAGES = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")

# What `export:` (inventory) and `--export` (worker) accept: the full Keras model, or an
# inference-only SavedModel.
EXPORT_FORMATS = ("keras", "saved_model")
# The export's place, beside checkpoints/ and tensorboard/ in the job's directory.
EXPORT_DIR_NAME = "export"
# What each format writes there: Keras 3's file, tf.keras 2's SavedModel directory (keras); the
# inference SavedModel (saved_model). The controller looks for them before it starts a finished
# job again: one whose export is missing still starts, to export from its last checkpoint.
EXPORT_KERAS_FILE = "model.keras"
EXPORT_KERAS2_DIR = "model"
EXPORT_SAVED_MODEL_DIR = "saved_model"
EXPORT_WRITES = {
    EXPORT_FORMATS[0]: (EXPORT_KERAS_FILE, EXPORT_KERAS2_DIR),
    EXPORT_FORMATS[1]: (EXPORT_SAVED_MODEL_DIR,),
}

# `job.keras`: which Keras `tf.keras` is on the workers. TensorFlow 2.16+ ships Keras 3; Keras 2
# lives on as the tf-keras distribution (import name tf_keras), chosen by TF_USE_LEGACY_KERAS=1
# and versioned with TensorFlow: tf-keras 2.X works with TensorFlow 2.X only.
KERAS_DEFAULT = "default"  # the Keras that ships with TensorFlow (Keras 3)
KERAS_LEGACY = "legacy"  # tf.keras is Keras 2 (tf_keras): model.fit under MWMS, reset_states
KERAS_JAX = "jax"  # Keras 3 on the JAX backend, across processes by keras.distribution
KERAS_SETTINGS = (KERAS_DEFAULT, KERAS_LEGACY, KERAS_JAX)
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
TF_KERAS_PACKAGE = "tf-keras"
# Beside the chief's checkpoints: which Keras wrote them (restoring under the other is refused).
KERAS_MARKER_FILE = "keras.json"
# Files beside the checkpoints that every host resuming from them needs too.
CHECKPOINT_COMPANIONS = (KERAS_MARKER_FILE,)


def legacy_keras_requested(env: Mapping[str, str]) -> bool:
    """What tf.keras will be, decided the way TensorFlow decides it (tf/python/util/lazy_loader)."""
    return env.get(LEGACY_KERAS_ENV) in ("true", "True", "1")


def minor_version(version: str) -> str:
    """Version 2.21.0 -> 2.21: tf-keras and TensorFlow must agree on it."""
    return ".".join(version.split(".")[:2])


def tf_keras_requirement(tensorflow_version: str) -> str:
    """The pip requirement of the tf-keras that matches a TensorFlow version."""
    return f"{TF_KERAS_PACKAGE}~={minor_version(tensorflow_version)}.0"


# --- a Keras 3 / JAX cluster (`job.keras: jax`) ----------------------------------------------
# What keras.distribution.initialize() reads (keras/src/distribution/distribution_lib.py): every
# process's host:port, comma-separated in process order (the first is JAX's coordinator), the
# process count, and this process's id. A plain JAX script reads the JAX_ ones instead:
# jax.distributed.initialize() takes the coordinator's address from the environment, the count
# and the id only as arguments (worker/jax_cluster.py passes them). The gloo collectives give CPU
# processes their cross-process reductions (without them JAX on CPU has none). No TF_CONFIG.
KERAS_BACKEND_ENV = "KERAS_BACKEND"
KERAS_ADDRESSES_ENV = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
KERAS_NUM_PROCESSES_ENV = "KERAS_DISTRIBUTION_NUM_PROCESSES"
KERAS_PROCESS_ID_ENV = "KERAS_DISTRIBUTION_PROCESS_ID"
JAX_COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
JAX_NUM_PROCESSES_ENV = "JAX_NUM_PROCESSES"
JAX_PROCESS_ID_ENV = "JAX_PROCESS_ID"
JAX_CPU_COLLECTIVES_ENV = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"
JAX_CPU_COLLECTIVES = "gloo"
# Where a scheduler's variables are present (Slurm's), jax.distributed.initialize takes the local
# device ids it was not given from them; the Slurm launcher sets these instead (slurm_launcher).
JAX_LOCAL_DEVICES_ENV = "JAX_LOCAL_DEVICE_IDS"
CUDA_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"  # a host's or a Slurm task's GPUs, as CUDA numbers them
# The per-process ones: the same job.env on every worker cannot carry them (config/job.py).
JAX_CLUSTER_ENV = (KERAS_ADDRESSES_ENV, KERAS_NUM_PROCESSES_ENV, KERAS_PROCESS_ID_ENV,
                   JAX_COORDINATOR_ENV, JAX_NUM_PROCESSES_ENV, JAX_PROCESS_ID_ENV)  # fmt: skip
# Distributions whose versions preflight reports for a jax job.
JAX_PACKAGE, KERAS_PACKAGE = "jax", "keras"


# The variables that name the cluster's addresses and this process's place in it: a launcher
# that learns the addresses only where it runs (Slurm's) writes them there, not in its plan.
JAX_PLACE_ENV = (
    KERAS_ADDRESSES_ENV,
    KERAS_NUM_PROCESSES_ENV,
    KERAS_PROCESS_ID_ENV,
    JAX_COORDINATOR_ENV,
    JAX_NUM_PROCESSES_ENV,
    JAX_PROCESS_ID_ENV,
)


def jax_cluster_env(endpoints: Sequence[str], index: int) -> dict[str, str]:
    """The variables of process `index` of a JAX cluster whose processes' host:port are
    `endpoints`, in process order: the first is the coordinator."""
    if not 0 <= index < len(endpoints):
        raise IndexError(f"process {index} out of range 0..{len(endpoints) - 1}")
    count, me = str(len(endpoints)), str(index)
    return {
        KERAS_BACKEND_ENV: KERAS_JAX,
        KERAS_ADDRESSES_ENV: ",".join(endpoints),
        KERAS_NUM_PROCESSES_ENV: count,
        KERAS_PROCESS_ID_ENV: me,
        JAX_COORDINATOR_ENV: endpoints[0],
        JAX_NUM_PROCESSES_ENV: count,
        JAX_PROCESS_ID_ENV: me,
        JAX_CPU_COLLECTIVES_ENV: JAX_CPU_COLLECTIVES,
    }


# MODULE:FUNCTION, where MODULE is a dotted Python name and FUNCTION an identifier.
TASK_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def task_problem(task: object) -> str | None:
    """Why the worker would refuse `task` as its --task, or None."""
    if isinstance(task, str) and TASK_PATTERN.fullmatch(task):
        return None
    return f"expected 'package.module:function' (MODULE:FUNCTION), got {task!r}"


def device_setting_problems(
    memory_growth: bool, memory_limit_mb: int | None, logical_gpus: int | None
) -> list[tuple[str, str]]:
    """GPU setting combinations TensorFlow refuses, as (setting name, why) pairs."""
    problems = []
    # A memory limit is a virtual device configuration, and TensorFlow refuses memory growth on a
    # GPU that has one ("Cannot set memory growth on device when virtual devices configured").
    if memory_growth and memory_limit_mb is not None:
        problems.append(
            ("gpu_memory_growth", "cannot be combined with gpu_memory_limit_mb: TensorFlow does "
             "not allow memory growth on a GPU with a memory limit")
        )  # fmt: skip
    if memory_growth and logical_gpus is not None:
        problems.append(
            ("gpu_memory_growth", "cannot be combined with logical_gpus: TensorFlow does not "
             "allow memory growth on a GPU split into logical devices")
        )  # fmt: skip
    if logical_gpus is not None and memory_limit_mb is None:
        problems.append(("logical_gpus", "needs gpu_memory_limit_mb: the size of each part"))
    return problems


# --- stacks on request (SIGUSR2) ----------------------------------------------------------------
# Every worker process registers faulthandler on SIGUSR2 (SIGUSR1 is the Slurm launcher's
# preemption signal): all its threads' Python stacks are appended to STACKS_FILE in its run
# directory, a file of its own so that a dump never interleaves with the worker's output in
# worker.log (nor is rotated away or cut into its lines). STACKS_PID_FILE names the process that
# registered: the host agent and the Slurm launcher signal only that one, never a process that
# would die of SIGUSR2's default action (a wrapper shell, a worker started before this existed).
STACKS_FILE = "stacks.txt"
STACKS_PID_FILE = "stacks.pid"
# How every host program is started (the agent and its minders, the host probe, the lease
# program, the Slurm launcher and node probe, the pod launcher, withenv): `python -I`, isolated.
# Neither the working directory, PYTHONPATH nor the user's site-packages is on its sys.path, so
# a json.py or fcntl.py another user leaves in a shared directory, or on a path a login script
# adds, is never imported into it (what it imports of orchestrate's travels inside its text:
# hostside/bundle.py). Workers are the job's own programs and keep the job's environment.
ISOLATED = ("-I",)

BOOT_MARKER = "# orchestrate boot"  # how a script's boot begins (the agent's standbys look)

_kept: list[object] = []  # the open stacks file: faulthandler writes to its descriptor


def register_stack_dump(run_dir: str | None) -> bool:
    """SIGUSR2 -> every thread's Python stack into run_dir/stacks.txt. SCRIPT_BOOT does the
    same for scripts (it runs where orchestrate is not installed). False where not possible."""
    import faulthandler
    import os
    import signal

    if not run_dir or not hasattr(signal, "SIGUSR2") or not os.path.isdir(run_dir):
        return False
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        handle = os.fdopen(os.open(os.path.join(run_dir, STACKS_FILE), flags, 0o600), "w")
        faulthandler.register(signal.SIGUSR2, file=handle, all_threads=True)
        _kept.append(handle)
        tmp = os.path.join(run_dir, f"{STACKS_PID_FILE}.tmp.{os.getpid()}")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as pid:
            pid.write(str(os.getpid()))
        os.replace(tmp, os.path.join(run_dir, STACKS_PID_FILE))
    except (OSError, ValueError, RuntimeError):
        return False
    return True


# `python -c SCRIPT_BOOT SCRIPT ARGS...` runs SCRIPT exactly as `python SCRIPT ARGS...` would
# (sys.argv, sys.path[0], __main__ with its __file__, the cwd, exit codes), after registering the
# stack dump. Standard library only: a host may have nothing but Python. Not runpy.run_path: it
# sets sys.argv[0] to the path it is given, so no path gives both argv[0] as typed and the
# absolute __file__ that `python SCRIPT` gives; this does what the interpreter does instead.
SCRIPT_BOOT = f"""{BOOT_MARKER}: SIGUSR2 writes every thread's Python stack to {STACKS_FILE}
import sys
def _orchestrate_boot():
    import faulthandler, os, signal, types
    from importlib.machinery import SourceFileLoader
    run_dir = os.environ.get({RUN_DIR_ENV!r})
    if run_dir and hasattr(signal, "SIGUSR2") and os.path.isdir(run_dir):
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            handle = os.fdopen(os.open(os.path.join(run_dir, {STACKS_FILE!r}), flags, 0o600), "w")
            faulthandler.register(signal.SIGUSR2, file=handle, all_threads=True)
            sys._orchestrate_stacks = handle
            tmp = os.path.join(run_dir, {STACKS_PID_FILE!r} + ".tmp." + str(os.getpid()))
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(str(os.getpid()))
            os.replace(tmp, os.path.join(run_dir, {STACKS_PID_FILE!r}))
        except (OSError, ValueError, RuntimeError):
            pass
    script = sys.argv[1]
    path = os.path.abspath(script)
    try:
        with open(path, "rb") as source:
            code = compile(source.read(), path, "exec")
    except OSError as exc:
        sys.stderr.write(f"{{sys.executable}}: can't open file {{path!r}}: [Errno {{exc.errno}}] "
                         f"{{exc.strerror}}\\n")
        raise SystemExit(2)
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    main = types.ModuleType("__main__")
    main.__file__, main.__cached__ = path, None
    main.__loader__ = SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    return code, main.__dict__
_orchestrate_code, _orchestrate_globals = _orchestrate_boot()
del _orchestrate_boot
exec(_orchestrate_code, _orchestrate_globals)
"""


def booted(argv: tuple[str, ...]) -> tuple[str, ...]:
    """`PYTHON SCRIPT ARGS` -> `PYTHON -c SCRIPT_BOOT SCRIPT ARGS`."""
    return (argv[0], "-c", SCRIPT_BOOT, *argv[1:])


# --- installing it ------------------------------------------------------------------------------

# The name pip knows this project by: on PyPI "orchestrate" is another project (SigOpt's client),
# and so are "worker" and "orchestrator", so a hint never names those. Not published on PyPI:
# it is installed from its source (a clone).
DISTRIBUTION = "tf-orchestrate"


def install_hint(extra: str, where: str = "on this machine") -> str:
    """The `pip install` of one of the project's extras, as it works from a clone of it."""
    return (
        f"pip install '.[{extra}]' in a clone of orchestrate ({DISTRIBUTION}) {where}, "
        f"or pip install '/path/to/the/clone[{extra}]'"
    )

"""The one definition of a worker: its command line and environment, whatever starts it. Pure.

`worker_launch` is called by every launcher and export with its `Placement` (model/launch.py):
hosts and Slurm through plan.plan_workers (the host agent's launch request, the batch script's
plan), the TFJob and TrainJob exports with their pods' placement. What a worker is told (its
Keras, its target steps, its GPU settings, its checkpoint directory) is decided here alone, so
no launcher can start a worker another one would start differently.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.contract import (
    CHECKPOINT_DIR_ENV,
    DEFAULT_STEPS_PER_CALL,
    EVALUATE_MODULE,
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
    FLAG_WATCH,
    KERAS_JAX,
    KERAS_LEGACY,
    LEGACY_KERAS_ENV,
    MLFLOW_EXPERIMENT_ENV,
    MLFLOW_EXPERIMENT_NAME_ENV,
    MLFLOW_RUN_ENV,
    MLFLOW_URI_ENV,
    SAFE_PATH_ENV,
    STRATEGY_MULTI_WORKER,
    STRATEGY_PS,
    TARGET_STEPS_ENV,
    USER_DIRECTORY_LAST_ENV,
    WANDB_ENTITY_ENV,
    WANDB_PROJECT_ENV,
    WANDB_RESUME_ENV,
    WANDB_RUN_ENV,
    WORKER_MODULE,
    booted,
    jax_cluster_env,
)
from orchestrator.engine.observe.rolepolicy import EVALUATOR_RESTARTS
from orchestrator.engine.workers.tfconfig import task_of
from orchestrator.model.inventory import (
    ROLE_EVALUATOR,
    ROLE_WORKER,
    Inventory,
    Job,
    Tracking,
    WorkerSlot,
)
from orchestrator.model.launch import Placement, WorkerLaunch
from orchestrator.model.workers import export_dir


def worker_launch(inventory: Inventory, index: int, place: Placement) -> WorkerLaunch:
    """The worker of the host at `index`, started at `place`."""
    job, host = inventory.job, inventory.hosts[index]
    if not place.host_gpus:  # the scheduler numbers the worker's GPUs from 0: no host indices
        host = replace(host, visible_gpus=None, leased_gpus=None)
    task = task_of(inventory.hosts, index)
    return WorkerLaunch(
        name=host.name,
        role=host.role,
        task_index=0 if host.role == ROLE_EVALUATOR else task["index"],
        argv=worker_argv(job, host, place),
        env={**worker_env(job, host, place), **cluster_env(inventory, index)},
        secret_env=job.secret_env,
        cwd=place.cwd,
        checkpoint_dir=place.checkpoint_dir,
        permanent_exit_codes=job.permanent_exit_codes,
        gpus=inventory.gpus_per_worker,
        restarts_alone=restarts_alone(job, host.role),
    )


def cluster_env(inventory: Inventory, index: int) -> dict[str, str]:
    """`job.keras: jax`: the JAX cluster's variables of the host at `index` (the hosts'
    endpoints in task order, the chief first: the coordinator). A TensorFlow job's cluster is
    its TF_CONFIG, which each launcher writes instead (engine/workers/plan.py, the Slurm and pod
    launchers)."""
    if inventory.job.keras != KERAS_JAX:
        return {}
    return jax_cluster_env([host.endpoint for host in inventory.hosts], index)


def restarts_alone(job: Job, role: str) -> int:
    """How often a worker of `role` restarts by itself (WorkerLaunch.restarts_alone): a
    ParameterServerStrategy worker its job.max_worker_restarts, the evaluator
    rolepolicy.EVALUATOR_RESTARTS, any other none (a lost one restarts the cluster)."""
    if role == ROLE_EVALUATOR:
        return EVALUATOR_RESTARTS
    if role == ROLE_WORKER and job.strategy == STRATEGY_PS:
        return job.max_worker_restarts
    return 0


def worker_env(job: Job, host: WorkerSlot, place: Placement) -> dict[str, str]:
    """The job's variables, then orchestrate's: the place's run variables, the checkpoint
    directory, the place's own, the Keras, a script's target steps, the host's GPUs."""
    env = {
        **job.env,
        # Unbuffered so `tail -f` shows lines as the worker prints them.
        "PYTHONUNBUFFERED": "1",
        **place.run_env,
        CHECKPOINT_DIR_ENV: place.checkpoint_dir,
        **place.place_env,
    }
    if job.tracking is not None:
        env.update(tracking_env(job.tracking, job.name))
    if job.keras == KERAS_LEGACY:
        env[LEGACY_KERAS_ENV] = "1"  # tf.keras is Keras 2 (tf_keras), in scripts and tasks
    if job.task is not None and SAFE_PATH_ENV not in job.env:  # contract.SAFE_PATH_ENV: why
        env.update({SAFE_PATH_ENV: "1", USER_DIRECTORY_LAST_ENV: "1"})
    if job.script is not None and job.steps is not None:
        env[TARGET_STEPS_ENV] = str(job.steps)  # the script's target (steps:)
    if host.leased_gpus is not None:  # exactly the GPUs the run's lease gave (gpus: N)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.leased_gpus))
    elif job.script is not None and host.visible_gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.visible_gpus))
    return env


def tracking_env(tracking: Tracking, job_name: str) -> dict[str, str]:
    """The run's identity in its trackers (job.tracking), the same for every worker of every
    attempt: MLflow's run and experiment ids once the run has them (mlflow.start_run() then
    resumes that run), else the experiment's name (a run the tracker could not be reached for
    at `up`, an export); W&B's run id with resume allowed (wandb.init() joins or makes it)."""
    env: dict[str, str] = {}
    if tracking.mlflow is not None:
        env[MLFLOW_URI_ENV] = tracking.mlflow
        if tracking.mlflow_run_id is not None and tracking.mlflow_experiment_id is not None:
            env[MLFLOW_RUN_ENV] = tracking.mlflow_run_id
            env[MLFLOW_EXPERIMENT_ENV] = tracking.mlflow_experiment_id
        else:
            env[MLFLOW_EXPERIMENT_NAME_ENV] = tracking.experiment or job_name
    if tracking.wandb_project is not None:
        env[WANDB_PROJECT_ENV] = tracking.wandb_project
        if tracking.wandb_entity is not None:
            env[WANDB_ENTITY_ENV] = tracking.wandb_entity
        if tracking.wandb_run_id is not None:
            env[WANDB_RUN_ENV] = tracking.wandb_run_id
            env[WANDB_RESUME_ENV] = "allow"
    return env


def eval_export_flags(job: Job, job_directory: str) -> tuple[str, ...]:
    """The built-in loop's evaluation and export flags."""
    flags: list[str] = []
    if job.eval_every:
        flags += [FLAG_EVAL_EVERY, str(job.eval_every)]
    if job.steps_per_call != DEFAULT_STEPS_PER_CALL:
        flags += [FLAG_STEPS_PER_CALL, str(job.steps_per_call)]
    if job.seed is not None:
        flags += [FLAG_SEED, str(job.seed)]
    if not job.async_checkpoints:
        flags += [FLAG_SYNC_CHECKPOINTS]
    if job.export:
        flags += [FLAG_EXPORT, job.export, FLAG_EXPORT_DIR, export_dir(job_directory)]
    return tuple(flags)


def device_flags(job: Job, host: WorkerSlot) -> tuple[str, ...]:
    """The built-in loop's flags for the host's GPU settings, strategy and profiling window."""
    flags: list[str] = []
    if host.gpu_memory_growth:
        flags.append(FLAG_GPU_MEMORY_GROWTH)
    if host.gpu_memory_limit_mb:
        flags += [FLAG_GPU_MEMORY_LIMIT_MB, str(host.gpu_memory_limit_mb)]
    if host.visible_gpus is not None and host.gpus is None:  # leased GPUs: CUDA_VISIBLE_DEVICES
        flags += [FLAG_VISIBLE_GPUS, ",".join(map(str, host.visible_gpus))]
    if host.logical_gpus:
        flags += [FLAG_LOGICAL_GPUS, str(host.logical_gpus)]
    if job.strategy != STRATEGY_MULTI_WORKER:
        flags += [FLAG_STRATEGY, job.strategy]
    if job.profile_steps:
        flags += [FLAG_PROFILE_STEPS, *map(str, job.profile_steps)]
    return tuple(flags)


def worker_argv(job: Job, host: WorkerSlot, place: Placement) -> tuple[str, ...]:
    """A script with its args (booted where the place has a run directory for its stacks), the
    evaluator's watch, or the built-in loop with the job's and the host's flags."""
    if job.script is not None:
        assert place.script is not None, "a placement names where the script is"
        argv = (place.python, place.script, *job.args)
        return booted(argv) if place.booted else argv  # its stacks on SIGUSR2 (contract)
    assert job.task is not None and job.steps is not None
    if host.role == ROLE_EVALUATOR:  # evaluates the chief's checkpoints as they appear
        return evaluator_argv(job, place.python, place.checkpoint_dir)
    return (
        place.python, "-m", WORKER_MODULE,
        FLAG_TASK, job.task,
        FLAG_STEPS, str(job.steps),
        FLAG_CHECKPOINT_DIR, place.checkpoint_dir,
        FLAG_CHECKPOINT_EVERY, str(job.checkpoint_every),
        FLAG_MAX_TO_KEEP, str(job.max_to_keep),
        FLAG_BATCH_SIZE, str(job.batch_size),
        FLAG_LOG_EVERY, str(job.log_every),
        *eval_export_flags(job, place.job_dir),
        *device_flags(job, host),
        *job.args,
    )  # fmt: skip


def evaluator_argv(job: Job, python: str, checkpoints: str) -> tuple[str, ...]:
    """The evaluator host of a task job: worker.evaluate watching the chief's checkpoints; it
    exits 0 once it evaluated the checkpoint of the last step (or, told to stop, the newest)."""
    assert job.task is not None and job.steps is not None
    return (
        python, "-m", EVALUATE_MODULE, FLAG_WATCH,
        FLAG_TASK, job.task,
        FLAG_CHECKPOINT_DIR, checkpoints,
        FLAG_STEPS, str(job.steps),
        FLAG_BATCH_SIZE, str(job.batch_size),
    )  # fmt: skip

"""What each worker gets: its run directory, command line, environment and TF_CONFIG. Pure.

The layout of a job on a host (its directories, what is private) is model/workers.py's.
"""

from __future__ import annotations

import posixpath
import re
import secrets
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import PurePath

from orchestrator.contract import (
    CHECKPOINT_DIR_ENV,
    KERAS_LEGACY,
    LEGACY_KERAS_ENV,
    PROGRESS_FILE,
    PROGRESS_FILE_ENV,
    RUN_DIR_ENV,
    RUN_ID_ENV,
    TARGET_STEPS_ENV,
    WORKER_ENV,
    booted,
)
from orchestrator.engine.tfconfig import tf_config
from orchestrator.model.inventory import ROLE_EVALUATOR, Host, Inventory, Job
from orchestrator.model.workers import (
    WorkerSpec,
    checkpoint_dir,
    export_dir,
    job_dir,
    job_dir_of_run,
    sync_dir,
)

# What new_run_id makes: anything else (a snapshot's name such as `x.status`, a path) is no run.
RUN_ID_PATTERN = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")


def new_run_id(now: datetime | None = None) -> str:
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(2)}"


def eval_export_flags(job: Job, job_directory: str) -> tuple[str, ...]:
    """The built-in loop's evaluation and export flags."""
    flags: list[str] = []
    if job.eval_every:
        flags += ["--eval-every", str(job.eval_every)]
    if job.steps_per_call != 1:
        flags += ["--steps-per-call", str(job.steps_per_call)]
    if job.seed is not None:
        flags += ["--seed", str(job.seed)]
    if not job.async_checkpoints:
        flags += ["--sync-checkpoints"]
    if job.export:
        flags += ["--export", job.export, "--export-dir", export_dir(job_directory)]
    return tuple(flags)


def synced_path(inventory: Inventory, path: str, job_directory: str) -> str | None:
    """Where a file of this machine inside the `sync:` directory is on a host, if it is."""
    if inventory.sync is None:
        return None
    source = PurePath(inventory.sync.source)
    if not PurePath(path).is_relative_to(source):
        return None
    return posixpath.join(sync_dir(job_directory), PurePath(path).relative_to(source).as_posix())


def uploads(
    job: Job, run_dir: str, synced: str | None = None, *, in_place: bool = False
) -> tuple[tuple[str, str], ...]:
    """A remote host gets the script and the job's files in its run directory; a worker that
    sees this machine's files (`in_place`) uses them where they are, and a script inside the
    `sync:` directory (`synced`, its path on the host) is already there."""
    if in_place:
        return ()
    local = ([job.script] if job.script and synced is None else []) + list(job.files)
    return tuple((path, posixpath.join(run_dir, posixpath.basename(path))) for path in local)


def device_flags(job: Job, host: Host) -> tuple[str, ...]:
    """The built-in loop's flags for the host's GPU settings, strategy and profiling window."""
    flags: list[str] = []
    if host.gpu_memory_growth:
        flags.append("--gpu-memory-growth")
    if host.gpu_memory_limit_mb:
        flags += ["--gpu-memory-limit-mb", str(host.gpu_memory_limit_mb)]
    if host.visible_gpus is not None and host.gpus is None:  # leased GPUs: CUDA_VISIBLE_DEVICES
        flags += ["--visible-gpus", ",".join(map(str, host.visible_gpus))]
    if host.logical_gpus:
        flags += ["--logical-gpus", str(host.logical_gpus)]
    if job.strategy != "multi-worker":
        flags += ["--strategy", job.strategy]
    if job.profile_steps:
        flags += ["--profile-steps", *map(str, job.profile_steps)]
    return tuple(flags)


def worker_argv(
    job: Job,
    host: Host,
    run_dir: str,
    checkpoints: str,
    synced: str | None = None,
    *,
    in_place: bool = False,
) -> tuple[str, ...]:
    """`in_place`: the worker sees this machine's files (Backend.reads_in_place)."""
    python = host.python
    if job.script is not None:
        script = job.script
        if not in_place:
            script = synced or posixpath.join(run_dir, posixpath.basename(job.script))
        return (python, script, *job.args)
    assert job.task is not None and job.steps is not None
    if host.role == ROLE_EVALUATOR:  # evaluates the chief's checkpoints as they appear
        return evaluator_argv(job, python, checkpoints)
    return (
        python, "-m", "worker",
        "--task", job.task,
        "--steps", str(job.steps),
        "--checkpoint-dir", checkpoints,
        "--checkpoint-every", str(job.checkpoint_every),
        "--max-to-keep", str(job.max_to_keep),
        "--batch-size", str(job.batch_size),
        "--log-every", str(job.log_every),
        *eval_export_flags(job, job_dir_of_run(run_dir)),
        *device_flags(job, host),
        *job.args,
    )  # fmt: skip


def evaluator_argv(job: Job, python: str, checkpoints: str) -> tuple[str, ...]:
    """The evaluator host of a task job: worker.evaluate watching the chief's checkpoints; it
    exits 0 once it evaluated the checkpoint of the last step (or, told to stop, the newest)."""
    assert job.task is not None and job.steps is not None
    return (
        python, "-m", "worker.evaluate", "--watch",
        "--task", job.task,
        "--checkpoint-dir", checkpoints,
        "--steps", str(job.steps),
        "--batch-size", str(job.batch_size),
    )  # fmt: skip


def plan_workers(
    inventory: Inventory,
    run_id: str,
    workdirs: dict[str, str],
    attempt: int = 0,
    secrets: Mapping[str, str] | None = None,
    *,
    reads_in_place: Callable[[Host], bool],
    alone: int = 0,
) -> list[WorkerSpec]:
    """One spec per host entry; `workdirs` maps host name to its absolute workdir on that host.
    Each attempt of a run (a restart after a failure) gets fresh run directories. `secrets`: the
    values of job.secret_env (secretenv.secret_values), for the workers' environment only.
    `reads_in_place`: the backend's answer whether a host's worker sees this machine's files.
    `alone`: the evaluator's Nth start alone in this attempt (its own run directory)."""
    specs = []
    for index, host in enumerate(inventory.hosts):
        directory = job_dir(inventory.job, workdirs[host.name])
        leaf = host.name + (f"-restart{alone}" if alone and host.role == ROLE_EVALUATOR else "")
        run_dir = posixpath.join(directory, "runs", run_id, f"attempt-{attempt}", leaf)
        checkpoints = checkpoint_dir(inventory.job, directory)
        env = {
            **inventory.job.env,
            # Unbuffered so `tail -f` shows lines as the worker prints them.
            "PYTHONUNBUFFERED": "1",
            RUN_ID_ENV: run_id,
            WORKER_ENV: host.name,
            RUN_DIR_ENV: run_dir,
            PROGRESS_FILE_ENV: posixpath.join(run_dir, PROGRESS_FILE),
            CHECKPOINT_DIR_ENV: checkpoints,
        }
        if inventory.job.keras == KERAS_LEGACY:
            env[LEGACY_KERAS_ENV] = "1"  # tf.keras is Keras 2 (tf_keras), in scripts and tasks
        if inventory.job.script is not None and inventory.job.steps is not None:
            env[TARGET_STEPS_ENV] = str(inventory.job.steps)  # the script's target (steps:)
        if host.leased_gpus is not None:  # exactly the GPUs the run's lease gave (gpus: N)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.leased_gpus))
        elif inventory.job.script is not None and host.visible_gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.visible_gpus))
        # Workers that see this machine's files start where the inventory is, so a task module
        # beside it imports; elsewhere in the synced code, if there is any.
        in_place = reads_in_place(host)
        cwd = run_dir if inventory.sync is None else sync_dir(directory)
        if in_place:
            cwd = inventory.base_dir
        script = inventory.job.script
        synced = synced_path(inventory, script, directory) if script else None
        argv = worker_argv(inventory.job, host, run_dir, checkpoints, synced, in_place=in_place)
        if script is not None:  # the same script, with its stacks on SIGUSR2 (contract)
            argv = booted(argv)
        specs.append(
            WorkerSpec(
                index=index,
                host=host,
                run_dir=run_dir,
                checkpoint_dir=checkpoints,
                cwd=cwd,
                argv=argv,
                env=env,
                tf_config=tf_config(inventory, index),
                log_max_bytes=inventory.job.log_max_mb << 20,
                uploads=uploads(inventory.job, run_dir, synced, in_place=in_place),
                secrets=dict(secrets or {}),
                warm=inventory.job.warm,
                withheld_env=inventory.controller_only_env,
            )
        )
    return specs

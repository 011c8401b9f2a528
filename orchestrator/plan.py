"""What each worker gets: its run directory, command line, environment and TF_CONFIG. Pure.

Layout on every host (paths are the host's):
  {workdir}/{job}/checkpoints/          the chief's checkpoints (job.checkpoint_dir, if relative)
  {workdir}/{job}/tensorboard/          the chief's TensorBoard events, next to the checkpoints
  {workdir}/{job}/export/               the chief's exported model (job.export), after a good run
  {workdir}/{job}/runs/{run_id}/attempt-{n}/{name}/
                                        one attempt of one worker: log, progress, exit, TF_CONFIG
"""

from __future__ import annotations

import posixpath
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from orchestrator.contract import (
    CHECKPOINT_DIR_ENV,
    EXPORT_DIR_NAME,
    PROGRESS_FILE,
    PROGRESS_FILE_ENV,
    RUN_DIR_ENV,
    RUN_ID_ENV,
    WORKER_ENV,
    WORKER_LOG,
)
from orchestrator.inventory import Host, Inventory, Job
from orchestrator.tfconfig import tf_config


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    host: Host
    run_dir: str
    checkpoint_dir: str
    cwd: str
    argv: tuple[str, ...]
    env: dict[str, str]
    tf_config: dict[str, Any]
    uploads: tuple[tuple[str, str], ...] = ()  # (path here, path on the host) before the start

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def log_path(self) -> str:
        return posixpath.join(self.run_dir, WORKER_LOG)

    def launch_request(self) -> dict[str, Any]:
        """What the host agent's `launch` verb reads."""
        return {
            "run_dir": self.run_dir,
            "cwd": self.cwd,
            "argv": list(self.argv),
            "env": self.env,
            "tf_config": self.tf_config,
        }


def new_run_id(now: datetime | None = None) -> str:
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(2)}"


def job_dir(job: Job, workdir: str) -> str:
    return posixpath.join(workdir, job.name)


def checkpoint_dir(job: Job, job_directory: str) -> str:
    return posixpath.join(job_directory, job.checkpoint_dir)  # an absolute path wins in join


def export_dir(job_directory: str) -> str:
    return posixpath.join(job_directory, EXPORT_DIR_NAME)


def job_dir_of_run(run_dir: str) -> str:
    """{job_dir}/runs/{run_id}/attempt-{n}/{name} -> {job_dir}: the layout above, backwards."""
    return posixpath.dirname(posixpath.dirname(posixpath.dirname(posixpath.dirname(run_dir))))


def eval_export_flags(job: Job, job_directory: str) -> tuple[str, ...]:
    """The built-in loop's evaluation and export flags."""
    flags: list[str] = []
    if job.eval_every:
        flags += ["--eval-every", str(job.eval_every)]
    if job.steps_per_call != 1:
        flags += ["--steps-per-call", str(job.steps_per_call)]
    if job.seed is not None:
        flags += ["--seed", str(job.seed)]
    if job.export:
        flags += ["--export", job.export, "--export-dir", export_dir(job_directory)]
    return tuple(flags)


def uploads(job: Job, host: Host, run_dir: str) -> tuple[tuple[str, str], ...]:
    """A remote host gets the script and the job's files in its run directory; a worker that
    sees this machine's files uses them where they are."""
    if host.kind.shares_files_with_controller:
        return ()
    local = ([job.script] if job.script else []) + list(job.files)
    return tuple((path, posixpath.join(run_dir, posixpath.basename(path))) for path in local)


def device_flags(job: Job, host: Host) -> tuple[str, ...]:
    """The built-in loop's flags for the host's GPU settings, strategy and profiling window."""
    flags: list[str] = []
    if host.gpu_memory_growth:
        flags.append("--gpu-memory-growth")
    if host.gpu_memory_limit_mb:
        flags += ["--gpu-memory-limit-mb", str(host.gpu_memory_limit_mb)]
    if host.visible_gpus is not None:
        flags += ["--visible-gpus", ",".join(map(str, host.visible_gpus))]
    if host.logical_gpus:
        flags += ["--logical-gpus", str(host.logical_gpus)]
    if job.strategy != "multi-worker":
        flags += ["--strategy", job.strategy]
    if job.profile_steps:
        flags += ["--profile-steps", *map(str, job.profile_steps)]
    return tuple(flags)


def worker_argv(job: Job, host: Host, run_dir: str, checkpoints: str) -> tuple[str, ...]:
    python = host.python
    if job.script is not None:
        script = job.script
        if not host.kind.shares_files_with_controller:
            script = posixpath.join(run_dir, posixpath.basename(job.script))
        return (python, script, *job.args)
    assert job.task is not None and job.steps is not None
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


def plan_workers(
    inventory: Inventory, run_id: str, workdirs: dict[str, str], attempt: int = 0
) -> list[WorkerSpec]:
    """One spec per host entry; `workdirs` maps host name to its absolute workdir on that host.
    Each attempt of a run (a restart after a failure) gets fresh run directories."""
    specs = []
    for index, host in enumerate(inventory.hosts):
        directory = job_dir(inventory.job, workdirs[host.name])
        run_dir = posixpath.join(directory, "runs", run_id, f"attempt-{attempt}", host.name)
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
        if inventory.job.script is not None and host.visible_gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.visible_gpus))
        # Workers that see this machine's files start where the inventory is, so a task module
        # beside it imports.
        cwd = inventory.base_dir if host.kind.shares_files_with_controller else run_dir
        specs.append(
            WorkerSpec(
                index=index,
                host=host,
                run_dir=run_dir,
                checkpoint_dir=checkpoints,
                cwd=cwd,
                argv=worker_argv(inventory.job, host, run_dir, checkpoints),
                env=env,
                tf_config=tf_config(inventory, index),
                uploads=uploads(inventory.job, host, run_dir),
            )
        )
    return specs

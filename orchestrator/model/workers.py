"""A worker's spec (what one attempt of one worker gets) and the layout of a job on a host.

Layout on every host (paths are the host's):
  {workdir}/{job}/checkpoints/          the chief's checkpoints (job.checkpoint_dir, if relative)
  {workdir}/{job}/tensorboard/          the chief's TensorBoard events, next to the checkpoints
  {workdir}/{job}/export/               the chief's exported model (job.export), after a good run
  {workdir}/{job}/runs/{run_id}/attempt-{n}/{name}/
                                        one attempt of one worker: log, progress, exit, TF_CONFIG
  {workdir}/{job}/standby/{name}/       the slot's standby, shared by the job's runs (agent.py)
  {workdir}/{job}/code/                 the `sync:` directory's mirror, the workers' cwd
  {workdir}/{job}/.orchestrate-setup    the hash of the `setup:` commands that last succeeded

runs/, standby/ and everything under them are private (directories 0700, files 0600): a spec
carries the job's environment. The checkpoint, TensorBoard and export directories keep the
user's umask.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract import EXPORT_DIR_NAME, TENSORBOARD_DIR_NAME, WORKER_LOG
from orchestrator.hostside import protocol
from orchestrator.model.inventory import Job, WorkerSlot
from orchestrator.model.launch import WorkerLaunch

SYNC_DIR = "code"  # under the job directory: the `sync:` directory's mirror


@dataclass(frozen=True)
class Started:
    """What a backend's start says of one worker: its supervisor's pid on its host, or the
    scheduler's job it is a task of."""

    pid: int | None = None
    job_id: str | None = None


@dataclass(frozen=True)
class WorkerSpec:
    """One attempt of one worker on a host or a Slurm node: its launch (model/launch.py) with
    what starting it there needs besides (its run directory, TF_CONFIG, uploads, the secrets'
    values)."""

    index: int
    host: WorkerSlot
    run_dir: str
    launch: WorkerLaunch
    tf_config: dict[str, Any]
    log_max_bytes: int = 0  # 0: no cap
    uploads: tuple[tuple[str, str], ...] = ()  # (path here, path on the host) before the start
    # job.secret_env's values: sent in the launch request, never written to a file on the host.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    warm: bool = True  # job.warm_restarts: the launch may hand the attempt to the slot's standby
    # Inventory.controller_only_env: names the agent drops from the environment it passes on
    # (on a local host that is the controller's own, signing secrets included).
    withheld_env: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def argv(self) -> tuple[str, ...]:
        return self.launch.argv

    @property
    def env(self) -> Mapping[str, str]:
        return self.launch.env

    @property
    def cwd(self) -> str:
        return self.launch.cwd

    @property
    def checkpoint_dir(self) -> str:
        return self.launch.checkpoint_dir

    @property
    def log_path(self) -> str:
        return posixpath.join(self.run_dir, WORKER_LOG)

    @property
    def private_dirs(self) -> tuple[str, ...]:
        """{job}/runs and each directory below it down to the run directory: created 0700."""
        return private_dirs(self.run_dir)

    def launch_request(self) -> dict[str, Any]:
        """What the host agent's `launch` verb reads (on its standard input). The agent writes
        all but `secret_env` into spec.json; `secret_env` goes to the supervisor's environment."""
        return {
            protocol.RUN_DIR_KEY: self.run_dir,
            protocol.PRIVATE_DIRS_KEY: list(self.private_dirs),
            protocol.CWD_KEY: self.cwd,
            protocol.ARGV_KEY: list(self.argv),
            protocol.ENV_KEY: dict(self.env),
            protocol.SECRET_ENV_KEY: dict(self.secrets),
            protocol.TF_CONFIG_KEY: self.tf_config,
            protocol.LOG_MAX_BYTES_KEY: self.log_max_bytes,
            protocol.WARM_KEY: self.warm,
            protocol.WITHHOLD_ENV_KEY: list(self.withheld_env),
        }

    def standby_request(self, linger: float) -> dict[str, Any]:
        """What the agent's `standby` verb reads: a standby for this worker's slot, started with
        the environment this worker has (its secrets too), backing this attempt, gone `linger`
        seconds after the attempt ended unless the next one claimed it."""
        return {
            protocol.BACKS_KEY: self.run_dir,
            protocol.PYTHON_KEY: self.argv[0],
            protocol.CWD_KEY: self.cwd,
            protocol.ENV_KEY: dict(self.env),
            protocol.SECRET_ENV_KEY: dict(self.secrets),
            protocol.LINGER_KEY: linger,
            protocol.WITHHOLD_ENV_KEY: list(self.withheld_env),
        }


def job_dir(job: Job, workdir: str) -> str:
    return posixpath.join(workdir, job.name)


def checkpoint_dir(job: Job, job_directory: str) -> str:
    return posixpath.join(job_directory, job.checkpoint_dir)  # an absolute path wins in join


def tensorboard_dir(checkpoint_directory: str) -> str:
    """The worker's default: a "tensorboard" directory beside the checkpoint directory."""
    return posixpath.join(posixpath.dirname(checkpoint_directory.rstrip("/")), TENSORBOARD_DIR_NAME)


def export_dir(job_directory: str) -> str:
    return posixpath.join(job_directory, EXPORT_DIR_NAME)


def private_dirs(run_dir: str) -> tuple[str, ...]:
    """{job}/runs/{run_id}/attempt-{n}/{name} -> ({job}/runs, ..., run_dir), outermost first."""
    chain = [run_dir]
    for _ in range(3):
        chain.append(posixpath.dirname(chain[-1]))
    return tuple(reversed(chain))


def job_dir_of_run(run_dir: str) -> str:
    """{job_dir}/runs/{run_id}/attempt-{n}/{name} -> {job_dir}: the layout above, backwards."""
    return posixpath.dirname(posixpath.dirname(posixpath.dirname(posixpath.dirname(run_dir))))


def sync_dir(job_directory: str) -> str:
    return posixpath.join(job_directory, SYNC_DIR)

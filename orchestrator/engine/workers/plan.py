"""What each worker of a run gets on a host or a Slurm node: its run directory, its placement
(from which engine/workers/launch.py makes its command line and environment), uploads and TF_CONFIG.
Pure.

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
    KERAS_JAX,
    PROGRESS_FILE,
    PROGRESS_FILE_ENV,
    RUN_DIR_ENV,
    RUN_ID_ENV,
    WORKER_ENV,
)
from orchestrator.engine.workers.launch import worker_launch
from orchestrator.engine.workers.tfconfig import tf_config
from orchestrator.model.inventory import ROLE_EVALUATOR, ROLE_WORKER, Inventory, Job, WorkerSlot
from orchestrator.model.launch import Placement
from orchestrator.model.workers import WorkerSpec, checkpoint_dir, job_dir, sync_dir

# What new_run_id makes: anything else (a snapshot's name such as `x.status`, a path) is no run.
RUN_ID_PATTERN = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")


def new_run_id(now: datetime | None = None) -> str:
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(2)}"


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


def host_placement(
    inventory: Inventory,
    host: WorkerSlot,
    directory: str,
    run_id: str,
    run_dir: str,
    *,
    in_place: bool,
) -> Placement:
    """Where a worker runs on a host (or a Slurm task): its run directory's variables, its job
    `directory`, and its script uploaded into the run directory, synced, or (`in_place`: the
    worker sees this machine's files) where it is."""
    script = inventory.job.script
    synced = synced_path(inventory, script, directory) if script else None
    if script is not None and not in_place:
        script = synced or posixpath.join(run_dir, posixpath.basename(script))
    # Workers that see this machine's files start where the inventory is, so a task module
    # beside it imports; elsewhere in the synced code, if there is any.
    cwd = run_dir if inventory.sync is None else sync_dir(directory)
    progress = posixpath.join(run_dir, PROGRESS_FILE)
    return Placement(
        python=host.python,
        job_dir=directory,
        checkpoint_dir=checkpoint_dir(inventory.job, directory),
        cwd=inventory.base_dir if in_place else cwd,
        script=script,
        run_env={
            RUN_ID_ENV: run_id,
            WORKER_ENV: host.name,
            RUN_DIR_ENV: run_dir,
            PROGRESS_FILE_ENV: progress,
        },
    )


def plan_workers(
    inventory: Inventory,
    run_id: str,
    workdirs: dict[str, str],
    attempt: int = 0,
    secrets: Mapping[str, str] | None = None,
    *,
    reads_in_place: Callable[[WorkerSlot], bool],
    alone: int = 0,
) -> list[WorkerSpec]:
    """One spec per host entry; `workdirs` maps host name to its absolute workdir on that host.
    Each attempt of a run (a restart after a failure) gets fresh run directories. `secrets`: the
    values of job.secret_env (secretenv.secret_values), for the workers' environment only.
    `reads_in_place`: the backend's answer whether a host's worker sees this machine's files.
    `alone`: the Nth start alone of an evaluator, or of a ParameterServerStrategy worker (its
    own run directory)."""
    specs = []
    for index, host in enumerate(inventory.hosts):
        directory = job_dir(inventory.job, workdirs[host.name])
        alone_role = host.role in (ROLE_EVALUATOR, ROLE_WORKER)
        leaf = host.name + (f"-restart{alone}" if alone and alone_role else "")
        run_dir = posixpath.join(directory, "runs", run_id, f"attempt-{attempt}", leaf)
        in_place = reads_in_place(host)
        place = host_placement(inventory, host, directory, run_id, run_dir, in_place=in_place)
        script = inventory.job.script
        synced = synced_path(inventory, script, directory) if script else None
        specs.append(
            WorkerSpec(
                index=index,
                host=host,
                run_dir=run_dir,
                launch=worker_launch(inventory, index, place),
                # A JAX cluster has no TF_CONFIG: its variables are in the launch's env.
                tf_config={} if inventory.job.keras == KERAS_JAX else tf_config(inventory, index),
                log_max_bytes=inventory.job.log_max_mb << 20,
                uploads=uploads(inventory.job, run_dir, synced, in_place=in_place),
                secrets=dict(secrets or {}),
                warm=inventory.job.warm,
                withheld_env=inventory.controller_only_env,
            )
        )
    return specs

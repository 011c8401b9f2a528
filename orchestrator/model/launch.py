"""One worker as it is started, wherever it runs: what every launcher and export renders. Plain
data; engine/workers/launch.py computes it, the only place that decides a worker's command line and
environment.

A `WorkerLaunch` is the same for a worker whatever starts it (the host agent, the Slurm
launcher, a TFJob's or TrainJob's pod) but for its `Placement`: the few things that are where
the worker runs (its interpreter, paths, its launcher's own variables) and that each launcher
states for its place. A renderer writes a launch into its own format (a launch request, the
batch script's plan, a container) and adds nothing to its command or its environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Placement:
    """Where a worker runs, as its launcher sees it.

    `run_env`: the launcher's variables about the worker's run directory (hosts and Slurm:
    the run id, the worker's name, its run directory and progress file), before the
    checkpoint directory's; `place_env`: the place's own, after it (what a pod's launcher
    reads, where a pod finds job.files). `host_gpus`: the worker's GPUs are the host's own
    indices (`visible_gpus`, a lease), passed on as CUDA_VISIBLE_DEVICES or --visible-gpus;
    False where a scheduler hands each worker its GPUs numbered from 0 (Slurm, Kubernetes),
    which the launch asks for by count (`WorkerLaunch.gpus`). `booted`: a script starts under
    contract.booted (its stacks on SIGUSR2 go to its run directory; a pod has none)."""

    python: str
    job_dir: str  # the worker's job directory: the built-in loop's model export goes in it
    checkpoint_dir: str
    cwd: str
    script: str | None = None  # job.script where the worker sees it
    run_env: Mapping[str, str] = field(default_factory=dict)
    place_env: Mapping[str, str] = field(default_factory=dict)
    host_gpus: bool = True
    booted: bool = True


@dataclass(frozen=True)
class WorkerLaunch:
    """One worker: its command, environment (secrets by name: each launcher has its own way to
    the values, and no launch carries one), working and checkpoint directories, the exit codes
    no restart heals, its TF_CONFIG role and index among that role, and the GPUs it asks a
    scheduler for."""

    name: str
    role: str
    task_index: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    secret_env: tuple[str, ...]
    cwd: str
    checkpoint_dir: str
    permanent_exit_codes: tuple[int, ...]
    gpus: int | None = None  # per worker, from a scheduler; None: none asked for
    # How often it is started again by itself, at its address, while the rest of the cluster
    # goes on (a ParameterServerStrategy worker, the evaluator); 0: its failure is the
    # cluster's. A launcher that restarts in place (Slurm's) reads it; on hosts the supervisor
    # does the same from the job.
    restarts_alone: int = 0

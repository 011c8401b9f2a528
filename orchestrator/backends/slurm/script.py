"""The batch script of one attempt: what `up` submits and `export --format sbatch` prints. Pure.

Self-contained: the launcher (hostside/slurm_launcher.py, bundled) and the plan (each task's run
directory, argv and environment) are embedded, so plain `sbatch script.sh` runs it where
orchestrate is not installed (a task job needs the worker package on the nodes). One task per
node under `srun --kill-on-bad-exit=1`: a failed task ends the step, as one dead
MultiWorkerMirroredStrategy worker ends the cluster anyway. `--no-requeue`: the supervisor
submits the next attempt itself.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.contract import ISOLATED, JAX_PLACE_ENV, KERAS_JAX
from orchestrator.errors import ScriptRefused
from orchestrator.hostside import protocol
from orchestrator.hostside import slurm_launcher as launcher
from orchestrator.hostside.bundle import shipped_program
from orchestrator.model.inventory import ROLE_CHIEF, ROLE_EVALUATOR, ROLE_PS, ROLE_WORKER
from orchestrator.model.slurm import (
    LAUNCHER_END,
    PLAN_END,
    SlurmSpec,
    end_marker_in,
    end_marker_problem,
)

if TYPE_CHECKING:
    from orchestrator.model.inventory import Job
    from orchestrator.model.workers import WorkerSpec

# The launcher as srun runs it: with the hostside/ modules it imports (procwatch, ...).
LAUNCHER_SOURCE = shipped_program("slurm_launcher.py")
SBATCH_SPECIAL = re.compile(r"[\"'\\#]")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def plan(
    spec: SlurmSpec, specs: Sequence[WorkerSpec], secret_env: Sequence[str] = (), keras: str = ""
) -> dict[str, object]:
    """What the launcher reads: the port, the secret variables' names (their values come from
    sbatch's environment, never from here), the kind of cluster (`keras: jax`: the JAX one) and,
    per SLURM_PROCID, where and what to run."""
    ordered = sorted(specs, key=lambda s: s.index)
    roles = any(s.launch.role != ROLE_WORKER for s in ordered)
    jax = keras == KERAS_JAX
    return {
        launcher.PORT_KEY: spec.port,
        launcher.SECRET_ENV_KEY: list(secret_env),
        **({launcher.CLUSTER_KEY: KERAS_JAX} if jax else {}),
        launcher.TASKS_KEY: [{protocol.RUN_DIR_KEY: s.run_dir,
                              protocol.PRIVATE_DIRS_KEY: list(s.private_dirs),
                              protocol.CWD_KEY: s.cwd, protocol.ARGV_KEY: list(s.argv),
                              protocol.ENV_KEY: _task_env(s, jax), **_roles(s, roles),
                              **_ends_with(s, ordered)}
                             for s in ordered],
    }  # fmt: skip


def _task_env(spec: WorkerSpec, jax: bool) -> dict[str, str]:
    """A task's environment as planned. A JAX cluster's addresses and each process's place in it
    are the nodes Slurm picks, which the launcher learns where it runs and writes then: the
    launch's own (the tasks' placeholder names, task0:PORT...) are left out of the plan."""
    if not jax:
        return dict(spec.env)
    return {key: value for key, value in spec.env.items() if key not in JAX_PLACE_ENV}


def _ends_with(spec: WorkerSpec, specs: Sequence[WorkerSpec]) -> dict[str, object]:
    """The run directories whose exit 0 ends this task, so a batch job ends once its training
    did, supervised or not: a ParameterServerStrategy ps or worker only serves, so it ends with
    the chief; the evaluator with the training (the chief, or every worker). Its launcher then
    stops its worker (the evaluator evaluates the newest checkpoint first) and tells srun it
    succeeded."""
    role = spec.launch.role
    chief = [s.run_dir for s in specs if s.launch.role == ROLE_CHIEF]
    if role in (ROLE_PS, ROLE_WORKER) and chief:
        return {launcher.ENDS_WITH_KEY: chief, launcher.ENDS_BY_KEY: "after the chief finished"}
    if role == ROLE_EVALUATOR:
        training = chief or [s.run_dir for s in specs if s.launch.role == ROLE_WORKER]
        return {
            launcher.ENDS_WITH_KEY: training,
            launcher.ENDS_BY_KEY: "after the training finished",
        }
    return {}


def _roles(spec: WorkerSpec, roles: bool) -> dict[str, object]:
    """A task's TF_CONFIG role where the job has roles (else every task is a worker), and how
    often its launcher starts it again in place (a ParameterServerStrategy worker, the
    evaluator), with the exit codes that are never restarted."""
    launch = spec.launch
    found: dict[str, object] = (
        {launcher.ROLE_KEY: launch.role, launcher.TASK_INDEX_KEY: launch.task_index}
        if roles
        else {}
    )
    if launch.restarts_alone:
        found[launcher.RESTARTS_KEY] = launch.restarts_alone
        found[launcher.PERMANENT_KEY] = list(launch.permanent_exit_codes)
    return found


def exports_all(spec: SlurmSpec) -> bool:
    """Whether sbatch is left to export the whole submitting environment (its default), which
    is how job.secret_env's values reach the tasks; the user's own --export wins."""
    return not any(arg.startswith("--export") for arg in spec.sbatch_args)


def sbatch_options(spec: SlurmSpec, job: Job, output: str | None) -> list[str]:
    options = [
        f"--job-name=orchestrate-{job.name}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        "--no-requeue",
    ]
    if spec.partition:
        options.append(f"--partition={spec.partition}")
    if spec.account:
        options.append(f"--account={spec.account}")
    if spec.time:
        options.append(f"--time={spec.time}")
    if spec.gpus_per_node:
        options.append(f"--gpus-per-node={spec.gpus_per_node}")
    if output:
        options.append(f"--output={output}")
    return [*options, *spec.sbatch_args]


def sbatch_quote(option: str) -> str:
    """One option as sbatch reads it from an `#SBATCH` line: a backslash before each quote,
    backslash or '#' (which would start a comment there), and double quotes around it when it
    holds a space (a backslash does not keep a space in an option: measured, Slurm's parser
    ends the option first), so a workdir with a space stays one --output. A control character
    never gets this far: the inventory refuses them (values.string), and this refuses them
    again."""
    if CONTROL.search(option):
        raise ValueError(f"an sbatch option holds a control character: {option!r}")
    escaped = SBATCH_SPECIAL.sub(r"\\\g<0>", option)
    return f'"{escaped}"' if any(c.isspace() for c in option) else escaped


def _what_runs(spec: SlurmSpec, job: Job) -> list[str]:
    if job.keras == KERAS_JAX:
        return ["# worker per node (keras: jax); each task's JAX cluster (KERAS_DISTRIBUTION_*,",
                "# JAX_*) is written from SLURM_PROCID and"]  # fmt: skip
    if not spec.roles:
        return ["# worker per node; each task's TF_CONFIG is written from SLURM_PROCID and"]
    counts = ", ".join(f"{spec.roles.count(r)} {r}" for r in dict.fromkeys(spec.roles))
    return [f"# task per node ({counts}); each task's TF_CONFIG, of its role",
            "# in the plan, is written from SLURM_PROCID and"]  # fmt: skip


def _secret_comment(job: Job) -> list[str]:
    if not job.secret_env:
        return []
    names = " ".join(job.secret_env)
    return [
        f"# Secrets (job.secret_env) are never written here: export {names}",
        "# in the shell that runs sbatch; its --export=ALL passes them to the tasks.",
    ]


def refuse_end_markers(job: Job, body: str) -> None:
    """ScriptRefused (exit 2) naming the value that holds an end marker of the batch script's
    here-documents: the job's own values by their key, else the plan's (a path)."""
    named = [*((f"job.env.{key}", f"{key}={value}") for key, value in job.env.items()),
             *(("job.args", arg) for arg in job.args),
             ("the plan (a path, or a value orchestrate sets)", body)]  # fmt: skip
    for key, value in named:
        marker = end_marker_in(value)
        if marker is not None:
            raise ScriptRefused(f"{key} {end_marker_problem(marker)}",
                                hint="change that value; no script was written")  # fmt: skip


def batch_script(
    spec: SlurmSpec, job: Job, specs: Sequence[WorkerSpec], output: str | None = None
) -> str:
    body = json.dumps(plan(spec, specs, job.secret_env, job.keras), indent=1)
    refuse_end_markers(job, body)
    srun = [  # spawn point: srun starts the launcher, one task per node
        "srun", "--kill-on-bad-exit=1", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1", spec.python, *ISOLATED, "-c",
    ]  # fmt: skip
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {sbatch_quote(option)}" for option in sbatch_options(spec, job, output)),
        f"# Generated by orchestrate for job {job.name}: {spec.nodes} node(s), one "
        + ("Keras 3/JAX" if job.keras == KERAS_JAX else "TensorFlow"),
        *_what_runs(spec, job),
        f"# SLURM_STEP_NODELIST with port {spec.port}. Submit with: sbatch THIS_FILE",
        *_secret_comment(job),
        "set -euo pipefail",
        f"ORCHESTRATE_SLURM_PLAN=$(cat <<'{PLAN_END}'",
        body,
        PLAN_END,
        ")",
        "export ORCHESTRATE_SLURM_PLAN",
        f"ORCHESTRATE_LAUNCHER=$(cat <<'{LAUNCHER_END}'",
        LAUNCHER_SOURCE.rstrip("\n"),
        LAUNCHER_END,
        ")",
        "# exec: a preemption's SIGTERM reaches srun, which passes it to every task.",
        f'exec {shlex.join(srun)} "$ORCHESTRATE_LAUNCHER"',
    ]
    return "\n".join(lines) + "\n"

"""The `job:` block of the inventory: its keys (the entries the key reference is written from)
and its parser, each problem reported with its line."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.config.report import Report, line_of
from orchestrator.config.tracking import parse_tracking, tracking_env_problems
from orchestrator.contract import (
    EXPORT_FORMATS,
    JAX_CLUSTER_ENV,
    KERAS_SETTINGS,
    LEGACY_KERAS_ENV,
    RESERVED_ENV_PREFIXES,
    STRATEGY_PS,
    task_problem,
)
from orchestrator.model.inventory import Job
from orchestrator.paths import controller_path
from orchestrator.values import (
    NAME_PATTERN,
    POSITIVE,
    Checked,
    Checker,
    Key,
    boolean,
    checkers,
    choice,
    integer,
    integers,
    name,
    scalar_string,
    string,
)
from orchestrator.yamlsource import LineList, LineMap

ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _task(value: Any) -> Checked:
    problem = task_problem(value)
    return (None, problem) if problem else (value, None)


# `job:`'s keys; the manual's key reference is written from these entries.
JOB_KEY_ENTRIES: tuple[Key, ...] = (
    Key("name", "name", "the file's name", "names the job's directory `{workdir}/{name}/`", name),
    Key("task", "`module:function`", "",
        "`module:function` returning a `worker.task.TrainingTask`, run by the built-in loop",
        _task),
    Key("script", "string (a path on this machine)", "",
        "your own training script, started with `TF_CONFIG` set (exactly one of `task`, "
        "`script`)", string),
    Key("args", "list of strings", "`[]`",
        "arguments for the script, or extra `python -m worker` flags for a task",
        scalar_string),  # checked per item
    Key("env", "mapping of names to strings", "`{}`",
        "extra environment variables (`TF_CONFIG` and `ORCHESTRATE_*` are set by orchestrate)",
        scalar_string),  # checked per value
    Key("secret_env", "list of variable names", "`[]`",
        "variables whose values `up` takes from its own environment: they reach the workers' "
        "environment only, never the inventory, records, logs or status (see Security)",
        string),  # checked per item
    Key("files", "list of strings (paths on this machine)", "`[]`",
        "files or directories uploaded next to the script on SSH hosts",
        string),  # checked per item
    Key("steps", "integer, at least 1", "required for `task`",
        "total training steps; for a `script` its target (`ORCHESTRATE_TARGET_STEPS`, "
        "`worker.target_steps()`): a worker that exits 0 below it fails as stopped short",
        POSITIVE),
    Key("checkpoint_dir", "string", "`checkpoints`",
        "relative to `{workdir}/{name}/`, or absolute (a shared disk)", string),
    Key("checkpoint_every", "integer, at least 1", "`100`", "steps between checkpoints",
        POSITIVE),
    Key("max_to_keep", "integer, at least 1", "`3`", "checkpoints kept", POSITIVE),
    Key("batch_size", "integer, at least 1", "`64`",
        "global batch size, split across the workers", POSITIVE),
    Key("log_every", "integer, at least 1", "`10`",
        "steps between log lines and progress updates", POSITIVE),
    Key("stall_timeout", "integer, at least 1 (seconds)", "`300`",
        "seconds without a new step (or an answer from the host) before a worker counts as "
        "failed; keep it above `log_every` times the time of a step, and above the time of one "
        "evaluation; counted from the worker's first step (before it: `start_timeout`)",
        POSITIVE),
    Key("start_timeout", "integer, at least 1 (seconds)",
        "the larger of `300` and `stall_timeout`",
        "seconds from a worker's start to its first step (importing TensorFlow, the cluster "
        "forming, the first step's tracing) before it counts as failed; a slow start on a "
        "loaded host spends no restart while it stays within it", POSITIVE),
    Key("max_restarts", "integer, at least 0", "`3`",
        "restarts of the whole cluster before the run fails", integer(0)),
    Key("max_worker_restarts", "integer, at least 0", "`6`",
        "under `strategy: parameter-server`: how often each `worker` task that failed is "
        "started again by itself, at its address, while the chief and the ps keep training "
        "(a lost ps or chief restarts the cluster: `max_restarts`); once a worker has used "
        "them all, its next failure fails the run. `0`: a lost worker fails the run",
        integer(0)),
    Key("restart_backoff", "integer, 0 to 3600 (seconds)", "`5`",
        "seconds before the first restart, doubling after each", integer(0, 3600)),
    Key("partition_timeout", "integer, 0 to 86400 (seconds)", "`600`",
        "how long a restart waits, spending no restart, while the hosts cannot reach each "
        "other's TensorFlow port; then the run fails naming the blocked pairs",
        integer(0, 86400)),
    Key("warm_restarts", "boolean",
        "`true` for `task:`, `false` for `script:` (or `$ORCHESTRATE_WARM_RESTARTS`: 0 or 1)",
        "keep, per worker slot, a standby Python that has imported TensorFlow, so a restart "
        "skips the import; `false`: every attempt starts its workers afresh. Off for scripts "
        "unless set: a script may set TensorFlow's variables (`TF_USE_LEGACY_KERAS`, "
        "`TF_CPP_MIN_LOG_LEVEL`) itself before its import, which a standby has already done",
        boolean),
    Key("linger", "integer, 0 to 86400 (seconds)", "`300` (or `$ORCHESTRATE_LINGER`)",
        "how long a run's standbys (see `warm_restarts`) stay after the run ended, succeeded, "
        "failed or stopped, so that the next `up` of the job on the same hosts starts its "
        "workers from them, with TensorFlow imported; `0`: none stay. They hold no port and "
        "no lease, about 560 MiB each; `status` lists them, `down` discards them. Hosts only "
        "(Slurm keeps no standbys)", integer(0, 86400)),
    Key("log_max_mb", "integer, 1 to 1048576", "`64`",
        "each worker's `worker.log` is rotated past this size (one older `worker.log.1` kept), "
        "so a long run cannot fill a disk with its log", integer(1, 1 << 20)),
    Key("permanent_exit_codes", "list of integers, 1 to 255", "`[2]`",
        "exit codes that end the run at once instead of restarting (2: the worker's usage "
        "errors)", integer(1, 255)),  # checked per item
    Key("strategy", "`multi-worker`, `mirrored` or `parameter-server`", "`multi-worker`",
        "`mirrored`: MirroredStrategy over one host's devices (one host only); "
        "`parameter-server`: a ParameterServerStrategy `script:` with a `chief`, `ps` and "
        "`worker` hosts (`role:`); the run ends when the chief exits 0",
        choice("multi-worker", "mirrored", STRATEGY_PS)),
    Key("profile_steps", "list of two integers, at least 1", "",
        "`[start, end]`: the chief records a graph trace and profile of those steps for "
        "TensorBoard", integers(1, length=2)),
    Key("eval_every", "integer, at least 1", "",
        "steps between evaluations on the task's `eval_dataset` (it is always evaluated after "
        "the last step); needs a task with one", POSITIVE),
    Key("export", " or ".join(f"`{f}`" for f in EXPORT_FORMATS), "",
        "at the end of a successful run the chief writes the model to "
        "`{workdir}/{name}/export/`", choice(*EXPORT_FORMATS)),
    Key("keras", " or ".join(f"`{k}`" for k in KERAS_SETTINGS), "`default`",
        "`legacy`: every worker runs with `TF_USE_LEGACY_KERAS=1`, so `tf.keras` is Keras 2 "
        "(tf_keras): model.fit under MultiWorkerMirroredStrategy, `reset_states`, tf.keras 2 "
        "code; `default`: the Keras 3 that ships with TensorFlow; `jax`: Keras 3 on the JAX "
        "backend, a `script:` or the built-in loop (`task:`, its dataset factories returning "
        "NumPy arrays), across the hosts by `keras.distribution` (each worker gets "
        "`KERAS_BACKEND=jax` and the `KERAS_DISTRIBUTION_*` and `JAX_*` cluster variables, "
        "no TF_CONFIG; see Keras 3 across machines)", choice(*KERAS_SETTINGS)),
    Key("steps_per_call", "integer, at least 1", "`1`",
        "training steps run inside one `tf.function` call; `log_every`, `checkpoint_every` and "
        "`eval_every` must be multiples of it", POSITIVE),
    Key("seed", "integer, at least 0", "",
        "seeds the initial weights (Python, NumPy, TensorFlow, Keras): two runs with the same "
        "seed and settings train alike", integer(0)),
    Key("async_checkpoints", "boolean", "`true`",
        "the built-in loop's checkpoint saves return once the values are copied, and "
        "TensorFlow writes the files in the background (its async checkpoint); the last save "
        "and a preemption's always block. `false`: every save blocks the step loop", boolean),
    Key("queue", "boolean", "`false`",
        "when another job holds (or an earlier queued job waits for) a port or GPU this job "
        "leases, wait for it as `pending` instead of failing, in the order of arrival, and "
        "start as soon as everything is free (as `up --queue`; see Shared machines)", boolean),
    Key("tracking", "mapping (see `job.tracking` below)", "",
        "one MLflow and/or Weights & Biases run per run, whatever its restarts: every worker "
        "of every attempt logs into it, and orchestrate logs the job's settings, the restarts, "
        "the goodput and the verdict (see Experiment tracking)", lambda value: (value, None)),
)  # fmt: skip
JOB_KEYS: dict[str, Checker] = checkers(JOB_KEY_ENTRIES)

# Keys parsed by their own functions (lists and mappings, checked per item; tracking's in
# config/tracking.py).
LIST_JOB_KEYS = ("args", "env", "secret_env", "files", "permanent_exit_codes", "tracking")


def parse_job(document: LineMap, report: Report, stem: str, base: Path) -> Job | None:
    block = document.get("job")
    if "job" not in document:
        report.add(document.line, "job", "missing; say what to run with job.task or job.script")
        return None
    if not isinstance(block, LineMap):
        report.add(line_of(document, "job"), "job", "expected a mapping")
        return None
    report.unknown_keys(block, JOB_KEYS, "job")
    values = report.checked(block, JOB_KEYS, "job", skip=LIST_JOB_KEYS)
    if "script" in values:
        script = controller_path(values["script"], base)
        if not script.is_file():
            report.add(line_of(block, "script"), "job.script", f"no such file: {script}")
        values["script"] = str(script)
    values["args"] = _parse_args(block, report)
    values["files"] = _parse_files(block, report, base)
    if "permanent_exit_codes" in block:
        values["permanent_exit_codes"] = _parse_exit_codes(block, report)
    values["env"] = _parse_env(block, report)
    values["secret_env"] = _parse_secret_env(block, report, values["env"])
    values.setdefault("name", stem if NAME_PATTERN.fullmatch(stem) else "job")
    if "tracking" in block:
        values["tracking"] = parse_tracking(block, report)
        tracking_env_problems(block, report)
    if ("task" in block) == ("script" in block):
        report.add(
            block.line,
            "job",
            "set exactly one of 'task' (module:function for the built-in "
            "training loop) or 'script' (your own training script)",
        )
    if "task" in block and "steps" not in block:
        report.add(block.line, "job.steps", "missing; the built-in loop needs a step count")
    return Job(**values)


def _parse_args(block: LineMap, report: Report) -> tuple[str, ...]:
    return report.checked_list(block.get("args", LineList()), line_of(block, "args"), "job.args",
                               scalar_string, not_a_list="expected a list of strings")  # fmt: skip


def _parse_exit_codes(block: LineMap, report: Report) -> tuple[int, ...]:
    return report.checked_list(block["permanent_exit_codes"],
                               line_of(block, "permanent_exit_codes"), "job.permanent_exit_codes",
                               JOB_KEYS["permanent_exit_codes"],
                               not_a_list="expected a list of exit codes")  # fmt: skip


def _parse_files(block: LineMap, report: Report, base: Path) -> tuple[str, ...]:
    def exists(value: str) -> Checked:
        path = controller_path(value, base)
        return (str(path), None) if path.exists() else (None, f"no such file or directory: {path}")

    return report.checked_list(block.get("files", LineList()), line_of(block, "files"),
                               "job.files", string, not_a_list="expected a list of paths",
                               extra=exists)  # fmt: skip


def _parse_env(block: LineMap, report: Report) -> dict[str, str]:
    raw = block.get("env", LineMap())
    if not isinstance(raw, LineMap):
        report.add(line_of(block, "env"), "job.env", "expected a mapping of NAME: value")
        return {}
    env = {}
    for key, item in raw.items():
        where = f"job.env.{key}"
        if not isinstance(key, str) or not ENV_NAME_PATTERN.fullmatch(key):
            report.add(line_of(raw, key), where, "expected an environment variable name")
            continue
        if key.startswith(RESERVED_ENV_PREFIXES):
            report.add(line_of(raw, key), where, "is set by orchestrate for each worker")
            continue
        if key in JAX_CLUSTER_ENV:
            report.add(line_of(raw, key), where,
                       "set 'job.keras: jax' instead: orchestrate then gives each worker its "
                       "own (job.env is the same on every worker)")  # fmt: skip
            continue
        if key == LEGACY_KERAS_ENV:
            report.add(line_of(raw, key), where,
                       "set 'job.keras: legacy' instead: orchestrate then sets it on every "
                       "worker and checks that tf_keras is installed")  # fmt: skip
            continue
        value, problem = scalar_string(item)
        if problem:
            report.add(line_of(raw, key), where, problem)
        else:
            env[key] = value
    return env


def _env_name(item: Any) -> Checked:
    if isinstance(item, str) and ENV_NAME_PATTERN.fullmatch(item):
        return item, None
    return None, ("expected an environment variable name (its value is taken from the "
                  "environment of 'orchestrate up')")  # fmt: skip


def _parse_secret_env(block: LineMap, report: Report, env: Mapping[str, str]) -> tuple[str, ...]:
    names: set[str] = set()  # those kept so far: each passed every check below

    def allowed(item: str) -> Checked:
        if item.startswith(RESERVED_ENV_PREFIXES):
            return None, "is set by orchestrate for each worker"
        if item in env:
            return None, (f"{item} is also in job.env; a secret's value must not be written in "
                          "the inventory")  # fmt: skip
        if item in names:
            return None, f"{item} is listed twice"
        names.add(item)
        return item, None

    return report.checked_list(block.get("secret_env", LineList()), line_of(block, "secret_env"),
                               "job.secret_env", _env_name,
                               not_a_list="expected a list of environment variable names",
                               extra=allowed)  # fmt: skip

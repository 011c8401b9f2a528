"""`job:`'s keys: their types, defaults, meanings and checkers, from which the loader checks a
job block and the manual's key reference is written (docs/hooks/reference.py)."""

from __future__ import annotations

from typing import Any

from orchestrator.contract import EXPORT_FORMATS, KERAS_SETTINGS, task_problem
from orchestrator.model.inventory import STRATEGY_PS
from orchestrator.values import (
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
        "code; `default`: the Keras 3 that ships with TensorFlow", choice(*KERAS_SETTINGS)),
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
)  # fmt: skip
JOB_KEYS: dict[str, Checker] = checkers(JOB_KEY_ENTRIES)

# Keys parsed by their own functions below (lists and mappings, checked per item).
LIST_JOB_KEYS = ("args", "env", "secret_env", "files", "permanent_exit_codes")

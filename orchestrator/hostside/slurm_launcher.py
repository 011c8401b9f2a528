"""The launcher that srun starts once per task: it writes the task's TF_CONFIG from Slurm's
allocation and runs the worker, leaving the same files in its run directory as the host agent.

STANDARD LIBRARY ONLY: its source is embedded in the batch script, so a node needs nothing but a
Python interpreter (and the worker package for a task job). TF_CONFIG comes from SLURM_PROCID
(the worker index) and SLURM_STEP_NODELIST expanded in order, with the inventory's port; not
from TensorFlow's SlurmClusterResolver, which fails on nodes without GPUs (tensorflow#56894).

The plan arrives in the environment (ORCHESTRATE_SLURM_PLAN, JSON): the port, the names of the
job's secret_env variables, and one entry per task with its run directory (and the private
directories above it, made 0700), working directory, argv and environment. The secrets' values
are never in the plan or the script: sbatch exports them from the submitting environment
(`--export`), and a task missing one exits 2 naming it. "{SLURM_JOB_ID}" and
"{SLURM_SUBMIT_DIR}" in them are replaced by Slurm's values (the exported script uses them), and
a leading "~/" is the node's home.

Files in a task's run directory (rundir.py names them): node, pid, worker.pid, worker.log,
progress.json (the worker's), restarts.json (a worker started again in place: each earlier
exit), stacks.txt and stacks.pid (the worker's stack dumps on SIGUSR2,
which this launcher passes on), exit.json (rundir.record_exit's, as the agent's minder writes it,
with "joined" for a task of a multi-worker job that loaded TensorFlow: whether it listened on
its port, JoinWatch).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

# Annotations naming a generic are strings, never evaluated: the node's python3 may be older than
# the controller's (Python 3.7 or newer: contract.py; a shipped program has no __future__ import).
if TYPE_CHECKING:
    from collections.abc import Callable

if __package__:  # imported as part of orchestrate: script.py, the controller's tests
    from orchestrator import contract
    from orchestrator.hostside import procwatch, protocol, rundir, safefiles
else:  # shipped: hostside/bundle.py carries them in front of this file's source
    import contract  # type: ignore[no-redef]
    import procwatch  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import rundir  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]

PLAN_ENV = "ORCHESTRATE_SLURM_PLAN"
JOB_ID_PLACEHOLDER = "{SLURM_JOB_ID}"
SUBMIT_DIR_PLACEHOLDER = "{SLURM_SUBMIT_DIR}"
# The plan (backends/slurm/script.plan writes it, main reads it): the port, the secret
# variables' names and, per SLURM_PROCID, a task: the launch spec's run directory, private
# directories, cwd, argv and env (protocol.py's keys) with those below.
PORT_KEY = "port"
SECRET_ENV_KEY = "secret_env"  # names only: their values come from sbatch's environment
TASKS_KEY = "tasks"
ROLE_KEY = "role"  # where the job has roles: the task's TF_CONFIG type
TASK_INDEX_KEY = "task_index"  # and its index among the tasks of that type
RESTARTS_KEY = "restarts"  # how often its launcher starts it again in place
PERMANENT_KEY = "permanent"  # the exit codes it is never started again after
ENDS_WITH_KEY = "ends_with"  # the run directories whose exit 0 ends this task
ENDS_BY_KEY = "ends_by"  # why, as its stop request says
# "jax" for a `job.keras: jax` job: its cluster is the JAX one (contract.jax_cluster_env), from
# the same node list and port, instead of TF_CONFIG.
CLUSTER_KEY = "cluster"


def _split_top_level(text):
    """'a[1-2],b' -> ['a[1-2]', 'b']: commas inside brackets belong to a range."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part for part in parts if part]


def _expand_ranges(ranges):
    """'01-03,7' -> ['01', '02', '03', '7'] (zero padding kept, as Slurm writes it)."""
    values = []
    for item in ranges.split(","):
        low, _, high = item.partition("-")
        if not high:
            values.append(low)
            continue
        width = len(low) if low.startswith("0") else 0
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def expand_nodelist(nodelist):
    """Slurm's compressed host list, in order: 'n[1-2],g[07-08]' -> ['n1', 'n2', 'g07', 'g08']."""
    names = []
    for part in _split_top_level(nodelist.strip()):
        match = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", part)
        if match is None:
            names.append(part)
            continue
        prefix, ranges, rest = match.groups()
        for value in _expand_ranges(ranges):
            names.extend(
                expand_nodelist(prefix + value + rest) if "[" in rest else [prefix + value + rest]
            )
    return names


def tf_config(nodes, port, index, roles=None):
    """Task `index`'s TF_CONFIG: one task per node, in SLURM_PROCID order. `roles`: each task's
    type in that order (the plan's; None: every task a worker); a task's index is its place
    among the tasks of its type (contract.tf_config, as every launcher builds it)."""
    roles = list(roles) if roles else [contract.ROLE_WORKER] * len(nodes)
    if len(roles) != len(nodes):
        raise ValueError(f"{len(roles)} task(s) planned, {len(nodes)} node(s) in the step")
    return contract.tf_config([f"{node}:{port}" for node in nodes], roles, index)


# Shared with the host agent: the same checks, the same files (safefiles.py, rundir.py).
_write_json = safefiles.write_json
_write = safefiles.write_text
_make_private_dirs = safefiles.make_private_dirs
UnsafeDirectory = safefiles.UnsafeDirectory


def _filler(job_id: str, submit_dir: str) -> "Callable[[str], str]":
    """Fills in a plan value: Slurm's job id and submit directory, a leading "~/" the home."""

    def fill(text: str) -> str:
        text = text.replace(JOB_ID_PLACEHOLDER, job_id).replace(SUBMIT_DIR_PLACEHOLDER, submit_dir)
        return os.path.expanduser(text) if text.startswith("~/") else text

    return fill


def _prepare_run_dir(task: dict, fill: "Callable[[str], str]") -> str:
    """The task's private directories and run directory, made; node and pid written there."""
    run_dir = os.path.expanduser(fill(task[protocol.RUN_DIR_KEY]))
    _make_private_dirs(
        [os.path.expanduser(fill(d)) for d in task.get(protocol.PRIVATE_DIRS_KEY, [])]
    )
    os.makedirs(run_dir, exist_ok=True)
    _write(os.path.join(run_dir, rundir.NODE_FILE), socket.gethostname())
    _write(os.path.join(run_dir, rundir.PID_FILE), str(os.getpid()))
    return run_dir


def jax_env(nodes, port, index, visible_gpus=None):
    """Task `index`'s JAX cluster (job.keras: jax): every node's host:port in SLURM_PROCID order,
    the first the coordinator. JAX_LOCAL_DEVICE_IDS too: without it, jax.distributed.initialize
    fills the local device ids it was not given from Slurm's variables (its SlurmCluster:
    [SLURM_LOCALID], i.e. [0] with one task per node), which would leave each task one of the
    GPUs Slurm gave it; `visible_gpus` (Slurm's CUDA_VISIBLE_DEVICES) keeps them all."""
    env = contract.jax_cluster_env([f"{node}:{port}" for node in nodes], index)
    count = len([g for g in (visible_gpus or "").split(",") if g.strip()])
    env[contract.JAX_LOCAL_DEVICES_ENV] = ",".join(str(i) for i in range(max(count, 1)))
    return env


def _worker_env(
    task: dict, fill: "Callable[[str], str]", config: dict, cluster: "dict[str, str]"
) -> "dict[str, str]":
    """The node's environment, the task's, then its cluster: TF_CONFIG, or (config empty) the
    JAX cluster's variables and no TF_CONFIG, not even one the submitting shell exported."""
    env = dict(os.environ)
    env.update({key: fill(value) for key, value in task[protocol.ENV_KEY].items()})
    if config:
        env[contract.TF_CONFIG_ENV] = json.dumps(config)
    else:
        env.pop(contract.TF_CONFIG_ENV, None)
    env.update(cluster)
    return env


def _refuse_missing_secrets(index: int, run_dir: str, started: float, missing: "list[str]") -> int:
    error = (
        f"job.secret_env: {', '.join(missing)} not in the job's environment; export "
        "them where you run sbatch (and keep sbatch's --export=ALL)"
    )
    print(f"task {index}: {error}", flush=True)
    rundir.record_exit(run_dir, 2, started, error)
    return 2


def _start_worker(
    task: dict,
    fill: "Callable[[str], str]",
    env: "dict[str, str]",
    run_dir: str,
    started: float,
    *,
    piped: bool = False,
) -> "subprocess.Popen[bytes] | None":
    """The worker, writing to worker.log (`piped`: to a pipe this launcher copies there); None,
    with exit.json written, when it cannot start."""
    log_fd = rundir.open_log(os.path.join(run_dir, rundir.WORKER_LOG))
    log = open(log_fd, "ab")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(  # spawn point: the task's worker
            [fill(a) for a in task[protocol.ARGV_KEY]],
            cwd=os.path.expanduser(fill(task[protocol.CWD_KEY])),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if piped else log,
            stderr=subprocess.STDOUT,
        )
    except OSError as exc:
        rundir.record_exit(
            run_dir, 127, started, f"cannot start {task[protocol.ARGV_KEY][0]}: {exc}"
        )
        return None
    finally:
        if piped:
            log.close()


def _wait_forwarding_signals(
    child: "subprocess.Popen[bytes]", run_dir: str, secrets: "list[bytes] | None" = None
) -> int:
    """The worker's return code; until then SIGTERM, SIGINT and SIGUSR1 are passed on to it,
    and SIGUSR2 (`orchestrate stacks`) to the process that registered its stack dump. With
    `secrets`, its output is copied into worker.log meanwhile, redacted."""

    def forward(signum: int, _frame: object) -> None:
        # Preemption or `orchestrate down`: the worker saves a checkpoint and exits 75.
        if signum != signal.SIGUSR1:
            _SIGNALLED.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(signum, forward)
    signal.signal(signal.SIGUSR2, lambda _signum, _frame: _forward_stacks(child, run_dir))
    if secrets is not None:
        _copy_redacted(child, os.path.join(run_dir, rundir.WORKER_LOG), secrets)
    return child.wait()


def _forward_stacks(child: "subprocess.Popen[bytes]", run_dir: str) -> None:
    """SIGUSR2 to the worker's registered pid (stacks.pid, contract.STACKS_PID_FILE), only if
    it is the worker or its child: a process without the handler would die of SIGUSR2."""
    try:
        with open(os.path.join(run_dir, contract.STACKS_PID_FILE), encoding="utf-8") as handle:
            pid = int(handle.read().strip())
        if child.poll() is None and (pid == child.pid or _parent_of(pid) == child.pid):
            os.kill(pid, signal.SIGUSR2)
    except (OSError, ValueError):
        return


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


# --- secrets a script prints: the host agent's redaction (issue 25, rundir.py) ------------------


def _copy_redacted(child: "subprocess.Popen[bytes]", log_path: str, secrets: "list[bytes]") -> None:
    """The worker's output into worker.log line by line, each secret value as [redacted], until
    it ends (or the worker did, and a process it left holds the pipe)."""
    log = rundir.open_log(log_path)
    try:
        rundir.copy_output(child, lambda chunk: os.write(log, chunk), secrets)
    finally:
        os.close(log)


def _srun_exit(index: int, returncode: int) -> int:
    """Says how the worker exited, and picks the launcher's own exit code for srun."""
    print(f"task {index} on {socket.gethostname()}: worker exited {returncode}", flush=True)
    if returncode == contract.EXIT_PREEMPTED:
        # Not a bad exit for srun: the peers are saving at the same step and exit 75 too. Were
        # it one, --kill-on-bad-exit would SIGTERM them while they finish (measured: a peer
        # then dies of it after its save). exit.json keeps the 75 for the supervisor.
        print(f"task {index}: preempted, saved a checkpoint; resubmit to resume", flush=True)
        return 0
    # A signal's death reads to srun as 128+N, so --kill-on-bad-exit ends the other tasks.
    return returncode if returncode >= 0 else 128 - returncode


def main():
    plan = json.loads(os.environ.pop(PLAN_ENV))
    index = int(os.environ["SLURM_PROCID"])
    job_id = os.environ.get("SLURM_JOB_ID", "")
    nodes = expand_nodelist(
        os.environ.get("SLURM_STEP_NODELIST") or os.environ["SLURM_JOB_NODELIST"]
    )
    fill = _filler(job_id, os.environ.get("SLURM_SUBMIT_DIR", os.getcwd()))
    task = plan[TASKS_KEY][index]
    try:
        run_dir = _prepare_run_dir(task, fill)
    except UnsafeDirectory as exc:
        print(f"task {index}: {exc}", file=sys.stderr, flush=True)
        return 3
    config, cluster = _cluster_of(plan, nodes, index)
    _write_json(os.path.join(run_dir, rundir.TF_CONFIG_FILE), config)
    env = _worker_env(task, fill, config, cluster)
    missing = [name for name in plan.get(SECRET_ENV_KEY, []) if name not in os.environ]
    if missing:
        return _refuse_missing_secrets(index, run_dir, time.time(), missing)
    secrets = rundir.secret_values(plan.get(SECRET_ENV_KEY, []), os.environ)
    started = {
        "fill": fill,
        protocol.ENV_KEY: env,
        protocol.RUN_DIR_KEY: run_dir,
        "config": config,
        "secrets": secrets,
    }
    returncode = _run_worker(index, task, started)
    if returncode is None:
        return 127
    if _ENDED:
        print(f"task {index}: stopped {task[ENDS_BY_KEY]}", flush=True)
        return 0  # not a bad exit: srun's --kill-on-bad-exit would end the others' last work
    if (
        config
        and config[contract.TF_TASK][contract.TF_TYPE] == contract.ROLE_EVALUATOR
        and (returncode != 0)
    ):
        # The evaluator's failure is not the training's: exit.json keeps it for the
        # supervisor, and srun's --kill-on-bad-exit leaves the training tasks running.
        print(f"task {index}: the evaluator exited {returncode}; the training goes on",
              flush=True)  # fmt: skip
        return 0
    return _srun_exit(index, returncode)


def _cluster_of(plan, nodes, index):
    """Task `index`'s TF_CONFIG (empty for a JAX cluster) and its JAX cluster's variables (none
    for a TensorFlow job), from the node list and the plan's port and roles."""
    if plan.get(CLUSTER_KEY) == contract.KERAS_JAX:
        return {}, jax_env(nodes, plan[PORT_KEY], index, os.environ.get(contract.CUDA_DEVICES_ENV))
    task = plan[TASKS_KEY][index]
    roles = [t[ROLE_KEY] for t in plan[TASKS_KEY]] if ROLE_KEY in task else None
    config = tf_config(nodes, plan[PORT_KEY], index, roles)
    tf_task = config[contract.TF_TASK]
    tf_task[contract.TF_INDEX] = task.get(TASK_INDEX_KEY, tf_task[contract.TF_INDEX])  # launch's
    return config, {}


# --- a worker started again in place (issue 45) -------------------------------------------------
# A ParameterServerStrategy worker (or the evaluator) whose plan entry has "restarts": N is
# started again here, at the same node and port with the same TF_CONFIG, up to N times, while
# the chief and the ps go on: the chief's ClusterCoordinator takes a worker back once its server
# answers at the same address. Each restart is recorded in restarts.json (rundir.RESTARTS_FILE),
# which the supervisor reads through its probe; only the last exit is exit.json, and only that
# one reaches srun (whose --kill-on-bad-exit then ends the step).
# The stop signals this launcher passed on: a worker they end is not restarted.
_SIGNALLED: "list[int]" = []
KEPT_RESTARTS = 100  # restarts.json keeps the newest ones (the count is the supervisor's)


def _run_worker(index, task, how):
    """The worker's last return code (None: it could not start), after its restarts. `how`:
    the plan's filler, the worker's environment, its run directory, TF_CONFIG and secrets."""
    fill, env, run_dir, secrets = (
        how["fill"],
        how[protocol.ENV_KEY],
        how[protocol.RUN_DIR_KEY],
        how["secrets"],
    )
    budget = int(task.get(RESTARTS_KEY, 0))
    history = []
    while True:
        started = time.time()
        child = _start_worker(task, fill, env, run_dir, started, piped=bool(secrets))
        if child is None:
            return None
        _write(os.path.join(run_dir, rundir.WORKER_PID_FILE), str(child.pid))
        watch = procwatch.JoinWatch(child.pid, how["config"])
        _end_with(task, fill, run_dir, child)
        returncode = _wait_forwarding_signals(child, run_dir, secrets if secrets else None)
        joined = watch.joined()
        again = len(history) < budget and restartable(
            returncode, joined, task.get(PERMANENT_KEY, []), bool(_SIGNALLED),
            os.path.exists(os.path.join(run_dir, rundir.STOP_FILE)))  # fmt: skip
        if not again:
            rundir.record_exit(run_dir, returncode, started, None, joined, secrets=secrets)
            return returncode
        history.append(_restart_entry(run_dir, returncode, started, secrets))
        _write_json(os.path.join(run_dir, rundir.RESTARTS_FILE), history[-KEPT_RESTARTS:])
        print(f"task {index}: worker exited {returncode}; started again in place "
              f"({len(history)} of {budget})", flush=True)  # fmt: skip


# Set once the tasks this one ends with (the plan's "ends_with") exited 0, and its worker was
# stopped for it: a ParameterServerStrategy ps or worker after its chief, the evaluator after
# the training. The launcher then tells srun it succeeded.
_ENDED: "list[bool]" = []
END_POLL = 1.0  # seconds between looks at the others' exit records


def _end_with(task, fill, run_dir, child):
    """Watches, in a thread, the exit records of the tasks in task["ends_with"]: once every one
    says 0, stop_requested (by task["ends_by"]) and SIGTERM to the worker."""
    ends_with = [os.path.expanduser(fill(d)) for d in task.get(ENDS_WITH_KEY, [])]
    if not ends_with:
        return
    import threading  # not at the top: most tasks end with nobody

    def succeeded(directory):
        record = rundir.read_exit(directory)
        return isinstance(record, dict) and record.get(rundir.RETURNCODE_KEY) == 0

    def watch():
        while child.poll() is None:
            if all(succeeded(d) for d in ends_with):
                _write(
                    os.path.join(run_dir, rundir.STOP_FILE), rundir.stop_request(task[ENDS_BY_KEY])
                )
                _ENDED.append(True)
                _SIGNALLED.append(signal.SIGTERM)
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
                return
            time.sleep(END_POLL)

    threading.Thread(target=watch, daemon=True).start()


def restartable(returncode, joined, permanent, signalled, stop_requested):
    """Whether a worker that ended so is started again in place. Not after a success or a
    preemption's save (0, 75), a stop (the launcher passed a signal on, `orchestrate down`'s
    stop_requested, or the worker died of SIGTERM or SIGINT, which only a stop sends), one of
    job.permanent_exit_codes, or a worker that loaded TensorFlow and never listened on its port
    (an error no restart heals: it never joined the cluster). Pure."""
    if returncode in (0, contract.EXIT_PREEMPTED) or returncode in permanent:
        return False
    if signalled or stop_requested or returncode in (-signal.SIGTERM, -signal.SIGINT):
        return False
    return joined is not False


def _restart_entry(run_dir, returncode, started, secrets):
    """One restart as restarts.json keeps it: the exit record's fields, the step reached."""
    progress = rundir.read_json(os.path.join(run_dir, rundir.PROGRESS_FILE))
    step = progress.get(contract.STEP) if isinstance(progress, dict) else None
    step = step if isinstance(step, int) and not isinstance(step, bool) else None
    tail = rundir.log_tail(run_dir)[-1:] if returncode > 0 else []
    if secrets:
        tail = [rundir.redact(line.encode(), secrets).decode("utf-8", "replace") for line in tail]
    return {rundir.RETURNCODE_KEY: returncode, rundir.SIGNAL_KEY: rundir.signal_name(returncode),
            rundir.STARTED_AT_KEY: started, rundir.FINISHED_AT_KEY: time.time(),
            rundir.ERROR_KEY: tail[-1] if tail else None,
            rundir.STEP_KEY: step}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

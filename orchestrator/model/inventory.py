"""An inventory as plain data: its hosts, its job, and how its workers are placed.

Frozen dataclasses with no behaviour beyond derived values: config/ makes them from the file,
the run records (records.py) keep them, every other layer reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from orchestrator.contract import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_LOG_EVERY,
    DEFAULT_MAX_TO_KEEP,
    DEFAULT_STEPS_PER_CALL,
    KERAS_DEFAULT,
    KERAS_JAX,
    ROLE_CHIEF,
    ROLE_EVALUATOR,
    ROLE_PS,
    ROLE_WORKER,
)
from orchestrator.model.leases import DEFAULT_LEASE_DIR

DEFAULT_WORKDIR = "~/orchestrate"


class KindSettings:
    """The base of every connection kind's own settings (frozen dataclasses of machines/kinds)."""


@dataclass(frozen=True)
class NoSettings(KindSettings):
    """The settings of a kind that has none."""


@dataclass(frozen=True)
class LoginDetails:
    """How a host's machine is reached, as resolved from its settings and the ssh config, for
    `orchestrate hosts`."""

    user: str | None = None
    port: int | None = None
    key: str | None = None
    jump: str | None = None
    alias: str | None = None  # the ssh config Host the inventory named
    hostname: str | None = None  # where SSH connects


# A host entry without `connection:` is reached over SSH.
DEFAULT_CONNECTION = "ssh"

# A host's task type in TF_CONFIG (`role:`): TensorFlow's names. Under MultiWorkerMirroredStrategy
# every training host is a worker (worker 0 is the chief); ParameterServerStrategy has one chief,
# parameter servers and workers; an evaluator evaluates the chief's checkpoints beside either.
# (contract.py names them: TF_CONFIG is built there.)
ROLES = (ROLE_WORKER, ROLE_CHIEF, ROLE_PS, ROLE_EVALUATOR)


DEFAULT_SYNC_EXCLUDES = (".git",)


@dataclass(frozen=True)
class SyncSpec:
    """`sync:`: a directory of this machine mirrored into every host's job directory."""

    source: str  # an absolute directory on this machine
    exclude: tuple[str, ...] = ()  # rsync --exclude patterns, besides .git
    git: bool = False  # also mirror .git

    @property
    def excludes(self) -> tuple[str, ...]:
        return (*(() if self.git else DEFAULT_SYNC_EXCLUDES), *self.exclude)


# What the supervisor and `down` tell a notify target about; `notify:`'s `events:` picks some.
NOTIFY_EVENTS = ("queued", "started", "restarting", "stalled", "preempted", "succeeded", "failed",
                 "stopped", "lease_lost")  # fmt: skip
DEFAULT_NOTIFY_EVENTS = tuple(e for e in NOTIFY_EVENTS if e not in ("queued", "started"))


@dataclass(frozen=True)
class NotifyTarget:
    """One entry of `notify:`: a webhook (`url`) or a command (`command`) on this machine."""

    url: str | None = None  # POSTed the event as JSON (or Slack's {"text": ...})
    command: tuple[str, ...] = ()  # run with the event's JSON on stdin, in the inventory's dir
    format: Literal["json", "slack"] = "json"
    headers: Mapping[str, str] = field(default_factory=dict)
    # A variable of the controller's environment whose value signs the body (HMAC-SHA256); its
    # name only: the value is read where the event is sent, never written down.
    secret_env: str | None = None
    ca_file: str | None = None  # an absolute path: the CA certificates to check the server with
    events: tuple[str, ...] = DEFAULT_NOTIFY_EVENTS
    timeout: int = 5  # seconds per try


@dataclass(frozen=True)
class Tracking:
    """`job.tracking`: the experiment tracker every worker of every attempt of a run logs into
    (engine/trackers/tracking.py, docs/tracking.md): an MLflow tracking server and experiment, a
    Weights & Biases project, or both. The `*_id` fields are the run's identity there, set when the
    run starts (as a lease sets a host's port), kept in the run record with the inventory: every
    later attempt and every supervisor of the run reads them back and joins the same run; a later
    `up` that resumes the run's checkpoint carries them on (engine/trackers/trackresume.py)."""

    mlflow: str | None = None  # the tracking server's URI (MLFLOW_TRACKING_URI)
    experiment: str | None = None  # MLflow's experiment; None: the job's name
    wandb_project: str | None = None
    wandb_entity: str | None = None
    mlflow_run_id: str | None = None
    mlflow_experiment_id: str | None = None
    wandb_run_id: str | None = None
    # The cluster restarts the earlier runs of a resumed tracking run had
    # (engine/trackers/trackresume): this run's restart tags number on after them instead of
    # overwriting theirs.
    restarts_before: int = 0


@dataclass(frozen=True)
class WorkerSlot:
    """One worker's place, one `hosts:` entry of the inventory: where the worker runs, how to
    reach it, and its TensorFlow gRPC port. Not a machine: one machine may hold several slots."""

    name: str
    address: str
    port: int
    connection: str = DEFAULT_CONNECTION
    python: str = "python3"
    workdir: str = DEFAULT_WORKDIR
    # GPU settings, applied by the built-in loop before the strategy is created.
    gpu_memory_growth: bool = False
    gpu_memory_limit_mb: int | None = None
    visible_gpus: tuple[int, ...] | None = None
    logical_gpus: int | None = None
    # Leases on the host against every other job (hostside/leases.py): `port: auto`
    # (port_range set, port 0 until leased) and `gpus: N`; a leasing host leases its port too.
    port_range: tuple[int, int] | None = None
    gpus: int | None = None  # GPUs leased from visible_gpus (or nvidia-smi -L)
    share_gpus: bool = False  # a GPU may be shared with jobs that say so too
    lease_dir: str = DEFAULT_LEASE_DIR
    leased_gpus: tuple[int, ...] | None = None  # what the run's lease gave (CUDA_VISIBLE_DEVICES)
    # The connection kind's own settings (orchestrator/machines/kinds/): SSH user, port, key,
    # ... None: that kind's defaults (a host made by hand rather than read from an inventory).
    settings: KindSettings | None = None
    role: str = ROLE_WORKER  # its task type in TF_CONFIG (ROLES)

    @property
    def leases(self) -> bool:
        """Whether this worker takes leases on its host (`port: auto` or `gpus: N`)."""
        return self.port_range is not None or self.gpus is not None

    @property
    def endpoint(self) -> str:
        address = f"[{self.address}]" if ":" in self.address else self.address
        return f"{address}:{self.port}"


# A worker's start-up limit where the inventory sets no start_timeout (nor a longer
# stall_timeout): a TensorFlow import on a loaded host can take a minute, a cluster's forming
# waits for its slowest worker.
DEFAULT_START_TIMEOUT = 300


@dataclass(frozen=True)
class Job:
    """What every worker runs: the built-in loop with a user task, or a plain script."""

    name: str
    task: str | None = None
    script: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # Names only: the values come from the controller's environment at `up` (secretenv.py).
    secret_env: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # absolute paths on this machine, uploaded to each remote host
    steps: int | None = None
    checkpoint_dir: str = "checkpoints"
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY  # (the worker's own defaults: contract.py)
    max_to_keep: int = DEFAULT_MAX_TO_KEEP
    batch_size: int = DEFAULT_BATCH_SIZE
    log_every: int = DEFAULT_LOG_EVERY
    # Supervision: a worker whose step has not moved (or whose host has not answered) for
    # stall_timeout seconds has failed; the cluster is restarted up to max_restarts times.
    stall_timeout: int = 300
    # Start-up (importing, the cluster forming, the first step's tracing) has a limit of its
    # own: the stall clock runs only from a worker's first step. None: the larger of
    # DEFAULT_START_TIMEOUT and stall_timeout (start_limit).
    start_timeout: int | None = None
    max_restarts: int = 3
    # Under job.strategy: parameter-server, how often each worker task is started again by
    # itself, at its address, while the chief and the ps keep running (a lost ps or chief
    # restarts the cluster, as above). 6: Kubernetes' Job backoffLimit default (TFJob's own
    # replica default is restartPolicy Never, and its backoffLimit unset means no limit).
    max_worker_restarts: int = 6
    restart_backoff: int = 5  # seconds before the first restart, doubling after each
    # How long a restart waits (without spending a restart) while hosts cannot reach each
    # other's TensorFlow port, before the run fails naming the blocked pairs.
    partition_timeout: int = 600
    # A standby per worker slot (TensorFlow imported, waiting) takes the slot's next attempt,
    # so a restart skips the import (agent.py, worker/standby.py). Unset: on for the built-in
    # loop (job.task), off for a script, which may set TensorFlow's variables itself before its
    # import (TF_USE_LEGACY_KERAS, TF_CPP_MIN_LOG_LEVEL) or not import TensorFlow at all.
    warm_restarts: bool | None = None
    # Seconds a run's standbys stay after it ended (succeeded, failed or stopped), for the next
    # `up` of the job to take (hosts only). None: ORCHESTRATE_LINGER's value, else 300.
    linger: int | None = None
    # Each worker's log is rotated past this size (one older file kept): a long run cannot
    # fill a disk with it.
    log_max_mb: int = 64
    permanent_exit_codes: tuple[int, ...] = (2,)  # 2: the worker's usage errors never heal
    strategy: Literal["multi-worker", "mirrored", "parameter-server"] = "multi-worker"
    profile_steps: tuple[int, int] | None = None  # chief traces steps [start, end] for TensorBoard
    eval_every: int | None = None  # steps between evaluations (a task with an eval_dataset)
    export: Literal["keras", "saved_model"] | None = None  # the model, at the end of a good run
    # "legacy": tf.keras is Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1) on every worker.
    keras: str = KERAS_DEFAULT
    # Steps per tf.function call in the built-in loop; the intervals above must be multiples.
    steps_per_call: int = DEFAULT_STEPS_PER_CALL
    seed: int | None = None  # seeds the initial weights: runs with the same seed train alike
    # The built-in loop's checkpoint writes in the background (the last save and a
    # preemption's block): less time blocked in saves (goodput; bench/bench_goodput.py).
    async_checkpoints: bool = True
    # `up` waits its turn for held leases instead of failing (engine/start/queue.py)
    queue: bool = False
    tracking: Tracking | None = None  # one MLflow / W&B run per run (engine/trackers/tracking.py)

    @property
    def start_limit(self) -> int:
        """Seconds a worker may take from its start to its first step: start_timeout, else
        the larger of DEFAULT_START_TIMEOUT and stall_timeout."""
        if self.start_timeout is not None:
            return self.start_timeout
        return max(DEFAULT_START_TIMEOUT, self.stall_timeout)

    @property
    def warm(self) -> bool:
        """Whether restarts use standbys: warm_restarts, or unset, whether this is a task that
        runs on TensorFlow (a standby imports it; a keras: jax host has none)."""
        if self.warm_restarts is None:
            return self.task is not None and self.keras != KERAS_JAX
        return self.warm_restarts


class SourceSettings(Protocol):
    """The settings of what places the workers when the inventory does not list where they run
    (a scheduler's: model/slurm.SlurmSpec for `slurm:`); a frozen dataclass, kept in the run
    record."""

    @property
    def gpus_per_worker(self) -> int | None:
        """The GPUs the scheduler gives each worker; None when none are asked for."""
        ...


@dataclass(frozen=True)
class Inventory:
    path: str
    base_dir: str
    hosts: tuple[WorkerSlot, ...]
    job: Job
    # Hosts that replace a host found dead when the cluster is restarted (in order).
    spares: tuple[WorkerSlot, ...] = ()
    # With no spare left, a restart may go on without dead hosts down to this many workers
    # (TF_CONFIG rebuilt for the survivors). None: every host is needed.
    min_hosts: int | None = None
    setup: tuple[str, ...] = ()  # shell commands run once per host before a start (hostsetup)
    sync: SyncSpec | None = None  # a directory mirrored to every host before each start
    # The top-level block that listed the workers, a host source named by the backends'
    # registry (which picks the backend by it); None: made in code, the registry's first one.
    host_source: str | None = None
    # Its settings when the source places the workers itself (a scheduler; then `hosts` are
    # its tasks); None: the workers run on `hosts` as listed.
    source_settings: SourceSettings | None = None
    # `preflight: {perf: true}`: `up`'s check runs the performance round too.
    perf_check: bool = False
    notify: tuple[NotifyTarget, ...] = ()  # told of the run's events (engine/observe/notify.py)

    @property
    def gpus_per_worker(self) -> int | None:
        """The GPUs one worker asks for: its source's settings' (Slurm's gpus_per_node), else the
        most visible_gpus of a host; None when no GPU is named."""
        if self.source_settings is not None:
            return self.source_settings.gpus_per_worker
        counts = [len(h.visible_gpus) for h in self.hosts if h.visible_gpus]
        return max(counts) if counts else None

    @property
    def controller_only_env(self) -> tuple[str, ...]:
        """Variables of the controller's environment that no worker may inherit: the notify
        targets' signing secrets (a local worker otherwise starts with the whole of it)."""
        return tuple(sorted({t.secret_env for t in self.notify if t.secret_env}))

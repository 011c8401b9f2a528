"""The record of a run, as the state directory keeps it (engine/store/runstore.py writes and reads
the files): the inventory as it was at `up`, the current attempt's workers, every restart.

Decoding lives here with the types; what it cannot know, which settings type a connection kind
has and how a host source's own settings read back, is passed in (`SettingsReader`,
`SourceSettingsReader`, from the backends' registry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.model.inventory import (
    DEFAULT_CONNECTION,
    Inventory,
    Job,
    NotifyTarget,
    SourceSettings,
    SyncSpec,
    Tracking,
    WorkerSlot,
)
from orchestrator.model.vocabulary import AttemptEnd, FailureKind, known

# (connection kind, its settings as JSON) -> the kind's settings object
SettingsReader = Callable[[str, Mapping[str, Any]], Any]
# (a recorded inventory as JSON, the settings reader) -> its host source and that source's settings
SourceSettingsReader = Callable[[Mapping[str, Any], SettingsReader], tuple[str | None, Any]]


@dataclass(frozen=True)
class WorkerRecord:
    name: str
    index: int
    host: WorkerSlot
    run_dir: str
    log_path: str
    checkpoint_dir: str
    pid: int | None = None  # the worker's supervisor on its host, once started there
    job_id: str | None = None  # the scheduler's job the worker is a task of (Slurm)


@dataclass(frozen=True)
class Restart:
    """Why the cluster was restarted: the first worker that failed, how, and at which step."""

    at: float
    attempt: int  # the attempt that failed
    worker: str
    reason: str
    step: int | None
    # How the worker failed; a word this version does not know (a record of another
    # orchestrate) stays as written.
    kind: FailureKind | str = FailureKind.CRASHED

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", known(FailureKind, self.kind))

    @property
    def signature(self) -> tuple[str, str, int | None]:
        return (self.worker, self.kind, self.step)

    def describe(self) -> str:
        step = f" at step {self.step}" if self.step is not None else ""
        return f"{self.worker}{step}: {self.reason}"


def restarted_alone(worker: str, number: int, budget: int) -> str:
    """How a worker's restart by itself reads everywhere (supervisor, status, dashboard,
    events): its number among the worker's job.max_worker_restarts."""
    return f"worker {worker} restarted ({number} of {budget}), the chief continued"


def alone_lines(alone: tuple[Restart, ...], budget: int) -> tuple[str, ...]:
    """One line per worker that was restarted by itself, for its latest restart, in the
    order of their first."""
    counts = alone_counts(alone)
    return tuple(restarted_alone(worker, number, budget) for worker, number in counts.items())


def alone_counts(alone: tuple[Restart, ...]) -> dict[str, int]:
    """How often each worker was restarted by itself, in the order of their first."""
    counts: dict[str, int] = {}
    for restart in alone:
        counts[restart.worker] = counts.get(restart.worker, 0) + 1
    return counts


@dataclass(frozen=True)
class WorkerSpan:
    """One worker in one attempt, as a run's goodput (engine/observe/goodput.py) needs it: from its
    progress file and exit record, kept in the run record once the attempt ended (its run
    directory is on its host; the next attempt has another). Times are the host's clock."""

    name: str
    role: str = "worker"
    started_at: float | None = None  # its process started (a standby's: before the launch)
    start_step: int | None = None  # the step it began at (a resume: the checkpoint's)
    first_step_at: float | None = None  # its first step past start_step was done
    step: int | None = None  # the last step it reported
    reported_at: float | None = None  # when it last wrote its progress
    checkpoint_step: int | None = None
    checkpoint_at: float | None = None  # when it reported checkpoint_step
    checkpoint_seconds: float | None = None  # the loop blocked in saves (None: not reported)
    eval_seconds: float | None = None
    finished_at: float | None = None  # its exit was recorded
    failed: bool = False  # its exit was a failure (not a success, a stop or a preemption)


@dataclass(frozen=True)
class Attempt:
    """When an attempt was launched and, once it ended, its workers' spans and the end (the
    controller's clock: the failure's detection, or when the run was seen ended)."""

    number: int
    launched_at: float
    workers: tuple[WorkerSpan, ...] = ()
    ended_at: float | None = None
    # How it ended, once it did; None while it runs. A word this version does not know (a
    # record of another orchestrate) stays as written.
    end: AttemptEnd | str | None = None

    def __post_init__(self) -> None:
        if self.end is not None:
            object.__setattr__(self, "end", known(AttemptEnd, self.end))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        spans = tuple(WorkerSpan(**w) for w in data.get("workers", ()))
        return cls(int(data["number"]), float(data["launched_at"]), spans,
                   data.get("ended_at"), data.get("end"))  # fmt: skip


@dataclass(frozen=True)
class SchedulerState:
    """A scheduler's view of a run's current attempt, for status (Slurm: its batch job)."""

    scheduler: str
    state: str  # the scheduler's word (RUNNING, PENDING, ...); UNKNOWN when it cannot be asked
    jobs: tuple[str, ...] = ()  # every attempt's job id, in order
    login: str | None = None  # the machine the scheduler is asked through, when not this one
    job_id: str | None = None  # the current attempt's job, once the scheduler knows it
    reason: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    nodes: str | None = None

    def to_json(self) -> dict[str, Any]:
        where = {"scheduler": self.scheduler, "jobs": list(self.jobs),
                 **({"login": self.login} if self.login else {})}  # fmt: skip
        if self.job_id is None:  # not submitted yet, or the scheduler could not be asked
            reason = {"reason": self.reason} if self.reason else {}
            return {**where, "state": self.state, **reason}
        return {**where, "job_id": self.job_id, "state": self.state, "reason": self.reason,
                "exit_code": self.exit_code, "signal": self.signal,
                "nodes": self.nodes}  # fmt: skip


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    inventory: Inventory
    created_at: float
    attempt: int = 0
    workers: tuple[WorkerRecord, ...] = field(default_factory=tuple)
    restarts: tuple[Restart, ...] = ()
    outcome: str | None = None  # why supervision gave up, when it did
    # False from before the first worker of the attempt is started until the last one is: a
    # record left False by a dead launcher is a half-launched attempt, stopped and started afresh.
    launched: bool = True
    # Hosts left out of the cluster because they did not answer (min_hosts); tried again at
    # each restart and put back when they answer.
    dropped: tuple[WorkerSlot, ...] = ()
    # Whether `down` asked the run to stop (its stop flag exists); read from the state directory
    # by RunStore.load, never written into the record.
    stop_requested: bool = field(default=False, compare=False)
    # A scheduler's job id for each attempt, in order (Slurm: one batch job per attempt).
    scheduler_jobs: tuple[str, ...] = ()
    # Workers started again by themselves while the rest of the attempt went on (under
    # ParameterServerStrategy): why each was, in order; they spend job.max_worker_restarts,
    # never max_restarts.
    alone: tuple[Restart, ...] = ()
    # Goodput's records (engine/observe/goodput.py): each attempt's launch and, once it ended, its
    # workers' spans; and how long `up --queue` waited for the leases before the run began.
    attempts: tuple[Attempt, ...] = ()
    queue_seconds: float = 0.0
    # What the run's workers use that no keeper of the run holds any more and that could not be
    # leased again (engine/supervision/leasewatch.py): said by `status` while it lasts; None when
    # leased.
    leases_lost: str | None = None

    @property
    def job_name(self) -> str:
        return self.inventory.job.name

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("stop_requested")
        return data

    @classmethod
    def from_json(
        cls, data: dict[str, Any], settings: SettingsReader, sources: SourceSettingsReader
    ) -> RunRecord:
        """`settings` turns a host's settings as JSON back into its connection kind's type,
        `sources` the inventory's host source and that source's settings into theirs."""

        def host(fields: dict[str, Any]) -> WorkerSlot:
            return _host(fields, settings)

        source, source_settings = sources(data["inventory"], settings)
        scheduled = source_settings is not None
        workers = tuple(
            WorkerRecord(**{**_job_id_of_old(worker, scheduled), "host": host(worker["host"])})
            for worker in data["workers"]
        )
        return cls(
            **{
                **data,
                "inventory": _inventory(data["inventory"], host, source, source_settings),
                "workers": workers,
                "restarts": tuple(Restart(**r) for r in data.get("restarts", ())),
                "dropped": tuple(host(h) for h in data.get("dropped", ())),
                "scheduler_jobs": tuple(data.get("scheduler_jobs", ())),
                "alone": tuple(Restart(**r) for r in data.get("alone", ())),
                "attempts": tuple(Attempt.from_json(a) for a in data.get("attempts", ())),
            }
        )


def _job_id_of_old(worker: dict[str, Any], scheduled: bool) -> dict[str, Any]:
    """Records written before `job_id` existed kept a scheduler's job id in `pid`."""
    if scheduled and "job_id" not in worker and worker.get("pid") is not None:
        return {**worker, "pid": None, "job_id": str(worker["pid"])}
    return worker


def _host(data: dict[str, Any], settings: SettingsReader) -> WorkerSlot:
    # JSON turns tuples into lists; the frozen dataclasses want them back (and hashable).
    fields: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "settings"
    }
    connection = fields.get("connection", DEFAULT_CONNECTION)
    raw = data.get("settings")  # None: a host made without settings, the kind's defaults
    return WorkerSlot(**fields, settings=None if raw is None else settings(connection, raw))


def _inventory(
    data: dict[str, Any],
    host: Callable[[dict[str, Any]], WorkerSlot],
    source: str | None,
    source_settings: SourceSettings | None,
) -> Inventory:
    # JSON turns tuples into lists; the frozen dataclasses want them back.
    job: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in data["job"].items()
    }
    if job.get("tracking") is not None:  # the run's identity in its tracker, with the settings
        job["tracking"] = Tracking(**job["tracking"])
    return Inventory(
        path=data["path"],
        base_dir=data["base_dir"],
        hosts=tuple(host(h) for h in data["hosts"]),
        job=Job(**job),
        spares=tuple(host(h) for h in data.get("spares", ())),
        min_hosts=data.get("min_hosts"),
        setup=tuple(data.get("setup", ())),
        sync=_sync(data.get("sync")),
        host_source=source,
        source_settings=source_settings,
        notify=tuple(_notify(t) for t in data.get("notify", ())),
    )


def _sync(data: dict[str, Any] | None) -> SyncSpec | None:
    if data is None:
        return None
    return SyncSpec(data["source"], tuple(data.get("exclude", ())), bool(data.get("git")))


def _notify(data: dict[str, Any]) -> NotifyTarget:
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return NotifyTarget(**fields)

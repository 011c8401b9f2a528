"""Typed answers of the host-side programs (agent.py, hostprobe.py), parsed once at the seam.
The keys both ends read are hostside/protocol.py's.

The programs speak JSON; everything above the backend reads these frozen dataclasses, so a
misspelt field is a type error instead of a silent None. Parsing is lenient about extra fields
(a newer agent may say more) and strict about types: a wrong type reads as absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract import (
    ACCURACY,
    CHECKPOINT_STEP,
    DEVICES,
    LOSS,
    START_STEP,
    STEP,
    STEPS_PER_SEC,
    TARGET_STEPS,
    VAL_ACCURACY,
    VAL_LOSS,
)
from orchestrator.errors import HostError
from orchestrator.hostside import protocol, rundir
from orchestrator.model.reading import integer, mapping, number, rate, steps, text, texts


@dataclass(frozen=True)
class HostInfo:
    home: str
    hostname: str
    python: str

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> HostInfo:
        return cls(
            str(data[protocol.HOME_KEY]),
            str(data.get(protocol.HOSTNAME_KEY, "")),
            str(data.get(protocol.PYTHON_KEY, "")),
        )


@dataclass(frozen=True)
class Progress:
    """What a worker reported in progress.json (the built-in loop, or a script's report())."""

    step: int | None = None
    start_step: int | None = None  # where this attempt began (the built-in loop writes it)
    target_steps: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    checkpoint_step: int | None = None
    steps_per_sec: float | None = None
    val_loss: float | None = None  # the latest evaluation (the built-in loop, with eval data)
    val_accuracy: float | None = None
    devices: tuple[str, ...] = ()
    fields: Mapping[str, Any] = field(default_factory=dict)  # everything, for the JSON views

    @classmethod
    def parse(cls, data: Any) -> Progress | None:
        if not isinstance(data, dict):
            return None
        return cls(
            step=steps(data.get(STEP)),
            start_step=steps(data.get(START_STEP)),
            target_steps=steps(data.get(TARGET_STEPS)),
            loss=number(data.get(LOSS)),
            accuracy=number(data.get(ACCURACY)),
            checkpoint_step=steps(data.get(CHECKPOINT_STEP)),
            steps_per_sec=rate(data.get(STEPS_PER_SEC)),
            val_loss=number(data.get(VAL_LOSS)),
            val_accuracy=number(data.get(VAL_ACCURACY)),
            devices=texts(data.get(DEVICES)),
            fields=dict(data),
        )


@dataclass(frozen=True)
class ExitRecord:
    """How a worker process ended, written by its supervisor on the host."""

    returncode: int
    signal: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None  # usually the last line of the log
    log_tail: tuple[str, ...] = ()
    # Whether the worker listened on its TensorFlow port (joined the cluster) before it ended:
    # recorded for a worker of a multi-worker cluster that loaded TensorFlow, where /proc tells;
    # None otherwise (one worker, no TensorFlow loaded, no /proc, an older agent).
    joined: bool | None = None

    @classmethod
    def parse(cls, data: Any) -> ExitRecord | None:
        if not isinstance(data, dict) or integer(data.get(rundir.RETURNCODE_KEY)) is None:
            return None
        return cls(
            returncode=int(data[rundir.RETURNCODE_KEY]),
            signal=text(data.get(rundir.SIGNAL_KEY)),
            started_at=number(data.get(rundir.STARTED_AT_KEY)),
            finished_at=number(data.get(rundir.FINISHED_AT_KEY)),
            error=text(data.get(rundir.ERROR_KEY)),
            log_tail=texts(data.get(rundir.LOG_TAIL_KEY)),
            joined=_joined(data.get(rundir.JOINED_KEY)),
        )


def _joined(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class InPlaceRestart:
    """An earlier exit of a worker that its launcher started again in place, at the same
    address (the Slurm launcher's restarts.json), and the step it had reached."""

    exit: ExitRecord
    step: int | None = None

    @classmethod
    def parse_all(cls, data: Any) -> tuple[InPlaceRestart, ...]:
        """The entries that read as exit records (anything else: none)."""
        if not isinstance(data, list):
            return ()
        found = []
        for item in data:
            record = ExitRecord.parse(item)
            if record is not None and record.finished_at is not None:
                found.append(cls(record, steps(item.get(rundir.STEP_KEY))))
        return tuple(found)


@dataclass(frozen=True)
class Usage:
    cpu_percent: float | None
    rss_bytes: int | None
    create_time: float | None

    @classmethod
    def parse(cls, data: Any) -> Usage | None:
        if not isinstance(data, dict):
            return None
        return cls(
            number(data.get(protocol.CPU_PERCENT_KEY)),
            integer(data.get(protocol.RSS_BYTES_KEY)),
            number(data.get(protocol.CREATE_TIME_KEY)),
        )


@dataclass(frozen=True)
class WorkerProbe:
    """One run directory as its host sees it now."""

    now: float  # the host's clock
    exists: bool = False
    pid: int | None = None  # the supervisor's (the process group)
    alive: bool = False
    worker_pid: int | None = None
    progress: Progress | None = None
    exit: ExitRecord | None = None
    stop_requested: bool = False
    # Who asked, as "stopped ..." reads on: "by orchestrate down", "after beta ended the attempt".
    stopped_by: str | None = None
    usage: Usage | None = None
    node: str | None = None  # where a scheduler placed the worker, when one did
    # Why a scheduler still holds the worker in its queue (Slurm's Reason); None once it runs.
    queued: str | None = None
    restarts: tuple[InPlaceRestart, ...] = ()  # started again in place by its launcher

    @classmethod
    def parse(cls, data: Mapping[str, Any], now: float) -> WorkerProbe:
        return cls(
            now=now,
            exists=bool(data.get(protocol.EXISTS_KEY)),
            pid=integer(data.get(protocol.PID_KEY)),
            alive=bool(data.get(protocol.ALIVE_KEY)),
            worker_pid=integer(data.get(protocol.WORKER_PID_KEY)),
            progress=Progress.parse(data.get(protocol.PROGRESS_KEY)),
            exit=ExitRecord.parse(data.get(protocol.EXIT_KEY)),
            stop_requested=bool(data.get(protocol.STOP_REQUESTED_KEY)),
            stopped_by=text(data.get(protocol.STOPPED_BY_KEY)),
            usage=Usage.parse(data.get(protocol.USAGE_KEY)),
            restarts=InPlaceRestart.parse_all(data.get(protocol.RESTARTS_KEY)),
        )


def parse_probe(data: Mapping[str, Any]) -> dict[str, WorkerProbe]:
    """The agent's probe answer: one WorkerProbe per run directory asked about."""
    now = number(data.get(protocol.NOW_KEY)) or 0.0
    runs = data[protocol.RUNS_KEY]
    return {run_dir: WorkerProbe.parse(probe, now) for run_dir, probe in runs.items()}


@dataclass(frozen=True)
class StandbyInfo:
    """A standby alive on a host (the agent's `standbys` listing): lingering after its run
    ended, for the next run of the job, or waiting for a restart of its own run."""

    name: str  # the worker slot
    pid: int | None  # its supervisor (the process group)
    worker_pid: int | None  # the Python that imported TensorFlow
    run_id: str  # the run it backs (lingering: the run that left it)
    lingering: bool
    left_s: float | None  # lingering: seconds before it exits by itself
    ready: bool  # TensorFlow imported
    rss_bytes: int | None  # the supervisor's and the Python's resident memory

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> StandbyInfo:
        return cls(
            name=text(data.get(protocol.NAME_KEY)) or "?",
            pid=integer(data.get(protocol.PID_KEY)),
            worker_pid=integer(data.get(protocol.WORKER_PID_KEY)),
            run_id=text(data.get(protocol.RUN_ID_KEY)) or "?",
            lingering=bool(data.get(protocol.LINGERING_KEY)),
            left_s=number(data.get(protocol.LEFT_S_KEY)),
            ready=bool(data.get(protocol.READY_KEY)),
            rss_bytes=integer(data.get(protocol.RSS_BYTES_KEY)),
        )

    def to_json(self) -> dict[str, Any]:
        return {protocol.NAME_KEY: self.name, protocol.PID_KEY: self.pid,
                protocol.WORKER_PID_KEY: self.worker_pid, protocol.RUN_ID_KEY: self.run_id,
                protocol.LINGERING_KEY: self.lingering, protocol.LEFT_S_KEY: self.left_s,
                protocol.READY_KEY: self.ready, protocol.RSS_BYTES_KEY: self.rss_bytes}  # fmt: skip


def parse_standbys(data: Mapping[str, Any]) -> dict[str, list[StandbyInfo]]:
    """The agent's `standbys` answer: per job directory asked about, the standbys alive."""
    listing = mapping(data.get(protocol.STANDBYS_KEY))
    return {
        str(job): [StandbyInfo.parse(e) for e in entries if isinstance(e, dict)]
        for job, entries in listing.items()
        if isinstance(entries, list)
    }


@dataclass(frozen=True)
class StopAnswer:
    outcome: str  # stopped | killed | not running
    left: tuple[int, ...] = ()  # pids still alive after SIGKILL


def parse_stop(data: Mapping[str, Any]) -> dict[str, StopAnswer]:
    left = mapping(data.get(protocol.LEFT_KEY))
    return {
        run_dir: StopAnswer(str(outcome), tuple(int(p) for p in left.get(run_dir, ())))
        for run_dir, outcome in data[protocol.OUTCOME_KEY].items()
    }


# Who stopped a worker, when a stop request does not say (older agents, `orchestrate down`).
BY_DOWN = "by orchestrate down"


@dataclass(frozen=True)
class StackAnswer:
    """One worker's answer to a stack request: every thread's Python stack as faulthandler
    wrote it, or why there is none (`error`: it could not answer); `native`: py-spy's dump,
    or why there is none, when native frames were asked for."""

    stacks: str | None = None
    error: str | None = None
    native: str | None = None


def parse_stacks(data: Mapping[str, Any]) -> dict[str, StackAnswer]:
    answers = {}
    for run_dir, value in mapping(data.get(protocol.STACKS_KEY)).items():
        entry = mapping(value)
        stacks, error = text(entry.get(protocol.STACKS_KEY)), text(entry.get(protocol.ERROR_KEY))
        if stacks is None:
            error = error or "it did not answer"
        answers[run_dir] = StackAnswer(stacks, None if stacks is not None else error,
                                       text(entry.get(protocol.NATIVE_KEY)))  # fmt: skip
    return answers


@dataclass(frozen=True)
class CheckpointListing:
    """The latest TensorFlow checkpoint of a directory: its name and files with sizes."""

    directory: str
    latest: str | None
    files: Mapping[str, int]  # the files of every checkpoint listed
    checkpoints: tuple[str, ...] = ()  # the state file's checkpoints, oldest first, latest last

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> CheckpointListing:
        files = {str(k): int(v) for k, v in mapping(data.get(protocol.FILES_KEY)).items()}
        latest = text(data.get(protocol.LATEST_KEY))
        listed = texts(data.get(protocol.CHECKPOINTS_KEY)) or ((latest,) if latest else ())
        return cls(str(data[protocol.DIRECTORY_KEY]), latest, files, listed)

    @property
    def size_bytes(self) -> int:
        return sum(self.files.values())


@dataclass(frozen=True)
class SetAside:
    """What `set-aside` did with a host's directory: where its `count` files went (None: it
    held none, and stays as it was)."""

    directory: str
    moved_to: str | None
    count: int = 0

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> SetAside:
        count = integer(data.get(protocol.COUNT_KEY))
        return cls(str(data[protocol.DIRECTORY_KEY]), text(data.get(protocol.MOVED_TO_KEY)),
                   count if count is not None and count >= 0 else 0)  # fmt: skip


@dataclass(frozen=True)
class FileListing:
    root: str
    files: Mapping[str, tuple[int, float]]  # relative path -> (size, mtime)

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> FileListing:
        listed = mapping(data.get(protocol.FILES_KEY))
        files = {str(k): (int(v[0]), float(v[1])) for k, v in listed.items()}
        return cls(str(data[protocol.ROOT_KEY]), files)


@dataclass(frozen=True)
class PortHolder:
    pid: int
    command: str
    run_id: str | None = None  # a leftover orchestrate worker's run
    worker: str | None = None


@dataclass(frozen=True)
class DirectoryReport:
    path: str
    writable: bool
    checked: str  # the nearest existing parent that was checked
    free_bytes: int


@dataclass(frozen=True)
class Inspection:
    """hostprobe's `inspect`: software, environment, directories and the TensorFlow port."""

    python: str
    packages: Mapping[str, str | None]
    env: Mapping[str, str]
    directories: tuple[DirectoryReport, ...]
    listener_pid: int | None
    port_error: str | None
    holder: PortHolder | None
    boot_id: str | None = None  # one per booted machine: hosts that share it share its CPUs
    hostname: str | None = None
    # What the host's name resolves to there (None: an older probe did not say).
    name_addresses: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Inspection:
        holder = data.get(protocol.HOLDER_KEY)
        addresses = data.get(protocol.NAME_ADDRESSES_KEY)
        directories = tuple(
            DirectoryReport(str(d[protocol.PATH_KEY]), bool(d[protocol.WRITABLE_KEY]),
                            str(d[protocol.CHECKED_KEY]), int(d[protocol.FREE_BYTES_KEY]))
            for d in data.get(protocol.DIRECTORIES_KEY, ())
        )  # fmt: skip
        return cls(
            python=str(data.get(protocol.PYTHON_KEY, "")),
            packages={str(k): text(v) for k, v in mapping(data.get(protocol.PACKAGES_KEY)).items()},
            env={str(k): str(v) for k, v in mapping(data.get(protocol.ENV_KEY)).items()},
            directories=directories,
            listener_pid=integer(data.get(protocol.LISTENER_PID_KEY)),
            port_error=text(data.get(protocol.PORT_ERROR_KEY)),
            holder=_holder(holder) if isinstance(holder, dict) else None,
            boot_id=text(data.get(protocol.BOOT_ID_KEY)),
            hostname=text(data.get(protocol.HOSTNAME_KEY)),
            name_addresses=texts(addresses) if isinstance(addresses, list) else None,
        )


def _holder(data: Mapping[str, Any]) -> PortHolder:
    return PortHolder(
        int(data[protocol.PID_KEY]),
        str(data.get(protocol.COMMAND_KEY, "?")),
        text(data.get("orchestrate_run_id")),
        text(data.get("orchestrate_worker")),
    )


@dataclass(frozen=True)
class PeerProbe:
    status: str  # ok | timeout | refused | unreachable | error
    detail: str | None = None


@dataclass(frozen=True)
class Connections:
    """hostprobe's `connect`: how this host's connection to each peer's port ended."""

    peers: Mapping[str, PeerProbe]
    token_visible: bool | None

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Connections:
        peers = {
            str(name): PeerProbe(str(p[protocol.STATUS_KEY]), text(p.get(protocol.DETAIL_KEY)))
            for name, p in mapping(data.get(protocol.PEERS_KEY)).items()
        }
        visible = data.get(protocol.TOKEN_VISIBLE_KEY)
        return cls(peers, visible if isinstance(visible, bool) else None)


@dataclass(frozen=True)
class ComputeProbe:
    """hostprobe's `compute`: the best GFLOP/s of a fixed matmul, or why it was not measured."""

    probe: str | None  # "numpy", "tensorflow", None: not measured
    device: str  # "cpu" or "gpu": figures are compared among hosts of one device only
    gflops: float | None
    detail: str | None = None
    cpu_limit: float | None = None  # the CPUs the host's cgroups allow the probe, if limited

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ComputeProbe:
        gflops = number(data.get(protocol.GFLOPS_KEY))
        return cls(text(data.get(protocol.PROBE_KIND_KEY)), text(data.get("device")) or "cpu",
                   gflops if gflops and gflops > 0 else None, text(data.get(protocol.DETAIL_KEY)),
                   number(data.get("cpu_limit")))  # fmt: skip


@dataclass(frozen=True)
class Transfer:
    """hostprobe's `send`: what the peer's sink received and its rate (bytes per second)."""

    ok: bool
    rate: float | None
    sent: int
    seconds: float | None
    detail: str | None = None

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Transfer:
        rate = number(data.get(protocol.RATE_KEY))
        ok = data.get(protocol.STATUS_KEY) == "ok" and rate is not None and rate > 0
        return cls(ok, rate if ok else None, integer(data.get(protocol.SENT_KEY)) or 0,
                   number(data.get(protocol.SECONDS_KEY)),
                   text(data.get(protocol.DETAIL_KEY)))  # fmt: skip


def parsed(host: str, parse: Any, data: Mapping[str, Any]) -> Any:
    """Parse an answer; a malformed one is the host's error, not a traceback."""
    try:
        return parse(data)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise HostError(host, f"the host program's answer has the wrong shape: {exc!r}") from exc

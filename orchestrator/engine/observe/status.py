"""Ask the backend about a run's workers (one round trip per machine) and classify them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from orchestrator.backends.capabilities import Lifecycle, Scheduler
from orchestrator.contract import (
    CHECKPOINT_AT,
    CHECKPOINT_SECONDS,
    EVAL_SECONDS,
    FIRST_STEP_AT,
    STEP_CALL_SECONDS,
    STEP_SECONDS,
    WRITTEN_AT,
)
from orchestrator.engine.observe.eta import run_eta, worker_eta
from orchestrator.engine.observe.failures import classify_exit, explain
from orchestrator.engine.observe.pace import pace_outlier
from orchestrator.engine.observe.rolepolicy import run_state, serving
from orchestrator.engine.observe.state import Expectation, classify
from orchestrator.model.answers import WorkerProbe
from orchestrator.model.inventory import ROLE_EVALUATOR, ROLE_WORKER
from orchestrator.model.reading import (
    integer,
    number,
    number_as_written,
    rate,
    steps,
    text,
    texts,
)
from orchestrator.model.records import (
    Restart,
    RunRecord,
    SchedulerState,
    WorkerRecord,
    alone_lines,
)
from orchestrator.model.vocabulary import FailureKind, WorkerState, known


@dataclass(frozen=True)
class WorkerStatus:
    name: str
    index: int
    host: str
    state: WorkerState
    reason: str | None
    pid: int | None
    step: int | None
    target_steps: int | None
    loss: float | None
    accuracy: float | None
    checkpoint_step: int | None
    steps_per_sec: float | None
    val_loss: float | None  # the latest evaluation of this attempt, over the whole eval split
    val_accuracy: float | None
    uptime: float | None
    cpu_percent: float | None
    rss_bytes: int | None
    exit_code: int | None
    finished_at: float | None
    devices: tuple[str, ...]
    log_tail: tuple[str, ...]
    note: str | None = None  # what the worker wants a person to know (a checkpoint fallback)
    # For a failed worker with an exit record: how it failed and what to do. A kind this
    # orchestrate does not know (a snapshot of another version) stays as written.
    failure_kind: FailureKind | str | None = None
    hint: str | None = None
    # Held in a scheduler's queue (Slurm PENDING): the stall clock starts when it runs.
    queued: bool = False
    start_step: int | None = None  # the step this attempt began at, where the worker says
    # The built-in loop's step timing over its last log window (contract.STEP_CALL_SECONDS).
    step_call_seconds: float | None = None
    step_seconds: float | None = None
    role: str = ROLE_WORKER  # its task type in TF_CONFIG (the host's role:)
    # Its earlier exits this attempt, each followed by a start again in place by its launcher
    # (Slurm: a ParameterServerStrategy worker, the evaluator); the supervisor records them.
    restarted: tuple[Restart, ...] = ()
    # Goodput's inputs (engine/observe/goodput.py): its process's start, its first step past
    # start_step, its last progress write, and the loop's seconds blocked in saves and
    # evaluations (None where the worker does not say).
    started_at: float | None = None
    first_step_at: float | None = None
    reported_at: float | None = None
    checkpoint_at: float | None = None
    checkpoint_seconds: float | None = None
    eval_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.failure_kind is not None:
            object.__setattr__(self, "failure_kind", known(FailureKind, self.failure_kind))

    @property
    def stepped(self) -> bool:
        """Whether it made a step in this attempt: past the step it began at (a script that
        reports no start_step: once it reports any step)."""
        if self.step is None:
            return False
        return self.start_step is None or self.step > self.start_step

    @property
    def eta_seconds(self) -> float | None:
        return worker_eta(self)

    def to_json(self) -> dict[str, Any]:
        # The restarts in place are the run's record's (RunStatus.alone says them).
        data = {k: v for k, v in self.__dict__.items() if k not in ("log_tail", "restarted")}
        data["state"] = self.state.value
        return data

    @classmethod
    def from_json(cls, data: object) -> WorkerStatus | None:
        """to_json read back (a snapshot's worker: log_tail is not in it). A key an older
        orchestrate did not write takes its default, a value of the wrong type reads as absent;
        None without a name, index, host and known state."""
        if not isinstance(data, dict):
            return None
        name, host = text(data.get("name")), text(data.get("host"))
        index, state = integer(data.get("index")), _state(data.get("state"))
        if name is None or index is None or host is None or state is None:
            return None
        return cls(
            name=name,
            index=index,
            host=host,
            state=state,
            reason=text(data.get("reason")),
            pid=integer(data.get("pid")),
            step=steps(data.get("step")),
            target_steps=steps(data.get("target_steps")),
            loss=number_as_written(data.get("loss")),
            accuracy=number_as_written(data.get("accuracy")),
            checkpoint_step=steps(data.get("checkpoint_step")),
            steps_per_sec=rate(data.get("steps_per_sec")),
            val_loss=number_as_written(data.get("val_loss")),
            val_accuracy=number_as_written(data.get("val_accuracy")),
            uptime=number_as_written(data.get("uptime")),
            cpu_percent=number_as_written(data.get("cpu_percent")),
            rss_bytes=integer(data.get("rss_bytes")),
            exit_code=integer(data.get("exit_code")),
            finished_at=number_as_written(data.get("finished_at")),
            devices=texts(data.get("devices")),
            log_tail=(),
            note=text(data.get("note")),
            failure_kind=text(data.get("failure_kind")),
            hint=text(data.get("hint")),
            queued=data.get("queued") is True,
            start_step=steps(data.get("start_step")),
            step_call_seconds=number_as_written(data.get("step_call_seconds")),
            step_seconds=number_as_written(data.get("step_seconds")),
            role=text(data.get("role")) or ROLE_WORKER,
            started_at=number_as_written(data.get("started_at")),
            first_step_at=number_as_written(data.get("first_step_at")),
            reported_at=number_as_written(data.get("reported_at")),
            checkpoint_at=number_as_written(data.get("checkpoint_at")),
            checkpoint_seconds=number_as_written(data.get("checkpoint_seconds")),
            eval_seconds=number_as_written(data.get("eval_seconds")),
        )


@dataclass(frozen=True)
class RunStatus:
    run_id: str
    job: str
    state: WorkerState
    workers: tuple[WorkerStatus, ...]
    attempt: int = 0
    restarts: tuple[Restart, ...] = ()
    outcome: str | None = None
    # the ports and GPUs the run uses that it no longer holds a lease on
    # (engine/supervision/leasewatch.py)
    leases_lost: str | None = None
    scheduler: SchedulerState | None = None  # a scheduler's view of the attempt (Slurm job)
    # "worker w1 restarted (2 of 6), the chief continued": per worker restarted by itself
    alone: tuple[str, ...] = ()
    started_at: float | None = None  # the run's record was made (the elapsed time's start)

    @property
    def pace(self) -> str | None:
        """The running worker the others wait for (engine/observe/pace.py), if one stands out."""
        running = [w for w in self.workers if w.state is WorkerState.RUNNING]
        return pace_outlier({w.name: (w.step_call_seconds, w.step_seconds) for w in running})

    @property
    def eta_seconds(self) -> float | None:
        """The run's ETA: its slowest worker's (eta.py, as the dashboard shows it)."""
        return run_eta(self.workers)

    def to_json(self) -> dict[str, Any]:
        last = self.restarts[-1] if self.restarts else None
        return {
            "run_id": self.run_id,
            "job": self.job,
            "state": self.state.value,
            "eta_seconds": self.eta_seconds,
            "attempt": self.attempt,
            "restarts": len(self.restarts),
            "last_restart": last.__dict__ if last else None,
            "restarted_alone": list(self.alone),
            "outcome": self.outcome,
            "leases_lost": self.leases_lost,
            "scheduler": self.scheduler.to_json() if self.scheduler else None,
            "workers": [w.to_json() for w in self.workers],
            "pace": self.pace,
        }

    @classmethod
    def from_json(cls, data: object) -> RunStatus | None:
        """to_json read back (the supervisor's snapshot), leniently as WorkerStatus.from_json:
        None without a run id, job and known state; a worker that cannot be read is left out.

        to_json keeps how many restarts there were and the last one, not the earlier ones: they
        read back as the last one again, so the count and the last restart (all that a status
        says of them; the run record has every one) come out of to_json as they went in."""
        if not isinstance(data, dict):
            return None
        run_id, job = text(data.get("run_id")), text(data.get("job"))
        state = _state(data.get("state"))
        if run_id is None or job is None or state is None:
            return None
        workers = data.get("workers")
        read = (WorkerStatus.from_json(w) for w in (workers if isinstance(workers, list) else ()))
        return cls(
            run_id=run_id,
            job=job,
            state=state,
            workers=tuple(w for w in read if w is not None),
            attempt=integer(data.get("attempt")) or 0,
            restarts=_restarts(data.get("restarts"), data.get("last_restart")),
            outcome=text(data.get("outcome")),
            leases_lost=text(data.get("leases_lost")),
            scheduler=_scheduler(data.get("scheduler")),
            alone=texts(data.get("restarted_alone")),
        )


def expectation(record: RunRecord, worker: WorkerRecord) -> Expectation:
    """What the run's job asks of `worker` if it exits 0 (state.Expectation): a script job's
    `steps:` is its target (the built-in loop reports its own), more than one worker must
    form one cluster, and an evaluator may be stopped anywhere."""
    job = record.inventory.job
    return Expectation(job.steps if job.script is not None else None, len(record.workers) > 1,
                       evaluator=worker.host.role == ROLE_EVALUATOR)  # fmt: skip


def worker_status(
    worker: WorkerRecord,
    probe: WorkerProbe | None,
    unreachable: str | None = None,
    expect: Expectation | None = None,
) -> WorkerStatus:
    verdict = classify(probe, expect)
    progress = probe.progress if probe else None
    exit_record = probe.exit if probe else None
    usage = probe.usage if probe else None
    alive = bool(probe and probe.alive)
    started = (usage.create_time if usage else None) or (
        exit_record.started_at if exit_record else None
    )
    ended = exit_record.finished_at if exit_record and not alive else None
    uptime = _elapsed(started, ended or (probe.now if probe else 0.0))
    kind: FailureKind | None = None
    hint = None
    if verdict.state is WorkerState.FAILED and exit_record is not None:
        failure = verdict.kind or classify_exit(exit_record.returncode, exit_record.log_tail)
        kind, hint = failure, explain(failure, exit_record.log_tail)
    return WorkerStatus(
        name=worker.name,
        index=worker.index,
        host=(probe.node if probe else None) or worker.host.address,
        state=verdict.state,
        reason=unreachable or verdict.reason,
        pid=(probe.worker_pid if probe else None) or worker.pid,
        step=progress.step if progress else None,
        target_steps=(expect.target_steps if expect else None)
        or (progress.target_steps if progress else None),
        loss=progress.loss if progress else None,
        accuracy=progress.accuracy if progress else None,
        checkpoint_step=progress.checkpoint_step if progress else None,
        steps_per_sec=progress.steps_per_sec if progress else None,
        val_loss=progress.val_loss if progress else None,
        val_accuracy=progress.val_accuracy if progress else None,
        uptime=uptime,
        cpu_percent=usage.cpu_percent if usage and alive else None,
        rss_bytes=usage.rss_bytes if usage and alive else None,
        exit_code=exit_record.returncode if exit_record else None,
        finished_at=exit_record.finished_at if exit_record else None,
        devices=progress.devices if progress else (),
        log_tail=exit_record.log_tail if exit_record else (),
        note=text(progress.fields.get("note")) if progress else None,
        failure_kind=kind,
        hint=hint,
        queued=bool(probe and probe.queued is not None and exit_record is None),
        start_step=progress.start_step if progress else None,
        step_call_seconds=number(progress.fields.get(STEP_CALL_SECONDS)) if progress else None,
        step_seconds=number(progress.fields.get(STEP_SECONDS)) if progress else None,
        role=worker.host.role,
        started_at=started,
        first_step_at=number(progress.fields.get(FIRST_STEP_AT)) if progress else None,
        reported_at=number(progress.fields.get(WRITTEN_AT)) if progress else None,
        checkpoint_at=number(progress.fields.get(CHECKPOINT_AT)) if progress else None,
        checkpoint_seconds=number(progress.fields.get(CHECKPOINT_SECONDS)) if progress else None,
        eval_seconds=number(progress.fields.get(EVAL_SECONDS)) if progress else None,
    )


LONGEST_UPTIME = 100 * 365 * 86400.0  # seconds: a longer (or negative) one is a clock's error


def _elapsed(start: float | None, end: float) -> float | None:
    """Seconds from `start` to `end`, two clock readings of a host: None without a start, or
    where they are not a process's life (each finite, they may still be 1e308 apart)."""
    if not start:
        return None
    seconds = end - start
    return seconds if 0 <= seconds <= LONGEST_UPTIME else None


def in_place_restarts(name: str, probe: WorkerProbe | None, attempt: int) -> tuple[Restart, ...]:
    """The worker's earlier exits in this attempt that its launcher followed with a start again
    in place, each as the Restart the run's record keeps (the same reasons as a failure's)."""
    found = []
    for restart in probe.restarts if probe else ():
        ended = restart.exit
        how = f"killed by {ended.signal}" if ended.signal else f"exit {ended.returncode}"
        kind = classify_exit(ended.returncode, ended.log_tail)
        reason = f"{how}: {ended.error}" if ended.error else how
        found.append(Restart(ended.finished_at or 0.0, attempt, name, reason, restart.step, kind))
    return tuple(found)


def collect_status(
    record: RunRecord, lifecycle: Lifecycle, scheduler: Scheduler | None
) -> RunStatus:
    """The run now: each worker's probe (`lifecycle`), read; and the view of the scheduler that
    places the workers (None: no scheduler does; Backend.scheduler)."""
    probes = lifecycle.probe(record.workers)
    unreachable = {name: error.message for name, error in probes.failed.items()}
    statuses = [
        replace(
            worker_status(
                worker,
                probes.ok.get(worker.name),
                unreachable.get(worker.name),
                expectation(record, worker),
            ),
            restarted=in_place_restarts(worker.name, probes.ok.get(worker.name), record.attempt),
        )
        for worker in record.workers
    ]
    if record.stop_requested:
        # A worker that never started will not start any more: the run was stopped.
        statuses = [
            replace(s, state=WorkerState.STOPPED, reason="never started: the run was stopped")
            if s.state is WorkerState.PENDING
            else s
            for s in statuses
        ]
    statuses.sort(key=lambda s: s.index)
    for i in serving((s.role, s.state) for s in statuses):
        statuses[i] = replace(statuses[i], state=WorkerState.RUNNING)
    return RunStatus(
        run_id=record.run_id,
        job=record.job_name,
        attempt=record.attempt,
        restarts=record.restarts,
        alone=alone_lines(record.alone, record.inventory.job.max_worker_restarts),
        outcome=record.outcome,
        leases_lost=record.leases_lost,
        scheduler=scheduler.scheduler_state(record) if scheduler else None,
        state=run_state((s.role, s.state) for s in statuses),
        workers=tuple(statuses),
        started_at=record.created_at,
    )


# Decoding of to_json's documents, lenient as model/answers.py: a wrong type reads as absent.


def _state(value: object) -> WorkerState | None:
    try:
        return WorkerState(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _restarts(count: object, last: object) -> tuple[Restart, ...]:
    number, restart = integer(count), _restart(last)
    if number is None or number < 1 or restart is None:
        return ()
    return (restart,) * number


def _restart(data: object) -> Restart | None:
    """A Restart's __dict__ read back; one written before restarts had a kind takes the default."""
    if not isinstance(data, dict):
        return None
    at, attempt = number_as_written(data.get("at")), integer(data.get("attempt"))
    worker, reason = text(data.get("worker")), text(data.get("reason"))
    if at is None or attempt is None or worker is None or reason is None:
        return None
    kind = text(data.get("kind"))
    step = integer(data.get("step"))
    return Restart(
        at, attempt, worker, reason, step, **({"kind": kind} if kind is not None else {})
    )


def _scheduler(data: object) -> SchedulerState | None:
    """SchedulerState.to_json read back (both of its shapes: before and after a job id)."""
    if not isinstance(data, dict):
        return None
    scheduler, state = text(data.get("scheduler")), text(data.get("state"))
    if scheduler is None or state is None:
        return None
    return SchedulerState(
        scheduler=scheduler,
        state=state,
        jobs=texts(data.get("jobs")),
        login=text(data.get("login")),
        job_id=text(data.get("job_id")),
        reason=text(data.get("reason")),
        exit_code=integer(data.get("exit_code")),
        signal=integer(data.get("signal")),
        nodes=text(data.get("nodes")),
    )

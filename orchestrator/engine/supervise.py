"""Supervision: watch a run, and when a worker fails, restart the whole cluster from the latest
checkpoint. In MultiWorkerMirroredStrategy one dead worker stops everyone (the others fail within
seconds or hang), and TensorFlow restarts nothing, so the controller must.

A worker has failed when it exited non-zero, vanished, its host stopped answering, or its step
has not moved for the job's stall_timeout. Then every remaining worker is stopped, the chief's
latest checkpoint is made present on every host, and the cluster starts again with identical
TF_CONFIG, up to max_restarts times, with a doubling backoff. A failure with the signature of the
previous one (same worker, same kind, same step), a deterministic kind, or an exit code the job
marks permanent ends the run at once instead of looping (failures.py decides).

A preemption (every worker saved and exited 75) is no failure and never spends a restart: on
hosts it ends the run (`up` again resumes), and where the backend resubmits preempted attempts
(Slurm) the next attempt is submitted at once, however often, and counts for neither
max_restarts nor "the same failure twice".

This module also owns the coordination around a run: one supervisor per run (a lock), `down`'s
two-phase stop, `attach`'s watch, and how a finished run is concluded.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.backends.base import Backend
from orchestrator.backends.registry import open_backend
from orchestrator.contract import EXIT_PREEMPTED
from orchestrator.engine.checkpoints import Mirror
from orchestrator.engine.failures import (
    Failure,
    FailureKind,
    classify_exit,
    early_exit,
    explain,
    permanent_reason,
)
from orchestrator.engine.lifecycle import StopReport, launch_attempt, start_standbys, stop_run
from orchestrator.engine.logs import last_lines
from orchestrator.engine.runstore import RunStore, StopRequest, private_dir
from orchestrator.engine.snapshot import write_snapshot
from orchestrator.engine.state import ACTIVE, WorkerState
from orchestrator.engine.status import RunStatus, WorkerStatus, collect_status
from orchestrator.errors import (
    HostErrors,
    JobFailed,
    OrchestrateError,
    RunStateError,
)
from orchestrator.model.inventory import Host, Inventory, Job
from orchestrator.model.records import Restart, RunRecord

MAX_BACKOFF = 300
WAKE_CHECK = 0.1  # seconds between looks at the stop flag while the supervisor waits
# How long `down` waits for a live supervisor to take its stop request (at most a poll's time
# when it is between polls) before stopping the workers itself; once taken, it waits the grace
# plus the slack for the answer, then LET_GO_TIMEOUT for the supervisor to exit.
PICKUP_TIMEOUT = 3.0
STOP_ANSWER_SLACK = 30.0
LET_GO_TIMEOUT = 15.0
STOP_GRACE = 5.0  # SIGTERM -> SIGKILL for workers that may still be saving (a preemption's peers)
# The survivors of a worker that died, stalled or became unreachable cannot save: under
# MultiWorkerMirroredStrategy a save needs every worker. The built-in loop's only answer to a
# SIGTERM is a vote in its next collective, which the dead peer never joins, and a survivor
# blocked in a collective does not even run its handler (measured, issue 18: it sat out the full
# 5 s in 16 of 20 recoveries). So a task job's survivors are killed at once: a chief's checkpoint
# write cut short leaves the previous checkpoint (its state file is replaced last). A script's
# survivors get a second, for its own cleanup.
TASK_SURVIVOR_GRACE = 0.0
SCRIPT_SURVIVOR_GRACE = 1.0
# A standby waits this long past the restart's backoff after its attempt ended for the next one
# to claim it (the stop, a checkpoint's spread, a partition's wait); then it exits by itself.
STANDBY_SLACK = 120.0


# ---------------------------------------------------------------------------------------------
# Pure decisions


# States in which a worker must show news within stall_timeout: a new step, an answer, a start.
WATCHED = (WorkerState.PENDING, WorkerState.STARTING, WorkerState.RUNNING, WorkerState.UNKNOWN)


@dataclass
class StallWatch:
    """When each worker's step last moved and when its host last answered."""

    timeout: float
    _since: dict[str, tuple[object, float]] = field(default_factory=dict)

    def check(self, status: RunStatus, now: float) -> Failure | None:
        for worker in status.workers:
            if worker.queued:  # waiting for nodes is no stall: its clock starts when it runs
                self._since.pop(worker.name, None)
                continue
            if worker.state not in WATCHED or _reached_target(worker):
                continue
            # A new step, or the host answering again after silence, restarts the clock.
            mark = (worker.state is WorkerState.UNKNOWN, worker.step)
            previous = self._since.get(worker.name)
            if previous is None or previous[0] != mark:
                self._since[worker.name] = (mark, now)
                continue
            if now - previous[1] >= self.timeout:
                return Failure(worker.name, _stall_kind(worker), self._reason(worker), worker.step)
        return None

    def _reason(self, worker: WorkerStatus) -> str:
        if worker.state is WorkerState.UNKNOWN:
            return f"its host did not answer for {self.timeout:g} s ({worker.reason})"
        if worker.state is WorkerState.PENDING:
            return f"it did not start within {self.timeout:g} s (its run directory is missing)"
        where = f"at step {worker.step}" if worker.step is not None else "before its first step"
        return f"stalled: no progress for {self.timeout:g} s {where}"

    def reset(self) -> None:
        self._since.clear()


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _reached_target(worker: WorkerStatus) -> bool:
    """A worker that reported its final step is finishing, not stalled (saving, tearing down)."""
    return (
        worker.state is WorkerState.RUNNING
        and worker.target_steps is not None
        and worker.step is not None
        and worker.step >= worker.target_steps
    )


def _stall_kind(worker: WorkerStatus) -> FailureKind:
    if worker.state is WorkerState.UNKNOWN:
        return FailureKind.UNREACHABLE
    if worker.state is WorkerState.PENDING:
        return FailureKind.NOT_STARTED
    return FailureKind.STALLED


def first_failure(status: RunStatus) -> Failure | None:
    """The worker that failed first (earliest exit): the others usually fail because of it.

    A worker whose collective was aborted (peer lost) is a symptom: when another failed worker
    shows a cause of its own (killed, vanished without an exit record, an error), that one is
    reported even if its exit was recorded later or not at all."""
    failed = sorted(
        (w for w in status.workers if w.state is WorkerState.FAILED),
        key=lambda w: (w.finished_at or float("inf"), w.index),
    )
    failures = [
        Failure(w.name, _exit_kind(w), w.reason or "failed", w.step, w.exit_code) for w in failed
    ]
    causes = [f for f in failures if f.kind is not FailureKind.PEER_LOST] or failures
    return causes[0] if causes else None


def _exit_kind(worker: WorkerStatus) -> FailureKind:
    if worker.exit_code is None:
        return FailureKind.VANISHED
    return classify_exit(worker.exit_code, worker.log_tail)


def preemption(status: RunStatus) -> Failure | None:
    """A run whose workers all saved and exited 75 (SIGTERM from a scheduler): a failure to
    recover from where the backend resubmits preempted attempts."""
    if not status.workers or any(w.exit_code != EXIT_PREEMPTED for w in status.workers):
        return None
    chief = status.workers[0]
    return Failure(chief.name, FailureKind.PREEMPTED, "preempted: saved a checkpoint and exited",
                   chief.checkpoint_step, EXIT_PREEMPTED)  # fmt: skip


def survivors_grace(failure: Failure, job: Job) -> float:
    """Seconds between SIGTERM and SIGKILL for the rest of the attempt that `failure` ended: a
    preemption's peers are saving the checkpoint they agreed on; anyone else's peers cannot."""
    if failure.kind is FailureKind.PREEMPTED:
        return STOP_GRACE
    return TASK_SURVIVOR_GRACE if job.task else SCRIPT_SURVIVOR_GRACE


def failed_restarts(restarts: tuple[Restart, ...]) -> tuple[Restart, ...]:
    """The restarts that spent max_restarts: all but those after a preemption."""
    return tuple(r for r in restarts if r.kind != FailureKind.PREEMPTED.value)


def give_up_reason(failure: Failure, restarts: tuple[Restart, ...], job: Job) -> str | None:
    """Why the run ends instead of restarting, or None. A preemption is resubmitted always
    (unless the job marks 75 permanent); other failures spend the restarts, and the same one
    twice in a row (preemptions in between not counted) ends the run."""
    if failure.kind is FailureKind.PREEMPTED:
        return permanent_reason(failure, None, job.permanent_exit_codes)
    failures = failed_restarts(restarts)
    if len(failures) >= job.max_restarts:
        permanent = permanent_reason(failure, None, job.permanent_exit_codes)
        return permanent or f"it used all {job.max_restarts} restarts"
    previous = failures[-1].signature if failures else None
    return permanent_reason(failure, previous, job.permanent_exit_codes)


# Failures whose cause is on the worker's own host: a restart need not check the network first.
# After any other (peers lost, stalls, unknown crashes) it checks that the hosts reach each other.
LOCAL_KINDS = frozenset({
    FailureKind.KILLED, FailureKind.PREEMPTED, FailureKind.EARLY_EXIT, FailureKind.USAGE,
    FailureKind.IMPORT_ERROR, FailureKind.KERAS_API, FailureKind.OUT_OF_MEMORY,
    FailureKind.DISK_FULL,
})  # fmt: skip


@dataclass(frozen=True)
class ClusterPlan:
    hosts: tuple[Host, ...]
    spares: tuple[Host, ...]
    dropped: tuple[Host, ...]
    changes: tuple[str, ...] = ()  # what changed, for the log
    problem: str | None = None  # why no cluster can be formed
    hint: str | None = None


def plan_cluster(inventory: Inventory, dropped: list[Host], dead: Mapping[str, str]) -> ClusterPlan:
    """The workers of the next attempt: spares first, then min_hosts. Pure.

    The global batch size is kept when hosts are dropped (each survivor takes a larger share),
    so the optimizer sees the same batch per step and the learning-rate schedule still fits."""
    spares = [s for s in inventory.spares if s.name not in dead]
    hosts: list[Host] = []
    changes: list[str] = []
    still_dropped: list[Host] = []
    for host in inventory.hosts:
        if host.name not in dead:
            hosts.append(host)
        elif spares:
            spare = spares.pop(0)
            changes.append(f"{host.name} does not answer; spare {spare.name} takes its place")
            hosts.append(spare)
        else:
            still_dropped.append(host)
    for host in dropped:
        if host.name in dead:
            still_dropped.append(host)
        else:
            changes.append(f"{host.name} answers again and rejoins the cluster")
            hosts.append(host)
    wanted = inventory.min_hosts or len(hosts) + len(still_dropped)
    lost = [h for h in still_dropped if h not in dropped]
    if len(hosts) < wanted:
        gone = ", ".join(f"{h.name} ({dead[h.name]})" for h in still_dropped)
        return ClusterPlan(
            (), (), (),
            tuple(changes),
            f"host {gone} does not answer and no spare host is left to replace it"
            + (f"; {len(hosts)} host(s) answer, min_hosts is {wanted}" if inventory.min_hosts
               else ""),
            "list replacement hosts under 'spares:' or allow fewer with 'min_hosts:', or bring "
            "the host back and run 'orchestrate up' again to resume from the checkpoint",
        )  # fmt: skip
    job = inventory.job
    if job.task is not None and job.batch_size % len(hosts):
        return ClusterPlan(
            (), (), (), tuple(changes),
            f"{len(hosts)} host(s) answer, but the global batch size {job.batch_size} does not "
            f"split evenly over {len(hosts)} workers",
            "choose a batch_size divisible by every worker count down to min_hosts",
        )  # fmt: skip
    for host in lost:
        changes.append(
            f"{host.name} does not answer and no spare is left; going on with {len(hosts)} "
            f"worker(s) (min_hosts {wanted})"
        )
    return ClusterPlan(tuple(hosts), tuple(spares), tuple(still_dropped), tuple(changes))


def backoff(job: Job, restarts_so_far: int) -> float:
    return float(min(MAX_BACKOFF, job.restart_backoff * 2**restarts_so_far))


def conclude(final: RunStatus, record: RunRecord) -> str:
    """The line that reports a successful run; JobFailed saying why for any other ending."""
    if final.state is WorkerState.SUCCEEDED:
        steps = max((w.step or 0) for w in final.workers)
        restarts = f" after {len(record.restarts)} restart(s)" if record.restarts else ""
        chief = final.workers[0]
        evaluated = ""
        if chief.val_accuracy is not None:  # the final evaluation, over the whole eval split
            evaluated = f"; val_loss {chief.val_loss:.4g} val_accuracy {chief.val_accuracy:.3f}"
        return (
            f"job {final.job} succeeded at step {steps}{restarts}{evaluated}; "
            f"checkpoints in {record.workers[0].checkpoint_dir}"
        )
    if any(w.reason and "preempted" in w.reason for w in final.workers):
        step = max((w.checkpoint_step or 0) for w in final.workers)
        raise JobFailed(
            f"the run was preempted and saved a checkpoint at step {step}",
            hint="run 'orchestrate up' with the same inventory again to resume",
        )
    if record.outcome:
        raise JobFailed(record.outcome, hint="'orchestrate tail' shows every worker's log")
    if final.state is WorkerState.STOPPED:
        raise JobFailed(
            "the run was stopped by 'orchestrate down'",
            hint="'orchestrate up' with the same inventory resumes from the latest checkpoint",
        )
    raise JobFailed(failure_report(final), hint="'orchestrate tail' shows every worker's log")


def failure_report(status: RunStatus) -> str:
    """Which worker failed first, how, at what step, and the last lines of its log."""
    failure = first_failure(status)
    if failure is None:
        return f"run {status.run_id} ended {status.state.value}"
    worker = next(w for w in status.workers if w.name == failure.worker)
    lines = [
        f"worker {worker.name} (index {worker.index}) failed at step {worker.step or 0}: "
        f"{worker.reason}"
    ]
    advice = explain(failure.kind, worker.log_tail)
    if advice:
        lines.append(f"what to do: {advice}")
    if worker.log_tail:
        lines.append(f"last lines of {worker.name}'s log:")
        lines.extend(f"  {line}" for line in worker.log_tail[-10:])
    return "\n".join(lines)


def root_cause(failure: Failure, log_tail: tuple[str, ...], why: str, restarts: int) -> str:
    step = f"at step {failure.step}" if failure.step is not None else "before its first step"
    lines = [
        f"the run failed for good after {restarts} restart(s) because {why}.",
        f"the worker that failed first: {failure.worker} {step}: {failure.reason}",
    ]
    advice = explain(failure.kind, log_tail)
    if advice:
        lines.append(f"what to do: {advice}")
    if log_tail:
        lines.append(f"last lines of {failure.worker}'s log:")
        lines.extend(f"  {line}" for line in log_tail)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# One supervisor per run


class FileLock:
    """An flock on a lock file: released by the kernel when its holder dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return True

    def held_elsewhere(self) -> bool:
        if self.acquire():
            self.release()
            return False
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def wait_released(self, timeout: float) -> bool:
        """Whether the holder let go within `timeout` seconds (the lock is not kept)."""
        deadline = time.monotonic() + timeout
        while self.held_elsewhere():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def wait(self, timeout: float) -> bool:
        """Acquire, waiting up to `timeout` seconds for the holder to let go."""
        deadline = time.monotonic() + timeout
        while not self.acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True


SupervisorLock = FileLock  # one per run: `{run_id}.lock`
START_WAIT = 300.0  # seconds a second `up` waits for the first to finish launching


@contextmanager
def exclusive_start(store: RunStore, say: Callable[[str], None]) -> Iterator[None]:
    """Only one `up` at a time in a state directory, from its check for an active run through
    the launch: two concurrent ones would both pass the check and start one job twice."""
    lock = FileLock(store.start_lock_path())
    if not lock.acquire():
        say("another 'orchestrate up' is starting a run in this state directory; waiting for it")
        if not lock.wait(START_WAIT):
            raise RunStateError(
                f"another 'orchestrate up' has been starting a run in {store.root} for "
                f"{START_WAIT:g} s",
                hint="'orchestrate status' shows what runs; try again when it has started",
            )
    try:
        yield
    finally:
        lock.release()


def interrupted_launch(store: RunStore, record: RunRecord, *, holding_start: bool = False) -> bool:
    """An attempt whose launcher died before every worker started: nobody is launching it
    (the start lock is free, or held by the caller) and nobody supervises it (a supervisor's
    own restart holds its run's lock)."""
    return (
        not record.launched
        and (holding_start or not FileLock(store.start_lock_path()).held_elsewhere())
        and not FileLock(store.lock_path(record.run_id)).held_elsewhere()
    )


def stop_interrupted_launch(
    store: RunStore, backend: Backend, record: RunRecord, say: Callable[[str], None]
) -> RunRecord:
    """Stop what a dead launcher had started (the rest would wait forever for the missing
    peers) and mark the attempt as over, so it neither wedges the state directory nor orphans
    a worker. Returns the record as saved."""
    status = collect_status(record, backend)
    started = [w.name for w in status.workers if w.state is not WorkerState.PENDING]
    say(
        f"run {record.run_id}: the launch of attempt {record.attempt} was interrupted "
        f"({len(started)} of {len(record.workers)} workers had started); stopping them"
    )
    stop_run(record, backend, grace=STOP_GRACE)
    record = replace(record, launched=True)
    store.save(record)
    return record


def relaunch(
    store: RunStore, backend: Backend, record: RunRecord, say: Callable[[str], None]
) -> RunRecord:
    """A half-launched attempt is not adopted: stopped, and the next attempt started afresh
    (no restart is counted: nothing failed)."""
    record = stop_interrupted_launch(store, backend, record, say)
    return launch_attempt(replace(record, attempt=record.attempt + 1), store, backend, say)


def refuse_if_active(
    store: RunStore, backend: Backend, say: Callable[[str], None] = lambda message: None
) -> None:
    """A second copy of a job would fight the first for its ports and checkpoints. A previous
    run whose launch was interrupted is stopped instead (it can never run). Called by the
    holder of the start lock (exclusive_start)."""
    if store.current_id() is None:
        return
    previous = store.load()
    if interrupted_launch(store, previous, holding_start=True):
        record = stop_interrupted_launch(store, backend, previous, say)
        if not record.outcome:
            store.save(replace(record, outcome="its launch was interrupted; stopped"))
        return
    supervised = SupervisorLock(store.lock_path(previous.run_id)).held_elsewhere()
    # The earlier run may live elsewhere (hosts, or a Slurm cluster): ask its own backend,
    # or this one when it serves both (its sessions then serve the launch too).
    if backend.serves(previous.inventory):
        status = collect_status(previous, backend)
    else:
        with open_backend(previous.inventory) as own:
            status = collect_status(previous, own)
    if status.state in ACTIVE or supervised:
        state = status.state.value if status.state in ACTIVE else "being restarted"
        raise RunStateError(
            f"run {previous.run_id} of job '{previous.job_name}' is still {state}",
            hint="watch it with 'orchestrate attach' or 'orchestrate status', "
            "or stop it with 'orchestrate down' before starting another",
        )


def stop_everything(store: RunStore, backend: Backend, run_id: str | None,
                    grace: float) -> tuple[RunRecord, StopReport]:  # fmt: skip
    """`down`: flag the run so its supervisor starts no new attempt. A live supervisor stops the
    workers itself, over the agent sessions it holds open (no connection, no Python start per
    host: issue 18's down at 64 hosts). Without one, or one that does not take the request
    (busy in a restart's backoff or launch), stop the workers from here, wait for the supervisor
    to let go, and stop the attempt it may have started meanwhile."""
    record = store.load(run_id)
    request = store.request_stop(record.run_id, grace)
    lock = SupervisorLock(store.lock_path(record.run_id))
    if lock.held_elsewhere():
        answer = _supervisor_stopped(store, record.run_id, request, lock)
        if answer is not None:
            return store.load(record.run_id), answer
    report = stop_run(record, backend, grace)
    # Touched again: the supervisor, waiting for its next poll, polls now and lets go.
    store.stop_flag(record.run_id).touch()
    lock.wait_released(grace + 15)
    newer = store.load(record.run_id)
    if newer.attempt != record.attempt:
        report = stop_run(newer, backend, grace)
    else:  # a standby the supervisor started while the stop was on its way
        backend.discard_standbys(newer.workers)
    return newer, report


def _supervisor_stopped(store: RunStore, run_id: str, request: StopRequest,
                        lock: FileLock) -> StopReport | None:  # fmt: skip
    """The live supervisor's answer to `request`, once it has stopped the workers and let go;
    None if it does not take the request within PICKUP_TIMEOUT, or lets go without an answer."""
    path = store.stop_answer_path(run_id)
    deadline = time.monotonic() + PICKUP_TIMEOUT
    taken = False
    while time.monotonic() < deadline:
        answer = _read_answer(path, request)
        if answer is not None and "outcome" in answer:
            lock.wait_released(LET_GO_TIMEOUT)  # its standbys are discarded once it lets go
            return StopReport.from_json(answer)
        if answer is not None and not taken:
            taken = True
            deadline = time.monotonic() + request.grace + STOP_ANSWER_SLACK
        if not lock.held_elsewhere():
            return None  # it ended (or died) without answering: stop from here
        time.sleep(WAKE_CHECK / 2)
    return None


def _read_answer(path: Path, request: StopRequest) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("request") == request.id else None


def watch(store: RunStore, backend: Backend, run_id: str,
          show: Callable[[RunStatus], None], interval: float) -> RunStatus:  # fmt: skip
    """Follow a run another process supervises, until it has ended and that process let go."""
    lock = SupervisorLock(store.lock_path(run_id))
    while True:
        final = collect_status(store.load(run_id), backend)
        show(final)
        if final.state.finished and not lock.held_elsewhere():
            return final
        time.sleep(interval)


class Supervisor:
    def __init__(
        self,
        store: RunStore,
        backend: Backend,
        record: RunRecord,
        *,
        show: Callable[[RunStatus], None] = lambda status: None,
        say: Callable[[str], None] = lambda message: None,
        interval: float = 1.0,
    ) -> None:
        self.store = store
        self.backend = backend
        self.record = record
        self.show = show
        self.say = say
        self.interval = interval
        self.watch = StallWatch(record.inventory.job.stall_timeout)
        self.mirror = Mirror(store.mirror_path(record.run_id))
        self._mirrored_step = -1
        self._standbys_for = -1  # the attempt whose slots last got standbys
        self._answered = ""  # the id of the last stop request this supervisor carried out

    def run(self) -> RunStatus:
        """Supervise until the run succeeds, is stopped, or fails for good (JobFailed). However
        it ends, no standby of the run stays behind."""
        try:
            return self._run()
        finally:
            with suppress(OrchestrateError):  # a host not answering: its standbys linger out
                self.backend.discard_standbys(self.record.workers)

    def _run(self) -> RunStatus:
        while True:
            if not self.store.exists(self.record.run_id):
                raise RunStateError(f"the record of run {self.record.run_id} was removed")
            status = collect_status(self.record, self.backend)
            self.show(status)
            write_snapshot(self.store, status)  # the dashboard serves this; no second probe
            stopping = self.store.stop_flag(self.record.run_id).exists()
            if status.state is WorkerState.STOPPED and not stopping:
                preempted = preemption(status) if self.backend.resubmits_preempted else None
                if preempted is not None:
                    self._recover(preempted)
                    continue
            if status.state in (WorkerState.SUCCEEDED, WorkerState.STOPPED):
                return status
            if stopping:
                # `down` is stopping the run: what ends now is no failure to recover from.
                if status.state.finished:
                    return status
                if self._stop_as_asked():
                    continue
                self._pause()
                continue
            self._mirror_new_checkpoint(status)
            failure = first_failure(status) or self.watch.check(status, time.monotonic())
            if failure is not None:
                done = [w.name for w in status.workers if w.state is WorkerState.SUCCEEDED]
                failure = early_exit(failure, done)
                self._recover(failure)
            else:
                self._start_standbys(status)
                self._pause()

    def _stop_as_asked(self) -> bool:
        """Carry out `down`'s stop request over this supervisor's sessions and answer it; False
        if there is none left to answer (then `down` stops the workers itself)."""
        request = self.store.stop_request(self.record.run_id)
        if request is None or request.id == self._answered:
            return False
        self._answered = request.id
        path = self.store.stop_answer_path(self.record.run_id)
        self.store.write_file(path, json.dumps({"request": request.id}))
        self.say(f"stopping the workers for 'orchestrate down' (grace {request.grace:g} s)")
        try:
            report = stop_run(self.record, self.backend, request.grace)
        except OrchestrateError as error:  # `down` sees no answer once this supervisor lets go
            self.say(f"could not stop the workers: {error.message}")
            raise
        self.store.write_file(path, json.dumps({"request": request.id, **report.to_json()}))
        return True

    def _pause(self) -> None:
        """Wait one interval, or less: `down` touches the stop flag when it starts and again
        once it has stopped the workers; the supervisor then polls at once, sees the run
        stopped and lets go, instead of keeping `down` waiting up to a whole interval."""
        flag = self.store.stop_flag(self.record.run_id)
        seen = _mtime(flag)
        deadline = time.monotonic() + self.interval
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, WAKE_CHECK))
            if _mtime(flag) != seen:
                return

    def _start_standbys(self, status: RunStatus) -> None:
        """Once every worker of the attempt made its first step (so the standbys' imports do not
        slow the attempt's own start), a standby per slot, for the next attempt, while a
        restart is left."""
        job = self.record.inventory.job
        spent = len(failed_restarts(self.record.restarts))  # as _recover counts them
        if (
            not job.warm
            or self._standbys_for == self.record.attempt
            or spent >= job.max_restarts
            or not all(w.state is WorkerState.RUNNING and w.stepped for w in status.workers)
        ):  # fmt: skip
            return
        self._standbys_for = self.record.attempt
        linger = backoff(job, spent) + STANDBY_SLACK  # past the backoff _recover will wait
        try:
            answers = start_standbys(self.record, self.backend, linger)
        except OrchestrateError as error:  # a secret gone from the environment: cold restarts
            self.say(f"no standbys for a warm restart: {error.message}")
            return
        for name, answer in answers.items():
            if answer not in ("started", "kept"):
                self.say(f"no standby for {name} (its restart will start cold): {answer}")

    def _recover(self, failure: Failure) -> None:
        job = self.record.inventory.job
        restarts = self.record.restarts
        restart = Restart(time.time(), self.record.attempt, failure.worker, failure.reason,
                          failure.step, failure.kind.value)  # fmt: skip
        tail = self._log_tail(failure.worker)
        stop_run(self.record, self.backend, grace=survivors_grace(failure, job), standbys=False)
        why = give_up_reason(failure, restarts, job)
        if why:
            outcome = f"gave up: {restart.describe()}; {why}"
            advice = explain(failure.kind, tail)
            if advice:  # `status` and the dashboard show the outcome: the fix goes with it
                outcome += f". What to do: {advice}"
            self.record = replace(self.record, outcome=outcome)
            self.store.save(self.record)
            raise JobFailed(root_cause(failure, tail, why, len(restarts)),
                            hint="'orchestrate tail' shows every worker's log")  # fmt: skip
        spent = len(failed_restarts(restarts))
        if failure.kind is FailureKind.PREEMPTED:
            wait = 0.0
            self.say(f"{restart.describe()}; resubmitting from the checkpoint (a preemption "
                     f"spends no restart: {spent}/{job.max_restarts} used)")  # fmt: skip
        else:
            wait = backoff(job, spent)
            self.say(
                f"{restart.describe()}; restarting the cluster "
                f"({spent + 1}/{job.max_restarts}) in {wait:g} s"
            )
        time.sleep(wait)
        if self.store.stop_flag(self.record.run_id).exists():
            return
        self.record = replace(self.record, attempt=self.record.attempt + 1,
                              restarts=(*restarts, restart))  # fmt: skip
        try:
            self._replace_dead_hosts()
            self._wait_until_reachable(failure)
            if self.store.stop_flag(self.record.run_id).exists():
                return
            self.record = launch_attempt(self.record, self.store, self.backend, self.say)
        except (HostErrors, OrchestrateError) as error:
            raise JobFailed(
                f"the restart after {restart.describe()} failed: {error.message}",
                hint=error.hint,
            ) from error
        self.watch.reset()

    def _mirror_new_checkpoint(self, status: RunStatus) -> None:
        """Keep a remote chief's newest checkpoint on this machine too: if its host is lost,
        the run resumes from here."""
        chief = self.record.workers[0]
        step = status.workers[0].checkpoint_step
        if self.backend.reads_in_place(chief.host) or step is None:
            return
        if self.backend.shared_checkpoints:  # a shared filesystem keeps them (Slurm)
            return
        if step <= self._mirrored_step:
            return
        try:
            if self.mirror.update(chief.host, chief.checkpoint_dir, self.backend):
                self.say(f"copied checkpoint at step {step} from {chief.name} to this machine")
            self._mirrored_step = step
        except OrchestrateError as error:
            self.say(f"could not copy {chief.name}'s checkpoint: {error.message}")

    def _replace_dead_hosts(self) -> None:
        """Before a restart: hosts that cannot be reached are replaced by spares, in order; with
        no spare left they are dropped while at least min_hosts remain (TF_CONFIG is rebuilt
        for the survivors); hosts dropped earlier that answer again come back."""
        inventory, dropped = self.record.inventory, list(self.record.dropped)
        dead = self.backend.unreachable([*inventory.hosts, *dropped])
        plan = plan_cluster(inventory, dropped, dead)
        for line in plan.changes:
            self.say(line)
        if plan.problem:
            raise JobFailed(plan.problem, hint=plan.hint)
        new_inventory = replace(inventory, hosts=plan.hosts, spares=plan.spares)
        self.record = replace(self.record, inventory=new_inventory, dropped=plan.dropped)

    def _wait_until_reachable(self, failure: Failure) -> None:
        """A partition between hosts would fail every restart the same way: after a failure
        that may be one, check the hosts' TensorFlow ports from each other first, and wait
        with backoff (no restart spent) until they reach each other or partition_timeout."""
        if failure.kind in LOCAL_KINDS:
            return
        job = self.record.inventory.job
        deadline = time.monotonic() + job.partition_timeout
        wait = 2.0
        while True:
            blocked = self.backend.network_problems(self.record.inventory)
            if not blocked:
                return
            details = "; ".join(f"{f.host}: {f.detail}" for f in blocked)
            left = deadline - time.monotonic()
            if left <= 0:
                raise JobFailed(
                    f"the cluster cannot be restarted: the hosts still cannot reach each other "
                    f"after {job.partition_timeout} s: {details}",
                    hint=blocked[0].hint or "check the network between the hosts",
                )
            self.say(f"restart waits for the network: {details}; checking again in {wait:g} s")
            time.sleep(min(wait, left))
            wait = min(wait * 2, 30.0)
            if self.store.stop_flag(self.record.run_id).exists():
                return

    def _log_tail(self, name: str) -> tuple[str, ...]:
        workers = [w for w in self.record.workers if w.name == name]
        try:
            return tuple(line for _, line in last_lines(workers, self.backend, 10))
        except OrchestrateError:
            return ()

"""Supervision: watch a run, and when a worker fails, restart the whole cluster from the latest
checkpoint. In MultiWorkerMirroredStrategy one dead worker stops everyone (the others fail within
seconds or hang), and TensorFlow restarts nothing, so the controller must.

A worker has failed when it exited non-zero, vanished, its host stopped answering, or its step
has not moved for the job's stall_timeout. Then every remaining worker is stopped, the chief's
latest checkpoint is made present on every host, and the cluster starts again with identical
TF_CONFIG, up to max_restarts times, with a doubling backoff. A failure that repeats the previous
one exactly (same worker, same way, same step), or an exit code the job marks permanent, ends the
run at once instead of looping.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.checkpoints import Mirror
from orchestrator.connect import Machines
from orchestrator.dashboard.snapshot import write_snapshot
from orchestrator.errors import ConnectError, HostErrors, JobFailed, OrchestrateError, RunStateError
from orchestrator.fanout import fan_out
from orchestrator.inventory import Job
from orchestrator.lifecycle import launch_attempt, stop_run
from orchestrator.logs import last_lines
from orchestrator.runstore import Restart, RunRecord, RunStore
from orchestrator.state import ACTIVE, WorkerState
from orchestrator.status import RunStatus, WorkerStatus, collect_status

MAX_BACKOFF = 300
STOP_GRACE = 5.0  # the remaining workers of a failed attempt would fail or hang anyway


@dataclass(frozen=True)
class Failure:
    worker: str
    reason: str
    step: int | None
    exit_code: int | None


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
            if worker.state not in WATCHED:
                continue
            # A new step, or the host answering again after silence, restarts the clock.
            mark = (worker.state is WorkerState.UNKNOWN, worker.step)
            previous = self._since.get(worker.name)
            if previous is None or previous[0] != mark:
                self._since[worker.name] = (mark, now)
                continue
            if now - previous[1] >= self.timeout:
                return Failure(worker.name, self._reason(worker), worker.step, None)
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


def first_failure(status: RunStatus) -> Failure | None:
    """The worker that failed first: the others usually fail because of it."""
    failed = [w for w in status.workers if w.state is WorkerState.FAILED]
    if not failed:
        return None
    first = min(failed, key=lambda w: w.finished_at or float("inf"))
    return Failure(first.name, first.reason or "failed", first.step, first.exit_code)


def permanent_reason(failure: Failure, previous: Restart | None, job: Job) -> str | None:
    if failure.exit_code in job.permanent_exit_codes:
        return f"exit code {failure.exit_code} is marked permanent"
    if previous is not None and (previous.worker, previous.reason, previous.step) == (
        failure.worker,
        failure.reason,
        failure.step,
    ):
        return "it failed the same way at the same step twice in a row"
    return None


def backoff(job: Job, restarts_so_far: int) -> float:
    return float(min(MAX_BACKOFF, job.restart_backoff * 2**restarts_so_far))


# ---------------------------------------------------------------------------------------------
# One supervisor per run


class SupervisorLock:
    """An flock on the run's lock file: released by the kernel when its holder dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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


def refuse_if_active(store: RunStore, machines: Machines) -> None:
    """A second copy of a job would fight the first for its ports and checkpoints."""
    if store.current_id() is None:
        return
    previous = store.load()
    supervised = SupervisorLock(store.lock_path(previous.run_id)).held_elsewhere()
    status = collect_status(previous, machines)
    if status.state in ACTIVE or supervised:
        state = status.state.value if status.state in ACTIVE else "being restarted"
        raise RunStateError(
            f"run {previous.run_id} of job '{previous.job_name}' is still {state}",
            hint="watch it with 'orchestrate attach' or 'orchestrate status', "
            "or stop it with 'orchestrate down' before starting another",
        )


def stop_flag(store: RunStore, run_id: str) -> Path:
    """`orchestrate down` leaves this so a supervisor between two attempts starts no new one."""
    return store.root / "runs" / f"{run_id}.stop"


class Supervisor:
    def __init__(
        self,
        store: RunStore,
        machines: Machines,
        record: RunRecord,
        *,
        show: Callable[[RunStatus], None] = lambda status: None,
        say: Callable[[str], None] = lambda message: None,
        interval: float = 1.0,
    ) -> None:
        self.store = store
        self.machines = machines
        self.record = record
        self.show = show
        self.say = say
        self.interval = interval
        self.watch = StallWatch(record.inventory.job.stall_timeout)
        self.mirror = Mirror(store.mirror_path(record.run_id))
        self._mirrored_step = -1

    def run(self) -> RunStatus:
        """Supervise until the run succeeds, is stopped, or fails for good (JobFailed)."""
        while True:
            if not self.store.exists(self.record.run_id):
                raise RunStateError(f"the record of run {self.record.run_id} was removed")
            status = collect_status(self.record, self.machines)
            self.show(status)
            write_snapshot(self.store, status)  # the dashboard serves this; no second probe
            if status.state in (WorkerState.SUCCEEDED, WorkerState.STOPPED):
                return status
            if stop_flag(self.store, self.record.run_id).exists():
                # `down` is stopping the run: what ends now is no failure to recover from.
                if status.state.finished:
                    return status
                time.sleep(self.interval)
                continue
            self._mirror_new_checkpoint(status)
            failure = first_failure(status) or self.watch.check(status, time.monotonic())
            if failure is not None:
                self._recover(failure)
            else:
                time.sleep(self.interval)

    def _recover(self, failure: Failure) -> None:
        job = self.record.inventory.job
        restarts = self.record.restarts
        restart = Restart(time.time(), self.record.attempt, failure.worker, failure.reason,
                          failure.step)  # fmt: skip
        tail = self._log_tail(failure.worker)
        stop_run(self.record, self.machines, grace=STOP_GRACE)
        permanent = permanent_reason(failure, restarts[-1] if restarts else None, job)
        if permanent or len(restarts) >= job.max_restarts:
            why = permanent or f"it used all {job.max_restarts} restarts"
            outcome = f"gave up: {restart.describe()}; {why}"
            self.record = replace(self.record, outcome=outcome)
            self.store.save(self.record)
            raise JobFailed(root_cause(failure, tail, why, len(restarts)),
                            hint="'orchestrate tail' shows every worker's log")  # fmt: skip
        wait = backoff(job, len(restarts))
        self.say(
            f"{restart.describe()}; restarting the cluster "
            f"({len(restarts) + 1}/{job.max_restarts}) in {wait:g} s"
        )
        time.sleep(wait)
        if stop_flag(self.store, self.record.run_id).exists():
            return
        self.record = replace(self.record, attempt=self.record.attempt + 1,
                              restarts=(*restarts, restart))  # fmt: skip
        try:
            self._replace_dead_hosts()
            self.record = launch_attempt(self.record, self.store, self.machines, self.say)
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
        if chief.host.connection == "local" or step is None or step <= self._mirrored_step:
            return
        try:
            if self.mirror.update(chief.host, chief.checkpoint_dir, self.machines):
                self.say(f"copied checkpoint at step {step} from {chief.name} to this machine")
            self._mirrored_step = step
        except OrchestrateError as error:
            self.say(f"could not copy {chief.name}'s checkpoint: {error.message}")

    def _replace_dead_hosts(self) -> None:
        """Hosts that do not answer are replaced by spares, in order, before a restart."""
        inventory = self.record.inventory
        answers = fan_out(
            range(len(inventory.hosts)), lambda i: self.machines.agent(inventory.hosts[i]).info()
        )
        hosts, spares = list(inventory.hosts), list(inventory.spares)
        for index, answer in answers.items():
            if not isinstance(answer, ConnectError):
                continue
            if not spares:
                raise JobFailed(
                    f"host {hosts[index].name} does not answer ({answer.message}) and no spare "
                    "host is left to replace it",
                    hint="list replacement hosts under 'spares:' in the inventory, or bring the "
                    "host back and run 'orchestrate up' again to resume from the checkpoint",
                )
            spare = spares.pop(0)
            self.say(f"{hosts[index].name} does not answer; spare {spare.name} takes its place")
            hosts[index] = spare
        new_inventory = replace(inventory, hosts=tuple(hosts), spares=tuple(spares))
        self.record = replace(self.record, inventory=new_inventory)

    def _log_tail(self, name: str) -> tuple[str, ...]:
        workers = [w for w in self.record.workers if w.name == name]
        try:
            return tuple(line for _, line in last_lines(workers, self.machines, 10))
        except OrchestrateError:
            return ()


def root_cause(failure: Failure, log_tail: tuple[str, ...], why: str, restarts: int) -> str:
    step = f"at step {failure.step}" if failure.step is not None else "before its first step"
    lines = [
        f"the run failed for good after {restarts} restart(s) because {why}.",
        f"the worker that failed first: {failure.worker} {step}: {failure.reason}",
    ]
    if log_tail:
        lines.append(f"last lines of {failure.worker}'s log:")
        lines.extend(f"  {line}" for line in log_tail)
    return "\n".join(lines)

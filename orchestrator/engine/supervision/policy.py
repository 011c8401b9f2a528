"""The supervisor's failure policy, as pure decisions: which worker failed first and how (a
stall, an exit, a preemption), how long its survivors may take to stop, whether a failure ends
the run or is worth a restart, the backoff, and the words that conclude a run.

A failure with the signature of the previous one (the same kind at the same step; of the same
worker too where the kind is about a machine, failures.same_failure), a
deterministic kind, or an exit code the job marks permanent ends the run at once instead of
looping (failures.py decides). A preemption (every worker saved and exited 75) spends no
restart: where the backend resubmits preempted attempts (Slurm) the next attempt is submitted
at once, however often, and counts for neither max_restarts nor "the same failure twice".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.contract import EXIT_PREEMPTED, KERAS_JAX, STRATEGY_PS
from orchestrator.engine.observe.excerpt import excerpt
from orchestrator.engine.observe.failures import (
    Failure,
    classify_exit,
    explain,
    permanent_reason,
    with_consequences,
)
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.errors import (
    InventoryError,
    JobFailed,
    Problem,
)
from orchestrator.model.inventory import (
    ROLE_CHIEF,
    ROLE_PS,
    ROLE_WORKER,
    Inventory,
    Job,
)
from orchestrator.model.records import Restart, RunRecord, alone_counts
from orchestrator.model.vocabulary import FailureKind, WorkerState

MAX_BACKOFF = 300


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


# States in which a worker must show news within stall_timeout: a new step, an answer, a start.
WATCHED = (WorkerState.PENDING, WorkerState.STARTING, WorkerState.RUNNING, WorkerState.UNKNOWN)


# A worker's phases for the watch: starting (alive, no step past the one it began at: importing,
# waiting for its cluster, tracing its first step), stepping, and its host not answering.
STARTING, STEPPING, SILENT = "starting", "stepping", "silent"


@dataclass
class StallWatch:
    """When each worker's step last moved, when its host last answered, and when it began to
    start. Two limits: `start_timeout` from a worker's start to its first step (a slow import
    on a loaded host is start-up, not a hang), `timeout` (stall_timeout) from then on between
    steps, for a host's silence, and for a worker whose run directory never appears."""

    timeout: float
    start_timeout: float | None = None  # None: the same as timeout
    _since: dict[str, tuple[object, float]] = field(default_factory=dict)
    _phase: dict[str, tuple[str, float]] = field(default_factory=dict)

    def check(self, status: RunStatus, now: float) -> Failure | None:
        for worker in status.workers:
            if worker.queued:  # waiting for nodes is no stall: its clock starts when it runs
                self._since.pop(worker.name, None)
                self._phase.pop(worker.name, None)
                continue
            if worker.state not in WATCHED or _reached_target(worker):
                continue
            failure = self._started_late(worker, now) or self._stalled(worker, now)
            if failure is not None:
                pace = status.pace if worker.state is WorkerState.RUNNING else None
                reason = failure.reason + (f" (before it: {pace})" if pace else "")
                return replace(failure, reason=reason)
        return None

    def _started_late(self, worker: WorkerStatus, now: float) -> Failure | None:
        """A worker past start_timeout without its first step. Its start clock runs from when
        it was first seen starting (this attempt, or its restart by itself), through
        whatever it reports before its first step."""
        phase = _phase(worker)
        previous = self._phase.get(worker.name)
        if previous is None or previous[0] != phase:
            self._phase[worker.name] = previous = (phase, now)
        limit = self.start_limit
        if phase != STARTING or worker.state is WorkerState.PENDING or now - previous[1] < limit:
            return None
        reported = ("it reported no progress" if worker.step is None
                    else f"it reported its start step {worker.step} and none past it")  # fmt: skip
        reason = f"no first step within start_timeout {limit:g} s ({reported})"
        return Failure(worker.name, FailureKind.STALLED, reason, worker.step)

    def _stalled(self, worker: WorkerStatus, now: float) -> Failure | None:
        """A worker whose step (or whose host's answer) has not changed for stall_timeout;
        none while it is starting (start_timeout is its limit then)."""
        # A new step, or the host answering again after silence, restarts the clock.
        mark = (worker.state is WorkerState.UNKNOWN, worker.step)
        previous = self._since.get(worker.name)
        if previous is None or previous[0] != mark:
            self._since[worker.name] = (mark, now)
            return None
        if _phase(worker) == STARTING and worker.state is not WorkerState.PENDING:
            return None
        if now - previous[1] < self.timeout:
            return None
        return Failure(worker.name, _stall_kind(worker), self._reason(worker), worker.step)

    @property
    def start_limit(self) -> float:
        return self.timeout if self.start_timeout is None else self.start_timeout

    def _reason(self, worker: WorkerStatus) -> str:
        if worker.state is WorkerState.UNKNOWN:
            return f"its host did not answer for {self.timeout:g} s ({worker.reason})"
        if worker.state is WorkerState.PENDING:
            return f"it did not start within {self.timeout:g} s (its run directory is missing)"
        where = f"at step {worker.step}" if worker.step is not None else "before its first step"
        return f"stalled: no progress for {self.timeout:g} s (stall_timeout) {where}"

    def reset(self) -> None:
        self._since.clear()
        self._phase.clear()


def _phase(worker: WorkerStatus) -> str:
    if worker.state is WorkerState.UNKNOWN:
        return SILENT
    return STEPPING if worker.stepped else STARTING


def file_mtime(path: Path) -> int | None:
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

    Decided over every exit recorded so far, not the first seen: a worker whose collective was
    aborted (peer lost) is a consequence; when another failed worker shows a cause of its own
    (killed, vanished without an exit record, an error), that one is reported even if its exit
    was recorded later, and the aborted ones are named as what followed from it."""
    failed = sorted(
        (w for w in status.workers if w.state is WorkerState.FAILED),
        key=lambda w: (w.finished_at or float("inf"), w.index),
    )
    failures = [worker_failure(w) for w in failed]
    causes = [f for f in failures if f.kind is not FailureKind.PEER_LOST]
    if not causes:
        return failures[0] if failures else None
    aborted = [f.worker for f in failures if f.kind is FailureKind.PEER_LOST]
    return with_consequences(causes[0], aborted)


# How long a failure that is only a consequence (its collective aborted: a peer went away) waits
# for its cause to show up before the attempt is given up with it. The dead peer's own exit can
# be recorded after its peers' on a busy machine: deciding on the first exit seen named the
# wrong worker (docs/supervision.md).
CAUSE_WINDOW = 5.0


def awaits_cause(failure: Failure, status: RunStatus, waited: float) -> bool:
    """Whether to look again before acting on `failure` (first_failure's choice), `waited`
    seconds after it was first seen: it is a consequence (PEER_LOST), a worker it may be the
    consequence of has not failed yet, and the window is not over."""
    if failure.kind is not FailureKind.PEER_LOST or waited >= CAUSE_WINDOW:
        return False
    return any(w.state in (WorkerState.RUNNING, WorkerState.UNKNOWN) for w in status.workers
               if w.name != failure.worker)  # fmt: skip


def worker_failure(worker: WorkerStatus) -> Failure:
    """A failed worker's failure: its name, kind, reason, step and exit code."""
    return Failure(worker.name, _exit_kind(worker), worker.reason or "failed", worker.step,
                   worker.exit_code)  # fmt: skip


def _exit_kind(worker: WorkerStatus) -> FailureKind:
    if worker.exit_code is None:
        return FailureKind.VANISHED
    # What status decided (an exit 0 that failed); a kind this orchestrate does not know (a
    # snapshot of another version): the exit is read again.
    if isinstance(worker.failure_kind, FailureKind):
        return worker.failure_kind
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
    return tuple(r for r in restarts if r.kind != FailureKind.PREEMPTED)


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


# The states in which a ParameterServerStrategy chief or ps still holds the training: a lost
# worker is then started again by itself (worker_restart).
CARRYING_ON = (WorkerState.PENDING, WorkerState.STARTING, WorkerState.RUNNING)


def worker_restart(status: RunStatus, alone: tuple[Restart, ...], job: Job) -> int | None:
    """Under ParameterServerStrategy, the position of a failed worker task to start again by
    itself at its address, while the chief and the ps go on: their ClusterCoordinator
    re-dispatches the lost worker's steps to the others and takes it back once its server
    answers at the same address (a lost ps fails the chief's step: that is a cluster restart).

    None when no worker task failed, the chief or a ps is not carrying on (the cluster
    restarts), or the failed worker has used its job.max_worker_restarts (`alone`: the run's
    restarts by itself so far) or failed in a way a restart repeats (a usage or import error,
    a permanent exit code): that failure is then the run's (worker_budget_spent says why)."""
    if job.strategy != STRATEGY_PS:
        return None
    if any(w.role in (ROLE_CHIEF, ROLE_PS) and w.state not in CARRYING_ON
           for w in status.workers):  # fmt: skip
        return None
    used = alone_counts(alone)
    for index, worker in enumerate(status.workers):
        if worker.role != ROLE_WORKER or worker.state is not WorkerState.FAILED:
            continue
        failure = worker_failure(worker)
        if used.get(worker.name, 0) >= job.max_worker_restarts:
            continue
        if permanent_reason(failure, None, job.permanent_exit_codes) is None:
            return index
    return None


def worker_budget_spent(
    failure: Failure, role: str, alone: tuple[Restart, ...], job: Job
) -> str | None:
    """Why a ParameterServerStrategy worker's failure ends the run, where it used all its
    restarts by itself (worker_restart left it failed); None for any other failure."""
    if job.strategy != STRATEGY_PS or role != ROLE_WORKER:
        return None
    used = alone_counts(alone).get(failure.worker, 0)
    if used < job.max_worker_restarts:
        return None
    if not used:
        return "max_worker_restarts is 0: a lost worker fails the run"
    return (f"it failed again after {used} restart(s) by itself (max_worker_restarts: "
            f"{job.max_worker_restarts})")  # fmt: skip


# Failures whose cause is on the worker's own host: a restart need not check the network first.
# After any other (peers lost, stalls, unknown crashes) it checks that the hosts reach each other.
HOST_LOCAL_FAILURES = frozenset({
    FailureKind.KILLED, FailureKind.PREEMPTED, FailureKind.EARLY_EXIT, FailureKind.USAGE,
    FailureKind.IMPORT_ERROR, FailureKind.KERAS_API, FailureKind.OUT_OF_MEMORY,
    FailureKind.DISK_FULL,
})  # fmt: skip


LINGER_ENV = "ORCHESTRATE_LINGER"  # job.linger where the inventory leaves it out (CI: 0)
DEFAULT_LINGER = 300


def linger_seconds(job: Job, environ: Mapping[str, str]) -> int:
    """How long a run's standbys stay after it ended: job.linger, else $ORCHESTRATE_LINGER,
    else 300 s. 0: none stay."""
    if job.linger is not None:
        return job.linger
    text = environ.get(LINGER_ENV)
    if text is None or not text.strip():
        return DEFAULT_LINGER
    if not text.strip().isdigit() or int(text) > 86400:
        raise InventoryError(
            [Problem(f"${LINGER_ENV}", None, "", f"expected 0 to 86400 (seconds), got {text!r}")],
            hint=f"set {LINGER_ENV} to a number of seconds, or job.linger in the inventory",
        )
    return int(text)


WARM_RESTARTS_ENV = "ORCHESTRATE_WARM_RESTARTS"  # job.warm_restarts where it is left out (CI: 0)


def with_warm_default(inventory: Inventory, environ: Mapping[str, str]) -> Inventory:
    """The inventory with job.warm_restarts from $ORCHESTRATE_WARM_RESTARTS (0 or 1) where the
    inventory leaves it out; unset or empty: as the inventory says (on for `task:`). Resolved
    once, at `up`: the run's record keeps the value, so its supervisors and restarts agree."""
    text = environ.get(WARM_RESTARTS_ENV, "").strip()
    if inventory.job.warm_restarts is not None or not text or inventory.job.keras == KERAS_JAX:
        return inventory  # a keras: jax host has no TensorFlow for a standby to import
    if text not in ("0", "1"):
        raise InventoryError(
            [Problem(f"${WARM_RESTARTS_ENV}", None, "", f"expected 0 or 1, got {text!r}")],
            hint=f"set {WARM_RESTARTS_ENV} to 0 or 1, or job.warm_restarts in the inventory",
        )
    return replace(inventory, job=replace(inventory.job, warm_restarts=text == "1"))


def backoff(job: Job, restarts_so_far: int) -> float:
    return float(min(MAX_BACKOFF, job.restart_backoff * 2**restarts_so_far))


def conclude(final: RunStatus, record: RunRecord) -> str:
    """The line that reports a successful run; JobFailed saying why for any other ending."""
    if final.state is WorkerState.SUCCEEDED:
        reported = [w.step for w in final.workers if w.step is not None]
        steps = max(reported) if reported else "? (no worker reported a step)"
        restarts = f" after {len(record.restarts)} restart(s)" if record.restarts else ""
        chief = final.workers[0]
        evaluated = ""
        if chief.val_accuracy is not None:  # the final evaluation, over the whole eval split
            # val_loss may be unknown where val_accuracy is not (a NaN loss reads as absent).
            loss = "-" if chief.val_loss is None else f"{chief.val_loss:.4g}"
            evaluated = f"; val_loss {loss} val_accuracy {chief.val_accuracy:.3f}"
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
    shown = excerpt(worker.log_tail)
    if shown:
        lines.append(f"last lines of {worker.name}'s log:")
        lines.extend(f"  {line}" for line in shown)
    return "\n".join(lines)


def give_up_message(
    failure: Failure, log_tail: tuple[str, ...], why: str, restarts: int, role: str = "worker"
) -> str:
    step = f"at step {failure.step}" if failure.step is not None else "before its first step"
    who = failure.worker if role == "worker" else f"{failure.worker} (the {role})"
    lines = [
        f"the run failed for good after {restarts} restart(s) because {why}.",
        f"the worker that failed first: {who} {step}: {failure.reason}",
    ]
    advice = explain(failure.kind, log_tail)
    if advice:
        lines.append(f"what to do: {advice}")
    shown = excerpt(log_tail, len(log_tail))
    if shown:
        lines.append(f"last lines of {failure.worker}'s log:")
        lines.extend(f"  {line}" for line in shown)
    return "\n".join(lines)

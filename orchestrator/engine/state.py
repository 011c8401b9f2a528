"""Worker and run states, computed from what the worker and its supervisor wrote. Pure.

A worker moves  pending → starting → running → succeeded | failed | stopped.
  pending    its supervisor has not been started (no pid file yet), or a scheduler still
             holds it in its queue (Slurm PENDING: not watched for stalls until it runs)
  starting   the supervisor is alive, the worker has not reported progress yet (TF importing,
             waiting for its peers)
  running    alive and has reported progress
  succeeded  exited 0
  failed     exited non-zero, or its supervisor vanished without recording an exit
  stopped    ended after `orchestrate down` asked it to, or preempted: SIGTERM made the cluster
             save a checkpoint and exit (the worker's exit code 75)
  unknown    its host could not be asked
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from orchestrator.contract import EXIT_PREEMPTED
from orchestrator.model.answers import WorkerProbe


class WorkerState(str, Enum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    UNKNOWN = "unknown"

    @property
    def finished(self) -> bool:
        return self in (WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED)


ACTIVE = (WorkerState.PENDING, WorkerState.STARTING, WorkerState.RUNNING)


@dataclass(frozen=True)
class Classification:
    state: WorkerState
    reason: str | None = None


def classify(probe: WorkerProbe | None) -> Classification:
    """One worker's state from the agent's probe of its run directory (None: host unreachable)."""
    if probe is None:
        return Classification(WorkerState.UNKNOWN, "host did not answer")
    exit_record = probe.exit
    if exit_record is not None:
        code = exit_record.returncode
        if code == 0:
            short = _short_of_target(probe)
            return (
                Classification(WorkerState.FAILED, short)
                if short
                else Classification(WorkerState.SUCCEEDED)
            )
        if probe.stop_requested:
            return Classification(WorkerState.STOPPED, "stopped by orchestrate down")
        if code == EXIT_PREEMPTED:
            return Classification(WorkerState.STOPPED, "preempted: saved a checkpoint and exited")
        how = f"killed by {exit_record.signal}" if exit_record.signal else f"exit {code}"
        return Classification(WorkerState.FAILED, _with_error(how, exit_record.error))
    if probe.queued is not None:  # not started, and no fault of the worker: no stall clock yet
        return Classification(
            WorkerState.PENDING, f"waiting in the scheduler's queue ({probe.queued})"
        )
    if probe.alive:
        if probe.progress is not None:
            return Classification(WorkerState.RUNNING)
        return Classification(WorkerState.STARTING)
    if probe.stop_requested:
        return Classification(WorkerState.STOPPED, "stopped by orchestrate down")
    if not probe.exists or probe.pid is None:
        return Classification(WorkerState.PENDING)
    return Classification(WorkerState.FAILED, "process vanished without recording an exit")


def _short_of_target(probe: WorkerProbe) -> str | None:
    """Exit 0 below the step the worker itself reported as its target is no success: the job
    did not finish (a script that returned early, a loop that broke out)."""
    progress = probe.progress
    if progress is None or not progress.target_steps or progress.step is None:
        return None
    if progress.step >= progress.target_steps:
        return None
    return (
        f"exited 0 at step {progress.step} of {progress.target_steps}: "
        "it stopped before its target step"
    )


def _with_error(how: str, error: str | None) -> str:
    return f"{how}: {error}" if error else how


def overall(states: Iterable[WorkerState]) -> WorkerState:
    """One state for the run: failed as soon as any worker failed, succeeded when all did."""
    states = list(states)
    if not states:
        return WorkerState.UNKNOWN
    for state in (WorkerState.FAILED, WorkerState.UNKNOWN):
        if state in states:
            return state
    if all(s is WorkerState.SUCCEEDED for s in states):
        return WorkerState.SUCCEEDED
    if any(s in ACTIVE for s in states):
        if WorkerState.RUNNING in states:
            return WorkerState.RUNNING
        return WorkerState.STARTING if WorkerState.STARTING in states else WorkerState.PENDING
    return WorkerState.STOPPED

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

from orchestrator.contract import EXIT_PREEMPTED
from orchestrator.engine.observe.failures import NEVER_JOINED
from orchestrator.model.answers import BY_DOWN, WorkerProbe
from orchestrator.model.vocabulary import ACTIVE, FailureKind, WorkerState


@dataclass(frozen=True)
class Classification:
    state: WorkerState
    reason: str | None = None
    # The failure's kind where the exit code alone does not tell it (an exit 0 that failed).
    kind: FailureKind | None = None


@dataclass(frozen=True)
class Expectation:
    """What the job asks of a worker that exits 0: the step it must reach (a script job's
    `steps:`; None: the target the worker itself reports, if any) and whether it is one of
    several workers, which must all join one cluster; an evaluator (role: evaluator) ends
    when it is stopped, at whatever checkpoint it had evaluated, and that is no failure."""

    target_steps: int | None = None
    cluster: bool = False
    evaluator: bool = False


def classify(probe: WorkerProbe | None, expect: Expectation | None = None) -> Classification:
    """One worker's state from the agent's probe of its run directory (None: host unreachable)."""
    if probe is None:
        return Classification(WorkerState.UNKNOWN, "host did not answer")
    exit_record = probe.exit
    if exit_record is not None:
        code = exit_record.returncode
        if code == 0:
            return _exited_zero(probe, expect or Expectation())
        if probe.stop_requested:
            return _stopped(probe)
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
        return _stopped(probe)
    if not probe.exists or probe.pid is None:
        return Classification(WorkerState.PENDING)
    return Classification(WorkerState.FAILED, "process vanished without recording an exit")


def _stopped(probe: WorkerProbe) -> Classification:
    return Classification(WorkerState.STOPPED, f"stopped {probe.stopped_by or BY_DOWN}")


def _exited_zero(probe: WorkerProbe, expect: Expectation) -> Classification:
    """Exit 0 is a success unless the worker never joined its multi-worker cluster (it trained
    alone), or stopped below the job's target (a script's `steps:`: once it reported a step; a
    script that reports none is not checked) or below the target it reported itself."""
    failed = WorkerState.FAILED
    if expect.evaluator and probe.stop_requested:
        return _stopped(probe)
    if expect.cluster and probe.exit is not None and probe.exit.joined is False:
        return Classification(failed, NEVER_JOINED, FailureKind.LEFT_EARLY)
    bad = _bad_progress(probe)
    if bad:
        return Classification(failed, bad, FailureKind.BAD_PROGRESS)
    step = probe.progress.step if probe.progress else None
    if expect.target_steps and step is not None and step < expect.target_steps:
        return Classification(
            failed, f"stopped at step {step} of {expect.target_steps}", FailureKind.STOPPED_SHORT
        )
    short = None if expect.target_steps else _short_of_target(probe)
    if short:
        return Classification(failed, short, FailureKind.EARLY_EXIT)
    return Classification(WorkerState.SUCCEEDED)


def _bad_progress(probe: WorkerProbe) -> str | None:
    """What makes an exit 0 unprovable: the worker's last progress gave a step that is no step
    number (NaN, a string, an absurd number: read as absent, it ended as "succeeded at step 0").
    A NaN loss alone is the training's own business (the step says how far it got)."""
    progress = probe.progress
    if progress is None or progress.fields.get("step") is None or progress.step is not None:
        return None
    return f"exited 0 with a step of {str(progress.fields['step'])[:40]!r}: no step number"


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

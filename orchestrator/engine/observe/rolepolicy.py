"""What the hosts' roles mean for a run, as pure decisions over its status.

The evaluator (role: evaluator) is beside the training: its failure is not the run's (the
supervisor restarts it alone, a bounded number of times), it is not watched for stalls (it waits
for checkpoints), and a run whose training succeeded waits for it to finish. Under
ParameterServerStrategy (job.strategy: parameter-server) the run is the chief's: its exit 0 ends
the training (the ps and workers, which serve until stopped, are then stopped and count as
stopped), and only its steps count for stall detection. The loader puts the chief first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from orchestrator.engine.observe.state import overall
from orchestrator.model.inventory import ROLE_CHIEF, ROLE_EVALUATOR, ROLE_PS, ROLE_WORKER
from orchestrator.model.vocabulary import WorkerState

# How often an evaluator that failed is started again, alone, before it is left failed.
EVALUATOR_RESTARTS = 3

# Who stopped a ParameterServerStrategy chief's ps and workers, as their status says it.
STOPPED_AFTER_CHIEF = "after the chief finished"


def labelled(name: str, role: str) -> str:
    """A worker's name for people, with its role where it is not a plain worker."""
    return name if role == ROLE_WORKER else f"{name} ({role})"


def run_state(workers: Iterable[tuple[str, WorkerState]]) -> WorkerState:
    """One state for the run from its workers' (role, state), in the run's order (the chief
    first): the training's, then the evaluator's where it decides."""
    pairs = list(workers)
    training = [state for role, state in pairs if role != ROLE_EVALUATOR]
    evaluator = [state for role, state in pairs if role == ROLE_EVALUATOR]
    chief = [state for role, state in pairs if role == ROLE_CHIEF]
    if chief and chief[0] is WorkerState.SUCCEEDED:  # the ps and workers serve until stopped
        done = all(state.finished for state in training)
        state = WorkerState.SUCCEEDED if done else WorkerState.RUNNING
    else:
        state = overall(training)
    if not evaluator:
        return state
    if state is WorkerState.SUCCEEDED and not evaluator[0].finished:
        return WorkerState.RUNNING  # the final checkpoint's evaluation
    return state


def serving(workers: Iterable[tuple[str, WorkerState]]) -> list[int]:
    """The positions of the ParameterServerStrategy ps and workers that show `running` though
    they report no progress: they serve the chief's closures and write no steps, so while the
    chief trains, alive (`starting`) is running."""
    pairs = list(workers)
    chief = [state for role, state in pairs if role == ROLE_CHIEF]
    if not chief or chief[0] is not WorkerState.RUNNING:
        return []
    return [i for i, (role, state) in enumerate(pairs)
            if role in (ROLE_PS, ROLE_WORKER) and state is WorkerState.STARTING]  # fmt: skip


def chief_succeeded(workers: Iterable[tuple[str, WorkerState]]) -> bool:
    """Whether a ParameterServerStrategy chief exited 0: the training is over."""
    return any(role == ROLE_CHIEF and state is WorkerState.SUCCEEDED for role, state in workers)


def training(workers: Iterable[tuple[str, WorkerState]]) -> list[int]:
    """The positions of the workers whose failures and stalls are the run's: not the
    evaluator; under ParameterServerStrategy once the chief exited 0, none."""
    pairs = list(workers)
    if chief_succeeded(pairs):
        return []
    return [i for i, (role, _) in enumerate(pairs) if role != ROLE_EVALUATOR]


def watched(workers: Iterable[tuple[str, WorkerState]]) -> list[int]:
    """The positions of the workers whose steps count for stall detection: the chief alone
    where there is one (ParameterServerStrategy), else every training worker."""
    pairs = list(workers)
    chiefs = [i for i in training(pairs) if pairs[i][0] == ROLE_CHIEF]
    return chiefs or training(pairs)


def to_stop(workers: Iterable[tuple[str, WorkerState]]) -> list[int]:
    """The positions of the training tasks left running once the chief exited 0."""
    pairs = list(workers)
    if not chief_succeeded(pairs):
        return []
    return [i for i, (role, state) in enumerate(pairs)
            if role != ROLE_EVALUATOR and not state.finished]  # fmt: skip


def evaluator_restart(workers: Iterable[tuple[str, WorkerState]], restarted: int) -> int | None:
    """The position of a failed evaluator to start again alone while the training goes on,
    if it has restarts left."""
    pairs = list(workers)
    training_state = run_state([p for p in pairs if p[0] != ROLE_EVALUATOR])
    if training_state.finished or restarted >= EVALUATOR_RESTARTS:
        return None
    return next((i for i, (role, state) in enumerate(pairs)
                 if role == ROLE_EVALUATOR and state is WorkerState.FAILED), None)  # fmt: skip


def stop_order(roles: Sequence[str]) -> list[list[int]]:
    """The positions to stop, in turn, from the workers' roles: under ParameterServerStrategy
    the chief first (a SIGTERM makes it save a checkpoint, reading the variables from the ps,
    which must still serve), then the others; else all at once."""
    chief = [i for i, role in enumerate(roles) if role == ROLE_CHIEF]
    rest = [i for i, role in enumerate(roles) if role != ROLE_CHIEF]
    return [group for group in (chief, rest) if group] if chief else [rest]

"""Which earlier run's tracking run an `up` resumes (job.tracking, docs/tracking.md).

A run stopped by `down --save`, or one that failed and is started again, goes on from its
checkpoint: to the user it is one training, and its history belongs in one tracker run. The
checkpoint's owner knows which run wrote it, and the controller knows that owner: the run
records of this state directory. So the identity is not written anywhere new; it is read back
from the record of the job's latest run here, and carried when

- that run did not succeed (its last attempt did not end `finished`): a finished training
  started again is a new one;
- it has a tracking identity, for the same tracker (the same MLflow server and experiment, the
  same W&B project and entity: each tracker is carried on its own);
- its chief wrote its checkpoints where this run's chief reads them (the same machine, the
  same directory), and that directory holds a checkpoint now: this `up` resumes from it. One
  deleted, or another directory, and the training starts afresh: a new tracker run.

A later `up` of a run that resumed carries the same identity again, so a chain of them is one
tracker run. Records of other state directories are not looked at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from orchestrator.backends.capabilities import Files, Lifecycle
from orchestrator.engine.store.checkpoints import checkpoint_step
from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import OrchestrateError
from orchestrator.model.inventory import Inventory, Tracking, WorkerSlot
from orchestrator.model.records import RunRecord
from orchestrator.model.vocabulary import AttemptEnd
from orchestrator.model.workers import checkpoint_dir, job_dir


@dataclass(frozen=True)
class Resumed:
    """The tracking identity an `up` carries on, and where it comes from."""

    tracking: Tracking  # the new run's settings with the earlier run's identity
    run_id: str  # the earlier orchestrate run
    checkpoint: str  # the checkpoint this `up` resumes from


def carried(wanted: Tracking, earlier: Tracking | None, restarts: int) -> Tracking | None:
    """`wanted` (the new run's settings) with the identity of `earlier` for each tracker whose
    settings are the same; None when neither is. `restarts`: the earlier run's restarts of the
    cluster, so the resumed run's restart tags number on (restarts_before). Pure."""
    if earlier is None:
        return None
    tracking = wanted
    same_mlflow = (wanted.mlflow is not None and earlier.mlflow_run_id is not None
                   and (wanted.mlflow, wanted.experiment)
                   == (earlier.mlflow, earlier.experiment))  # fmt: skip
    if same_mlflow:
        tracking = replace(tracking, mlflow_run_id=earlier.mlflow_run_id,
                           mlflow_experiment_id=earlier.mlflow_experiment_id)  # fmt: skip
    same_wandb = (wanted.wandb_project is not None and earlier.wandb_run_id is not None
                  and (wanted.wandb_project, wanted.wandb_entity)
                  == (earlier.wandb_project, earlier.wandb_entity))  # fmt: skip
    if same_wandb:
        tracking = replace(tracking, wandb_run_id=earlier.wandb_run_id)
    if not (same_mlflow or same_wandb):
        return None
    return replace(tracking, restarts_before=earlier.restarts_before + restarts)


def succeeded(record: RunRecord) -> bool:
    """Whether the run's last attempt ended with every worker done (the run's success)."""
    return bool(record.attempts) and record.attempts[-1].end == AttemptEnd.FINISHED


def same_machine(one: WorkerSlot, other: WorkerSlot) -> bool:
    return (one.address, one.connection, one.settings) == (
        other.address, other.connection, other.settings)  # fmt: skip


def latest_of_job(store: RunStore, job: str) -> RunRecord | None:
    """The newest readable record of job `job` in this state directory."""
    for record in _newest_first(store):
        if record.job_name == job:
            return record
    return None


def _newest_first(store: RunStore) -> Iterator[RunRecord]:
    for run_id in reversed(store.run_ids()):
        try:
            yield store.load(run_id)
        except OrchestrateError:  # a damaged record is no run to resume
            continue


def resumed_tracking(
    store: RunStore,
    lifecycle: Lifecycle,
    files: Files,
    inventory: Inventory,
    say: Callable[[str], None],
) -> Resumed | None:
    """The tracking identity this `up` resumes (the module's rules), or None: a new one."""
    wanted = inventory.job.tracking
    if wanted is None or not inventory.hosts:
        return None
    earlier = latest_of_job(store, inventory.job.name)
    if earlier is None or succeeded(earlier) or not earlier.workers:
        return None
    tracking = carried(wanted, earlier.inventory.job.tracking, len(earlier.restarts))
    if tracking is None:
        return None
    chief, wrote = inventory.hosts[0], earlier.workers[0]
    try:
        workdir = lifecycle.workdirs([chief]).raise_if_failed("reaching the chief")[chief.name]
        directory = checkpoint_dir(inventory.job, job_dir(inventory.job, workdir))
        if not same_machine(chief, wrote.host) or directory != wrote.checkpoint_dir:
            return None
        latest = files.checkpoint(chief, directory).latest
    except OrchestrateError as error:  # the start says what is wrong with the chief
        say(f"tracking: not resuming run {earlier.run_id}'s tracking run: {error.message}")
        return None
    if latest is None or checkpoint_step(latest) <= 0:
        return None
    return Resumed(tracking, earlier.run_id, latest)

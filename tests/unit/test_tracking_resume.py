"""Which earlier run's tracking run an `up` resumes (engine/trackers/trackresume.py, issue 58): a
real state directory of run records and the real local backend reading a real checkpoint directory;
no tracker is reached (the MLflow side runs against a real server in
tests/integration/test_tracking.py)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.backends.registry import load_inventory, open_backend
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.trackers.trackresume import carried, resumed_tracking
from orchestrator.engine.workers.plan import plan_workers
from orchestrator.model.inventory import Inventory, Tracking
from orchestrator.model.records import Attempt, RunRecord, WorkerRecord
from orchestrator.model.vocabulary import AttemptEnd

SETTINGS = Tracking(mlflow="http://m:5000", experiment="e", wandb_project="p")
EARLIER = replace(SETTINGS, mlflow_run_id="abc", mlflow_experiment_id="7", wandb_run_id="w1")
INVENTORY = """\
defaults: {connection: local, workdir: ./work}
hosts:
  - {name: w0, address: localhost, port: 23456}
  - {name: w1, address: localhost, port: 23457}
job:
  name: demo
  task: worker.examples.shapes:task
  steps: 50
  tracking: {mlflow: 'http://m:5000', experiment: e, wandb: {project: p}}
"""


def test_each_tracker_is_carried_only_with_the_same_settings() -> None:
    both = carried(SETTINGS, EARLIER, restarts=2)
    assert both == replace(EARLIER, restarts_before=2)
    # Restarts add up along a chain of resumed runs.
    assert carried(SETTINGS, replace(EARLIER, restarts_before=3), 1).restarts_before == 4  # type: ignore[union-attr]
    other_experiment = carried(replace(SETTINGS, experiment="f"), EARLIER, 0)
    assert other_experiment is not None
    assert other_experiment.mlflow_run_id is None and other_experiment.wandb_run_id == "w1"
    other_project = carried(replace(SETTINGS, wandb_project="q"), EARLIER, 0)
    assert other_project is not None
    assert other_project.mlflow_run_id == "abc" and other_project.wandb_run_id is None
    assert carried(SETTINGS, None, 0) is None
    assert carried(SETTINGS, SETTINGS, 0) is None  # the earlier run reached no tracker
    assert carried(Tracking(mlflow="http://other:5000"), EARLIER, 0) is None


class StateDir:
    """A state directory with the inventory's earlier runs, as `up` leaves them."""

    def __init__(self, tmp_path: Path) -> None:
        (tmp_path / "inv.yaml").write_text(INVENTORY)
        self.inventory: Inventory = load_inventory(tmp_path / "inv.yaml")
        self.store = RunStore(tmp_path / ".orchestrate")
        self.said: list[str] = []

    def add_run(
        self, run_id: str, end: AttemptEnd | None, inventory: Inventory | None = None
    ) -> RunRecord:
        inventory = inventory or self.inventory
        inventory = replace(inventory, job=replace(inventory.job, tracking=EARLIER))
        with open_backend(inventory) as backend:
            workdirs = backend.workdirs(inventory.hosts).raise_if_failed("workdirs")
            specs = plan_workers(inventory, run_id, dict(workdirs),
                                 reads_in_place=backend.reads_in_place)  # fmt: skip
        workers = tuple(WorkerRecord(s.name, s.index, s.host, s.run_dir, s.log_path,
                                     s.checkpoint_dir) for s in specs)  # fmt: skip
        attempt = Attempt(0, time.time(), ended_at=time.time(), end=end)
        record = RunRecord(run_id=run_id, inventory=inventory, created_at=time.time(),
                           workers=workers, attempts=(attempt,))  # fmt: skip
        self.store.save(record)
        return record

    def resumed(self, inventory: Inventory | None = None) -> Tracking | None:
        inventory = inventory or self.inventory
        with open_backend(inventory) as backend:
            found = resumed_tracking(self.store, backend, backend, inventory, self.said.append)
        return found.tracking if found else None


def checkpoint(directory: str, step: int) -> None:
    """A checkpoint as TensorFlow leaves it: its files and the state file naming it."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"ckpt-{step}.index").write_bytes(b"i")
    (path / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"d")
    (path / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n'
                                     f'all_model_checkpoint_paths: "ckpt-{step}"\n')  # fmt: skip


@pytest.mark.parametrize("end", [AttemptEnd.STOPPED, AttemptEnd.CRASHED, None])
def test_an_up_on_the_checkpoint_of_a_run_that_did_not_succeed_resumes_it(
    tmp_path: Path, end: AttemptEnd | None
) -> None:
    state = StateDir(tmp_path)
    earlier = state.add_run("20260101-000000-aaaa", end)
    assert state.resumed() is None  # no checkpoint yet: this `up` starts afresh
    checkpoint(earlier.workers[0].checkpoint_dir, 40)
    assert state.resumed() == EARLIER
    # Other ports (a lease, a new inventory) and more steps: the same training, resumed.
    moved = replace(state.inventory, job=replace(state.inventory.job, steps=500))
    moved = replace(moved, hosts=tuple(replace(h, port=h.port + 100) for h in moved.hosts))
    assert state.resumed(moved) == EARLIER


def test_a_succeeded_run_another_checkpoint_directory_or_job_start_a_new_one(
    tmp_path: Path,
) -> None:
    state = StateDir(tmp_path)
    done = state.add_run("20260101-000000-aaaa", AttemptEnd.FINISHED)
    checkpoint(done.workers[0].checkpoint_dir, 50)
    assert state.resumed() is None  # a finished training started again is a new one
    state.add_run("20260101-000001-bbbb", AttemptEnd.STOPPED)
    assert state.resumed() == EARLIER  # the latest run of the job counts
    elsewhere = replace(state.inventory, job=replace(state.inventory.job, checkpoint_dir="c2"))
    assert state.resumed(elsewhere) is None
    other_job = replace(state.inventory, job=replace(state.inventory.job, name="other"))
    assert state.resumed(other_job) is None
    untracked = replace(state.inventory, job=replace(state.inventory.job, tracking=None))
    assert state.resumed(untracked) is None


def test_a_damaged_record_is_passed_over(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    earlier = state.add_run("20260101-000000-aaaa", AttemptEnd.STOPPED)
    checkpoint(earlier.workers[0].checkpoint_dir, 40)
    (state.store.root / "runs" / "20260101-000001-bbbb.json").write_text("{not json")
    assert state.resumed() == EARLIER

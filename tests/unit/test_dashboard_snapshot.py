"""The status snapshot the dashboard reads: to_json read back typed, old and odd files too."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.engine.observe.snapshot import read_snapshot, write_snapshot
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.engine.store.runstore import RunStore
from orchestrator.model.records import Restart, SchedulerState
from orchestrator.model.vocabulary import WorkerState

# Every field set, none to its default: a field from_json forgot would not read back.
CHIEF = WorkerStatus(
    name="chief", index=0, host="node1", state=WorkerState.FAILED, reason="exit 1", pid=101,
    step=40, target_steps=100, loss=0.25, accuracy=0.5, checkpoint_step=30, steps_per_sec=2,
    val_loss=0.75, val_accuracy=0.625, uptime=12.5, cpu_percent=99.5, rss_bytes=1 << 30,
    exit_code=1, finished_at=20.0, devices=("/GPU:0",), log_tail=("Traceback",),
    note="resumed from step 30", failure_kind="oom", hint="use less memory", queued=True,
    start_step=30,
)  # fmt: skip
RESTARTS = (
    Restart(at=1.0, attempt=0, worker="chief", reason="exit 1", step=3),
    Restart(at=2.5, attempt=1, worker="worker1", reason="killed", step=None, kind="oom"),
)
QUEUED = SchedulerState(scheduler="slurm", state="PENDING", jobs=("7",), login="login1",
                        reason="Priority")  # fmt: skip
RUNNING = SchedulerState(scheduler="slurm", state="RUNNING", jobs=("7", "8"), job_id="8",
                         exit_code=0, signal=9, nodes="n[1-2]")  # fmt: skip


def run(**fields: object) -> RunStatus:
    base = RunStatus(run_id="r1", job="demo", state=WorkerState.FAILED, workers=(CHIEF,))
    return replace(base, **fields)  # type: ignore[arg-type]


def test_a_worker_reads_back_as_written_but_its_log() -> None:
    written = json.loads(json.dumps(CHIEF.to_json()))
    assert WorkerStatus.from_json(written) == replace(CHIEF, log_tail=())


@pytest.mark.parametrize(
    "status",
    [run(), run(attempt=2, restarts=RESTARTS, outcome="gave up"), run(scheduler=QUEUED),
     run(scheduler=RUNNING, state=WorkerState.RUNNING, workers=())],
)  # fmt: skip
def test_a_status_reads_back_to_the_same_document(status: RunStatus) -> None:
    document = json.loads(json.dumps(status.to_json()))
    read = RunStatus.from_json(document)
    assert read is not None and json.loads(json.dumps(read.to_json())) == document
    assert json.dumps(read.to_json()) == json.dumps(status.to_json())  # byte for byte
    assert read.scheduler == status.scheduler and read.attempt == status.attempt


def test_only_the_count_and_the_last_restart_come_back() -> None:
    read = RunStatus.from_json(run(restarts=RESTARTS).to_json())
    assert read is not None and len(read.restarts) == 2 and read.restarts[-1] == RESTARTS[-1]


def test_a_snapshot_of_an_older_orchestrate_takes_the_defaults() -> None:
    # As the first dashboard's supervisor wrote it: no val_*, note, failure_kind, hint, queued,
    # start_step, scheduler; a restart without a kind.
    old = {
        "run_id": "r1", "job": "demo", "state": "failed", "attempt": 1, "restarts": 1,
        "last_restart": {"at": 5.0, "attempt": 0, "worker": "chief", "reason": "x", "step": 3},
        "outcome": None,
        "workers": [{"name": "chief", "index": 0, "host": "h", "state": "failed", "reason": "x",
                     "pid": 1, "step": 3, "target_steps": 10, "loss": 2.5, "accuracy": None,
                     "checkpoint_step": None, "steps_per_sec": 1.5, "uptime": 4.0,
                     "cpu_percent": None, "rss_bytes": None, "exit_code": 1, "finished_at": 9.0,
                     "devices": []}],
    }  # fmt: skip
    read = RunStatus.from_json(old)
    assert read is not None and read.scheduler is None and read.attempt == 1
    assert read.restarts == (Restart(at=5.0, attempt=0, worker="chief", reason="x", step=3),)
    (chief,) = read.workers
    assert (chief.step, chief.loss, chief.finished_at) == (3, 2.5, 9.0)
    assert (chief.queued, chief.start_step, chief.val_loss, chief.hint) == (False, None, None, None)
    assert RunStatus.from_json({"run_id": "r1", "job": "demo", "state": "running"}) == RunStatus(
        run_id="r1", job="demo", state=WorkerState.RUNNING, workers=()
    )


def test_wrong_types_read_as_absent() -> None:
    worker = {**CHIEF.to_json(), "loss": "nan", "step": 1.5, "queued": "yes", "devices": "gpu",
              "pid": True, "reason": 7}  # fmt: skip
    read = WorkerStatus.from_json(worker)
    assert read is not None
    assert (read.loss, read.step, read.queued, read.devices, read.pid, read.reason) == (
        None, None, False, (), None, None,
    )  # fmt: skip
    odd_workers: list[object] = [{**worker, "name": None}, {**worker, "state": "asleep"}, [], None]
    assert [WorkerStatus.from_json(w) for w in odd_workers] == [None] * 4
    document = {**run().to_json(), "workers": [{"name": "x"}, CHIEF.to_json(), 3]}
    read_run = RunStatus.from_json({**document, "scheduler": {"state": 1}, "restarts": "2"})
    assert read_run is not None and [w.name for w in read_run.workers] == ["chief"]
    assert read_run.scheduler is None and read_run.restarts == ()
    odd_runs: list[object] = [{**document, "state": None}, {**document, "run_id": 1}, {}, "x"]
    assert [RunStatus.from_json(r) for r in odd_runs] == [None] * 4


def test_read_snapshot_answers_what_write_snapshot_wrote(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    status = run(restarts=RESTARTS[:1], scheduler=RUNNING)
    assert read_snapshot(store, "r1") is None
    write_snapshot(store, status)
    snapshot = read_snapshot(store, "r1")
    assert snapshot is not None and snapshot.pid == os.getpid() and snapshot.written_at > 0
    assert snapshot.status == replace(status, workers=(replace(CHIEF, log_tail=()),))


@pytest.mark.parametrize(
    "text",
    ["{", "[]", '{"written_at": 1}', '{"status": null}', '{"status": {}}',
     '{"status": {"run_id": "r1", "job": "demo", "state": "bogus"}}'],
)  # fmt: skip
def test_a_snapshot_without_a_readable_status_is_none(tmp_path: Path, text: str) -> None:
    store = RunStore(tmp_path)
    store.write_file(store.snapshot_path("r1"), text)
    assert read_snapshot(store, "r1") is None


def test_odd_times_and_pids_read_as_unknown(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    document = {"written_at": "now", "pid": "12", "status": run().to_json()}
    store.write_file(store.snapshot_path("r1"), json.dumps(document))
    snapshot = read_snapshot(store, "r1")
    assert snapshot is not None and (snapshot.written_at, snapshot.pid) == (0.0, None)

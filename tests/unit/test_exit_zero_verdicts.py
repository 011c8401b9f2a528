"""An exit 0 that is no success (issue 28): a script job's `steps:` is its target ("stopped
short"), and a worker of a multi-worker job that never listened on its TensorFlow port never
joined the cluster. Pure decisions, and the supervisor's verdict on a fake backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.contract import TARGET_STEPS_ENV
from orchestrator.engine.observe.failures import DETERMINISTIC, HINTS, MEANINGS, NEVER_JOINED
from orchestrator.engine.observe.state import Expectation, classify
from orchestrator.engine.workers.plan import plan_workers
from orchestrator.model.answers import WorkerProbe
from orchestrator.model.vocabulary import FailureKind, WorkerState
from tests.fakes.backend import FakeBackend, exited, running
from tests.unit.test_supervisor_with_fake_backend import inventory, supervise
from worker.helpers import target_steps


def exit_probe(step: int | None, *, joined: bool | None = None, target: int | None = None
               ) -> WorkerProbe:  # fmt: skip
    record: dict[str, Any] = {"returncode": 0}
    if joined is not None:
        record["joined"] = joined
    progress = None if step is None else {"step": step, "target_steps": target}
    return WorkerProbe.parse({"exists": True, "pid": 1, "exit": record, "progress": progress}, 0.0)


def test_a_scripts_steps_is_its_target_once_it_reported_a_step() -> None:
    expect = Expectation(target_steps=300)
    short = classify(exit_probe(5), expect)
    assert (short.state, short.reason, short.kind) == (
        WorkerState.FAILED, "stopped at step 5 of 300", FailureKind.STOPPED_SHORT)  # fmt: skip
    assert classify(exit_probe(300), expect).state is WorkerState.SUCCEEDED
    assert classify(exit_probe(301), expect).state is WorkerState.SUCCEEDED
    # A script that reports no step is not checked.
    assert classify(exit_probe(None), expect).state is WorkerState.SUCCEEDED
    # The job's target wins over the one the script reports.
    assert classify(exit_probe(5, target=5), expect).kind is FailureKind.STOPPED_SHORT


def test_without_steps_the_scripts_own_target_applies_as_before() -> None:
    verdict = classify(exit_probe(5, target=10), Expectation())
    assert verdict.state is WorkerState.FAILED and verdict.kind is FailureKind.EARLY_EXIT
    assert "at step 5 of 10" in (verdict.reason or "")
    assert classify(exit_probe(10, target=10)).state is WorkerState.SUCCEEDED
    assert classify(exit_probe(5)).state is WorkerState.SUCCEEDED


def test_a_worker_that_never_listened_never_joined_a_multi_worker_cluster() -> None:
    cluster = Expectation(cluster=True)
    verdict = classify(exit_probe(10, joined=False), cluster)
    assert (verdict.state, verdict.reason, verdict.kind) == (
        WorkerState.FAILED, NEVER_JOINED, FailureKind.LEFT_EARLY)  # fmt: skip
    assert "MultiWorkerMirroredStrategy before any other TensorFlow op" in NEVER_JOINED
    assert classify(exit_probe(10, joined=True), cluster).state is WorkerState.SUCCEEDED
    # Not recorded (no TensorFlow loaded, an older agent): not checked.
    assert classify(exit_probe(10), cluster).state is WorkerState.SUCCEEDED
    # A one-worker job is exempt, even if the record says so.
    assert classify(exit_probe(10, joined=False), Expectation()).state is WorkerState.SUCCEEDED
    # Never joining is the cause even when the worker reached its target alone.
    both = Expectation(target_steps=10, cluster=True)
    assert classify(exit_probe(10, joined=False), both).kind is FailureKind.LEFT_EARLY


def test_the_new_kind_is_documented_and_not_retried() -> None:
    assert FailureKind.STOPPED_SHORT in MEANINGS and FailureKind.STOPPED_SHORT in HINTS
    assert {FailureKind.STOPPED_SHORT, FailureKind.LEFT_EARLY} <= DETERMINISTIC


def test_the_script_gets_its_target(tmp_path: Path) -> None:
    specs = plan_workers(inventory(tmp_path, steps=300), "run1", {"a": "/w", "b": "/w"},
                         reads_in_place=lambda host: False)  # fmt: skip
    assert {spec.env[TARGET_STEPS_ENV] for spec in specs} == {"300"}
    unset = plan_workers(inventory(tmp_path), "run1", {"a": "/w", "b": "/w"},
                         reads_in_place=lambda host: False)  # fmt: skip
    assert all(TARGET_STEPS_ENV not in spec.env for spec in unset)
    assert target_steps(env={TARGET_STEPS_ENV: "300"}) == 300
    assert target_steps(7, env={}) == 7
    assert target_steps(env={TARGET_STEPS_ENV: "x"}) is None


def never_joined(step: int) -> dict[str, Any]:
    probe = exited(0, step)
    probe["exit"]["joined"] = False
    return probe


@pytest.mark.parametrize(
    ("scripts", "steps", "kind", "reason"),
    [
        ({"a": [running(3), exited(0, 5)], "b": [running(3), exited(0, 5)]}, 300,
         FailureKind.STOPPED_SHORT, "stopped at step 5 of 300"),
        ({"a": [running(3), never_joined(10)], "b": [running(3), never_joined(10)]}, None,
         FailureKind.LEFT_EARLY, NEVER_JOINED),
    ],
)  # fmt: skip
def test_the_supervisor_ends_the_run_at_once_with_the_reason(
    tmp_path: Path, scripts: dict[str, Any], steps: int | None, kind: FailureKind, reason: str
) -> None:
    backend = FakeBackend(scripts={name: {0: states} for name, states in scripts.items()})
    store, outcome = supervise(tmp_path, backend, inventory(tmp_path, steps=steps))
    assert len(backend.started) == 1, "retried a failure that repeats on every restart"
    assert reason in str(outcome)
    record = store.load(store.current_id())
    assert record.outcome is not None and reason in record.outcome
    assert kind.value in record.outcome

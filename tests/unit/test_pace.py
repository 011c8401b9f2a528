"""The worker the others wait for, from the built-in loop's step timing: the pure decision, and
status, the stall's root cause and the JSON views naming it (real collect_status over a fake
backend's probes)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cli.render import problems
from orchestrator.contract import STEP_CALL_SECONDS, STEP_SECONDS
from orchestrator.engine.observe.pace import pace_outlier
from orchestrator.engine.observe.status import RunStatus, collect_status
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.policy import StallWatch
from orchestrator.engine.workers.lifecycle import start_run
from tests.fakes.backend import FakeBackend, running
from tests.unit.test_supervisor_with_fake_backend import inventory


def test_the_worker_whose_calls_return_soonest_is_the_one_the_others_wait_for() -> None:
    # a synchronous step of 0.1 s: b and c wait inside their calls for a, which spends 61 % of
    # its step outside (its host-side work)
    timings = {"a": (0.039, 0.1), "b": (0.095, 0.1), "c": (0.094, 0.1)}
    assert pace_outlier(timings) == (
        "a spends 61 % of each step outside its step calls: the other workers wait for it"
    )


def test_an_even_cluster_or_missing_figures_name_nobody() -> None:
    assert pace_outlier({"a": (0.09, 0.1), "b": (0.095, 0.1), "c": (0.08, 0.1)}) is None
    assert pace_outlier({"a": (0.01, 0.1)}) is None  # nothing to compare with
    assert pace_outlier({"a": (None, 0.1), "b": (0.09, None)}) is None  # a script's progress
    # shorter calls, but hardly any time outside them: dispatch jitter, not a wait
    assert pace_outlier({"a": (0.0008, 0.001), "b": (0.00095, 0.001)}) is None


def test_status_the_stall_and_the_snapshot_name_the_slow_worker(tmp_path: Path) -> None:
    slow = {STEP_CALL_SECONDS: 0.04, STEP_SECONDS: 0.1}
    even = {STEP_CALL_SECONDS: 0.095, STEP_SECONDS: 0.1}
    backend = FakeBackend(
        scripts={"a": {0: [running(40, **slow)]}, "b": {0: [running(40, **even)]}}
    )
    record = start_run(inventory(tmp_path), RunStore(tmp_path / "state"), backend)
    status = collect_status(record, backend, backend.scheduler)
    expected = "a spends 60 % of each step outside its step calls: the other workers wait for it"
    assert status.pace == expected
    assert f"pace: {expected}" in problems(status)
    document = status.to_json()
    assert document["pace"] == expected
    assert document["workers"][0][STEP_CALL_SECONDS] == 0.04
    again = RunStatus.from_json(document)  # the supervisor's snapshot, read back
    assert again is not None and again.pace == expected
    watch = StallWatch(timeout=30)
    assert watch.check(status, now=0) is None
    failure = watch.check(status, now=30)
    assert failure is not None and failure.reason.endswith(f"(before it: {expected})")

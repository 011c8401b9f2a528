"""Start-up is not a stall (issue 53): a worker that is still importing, waiting for its cluster
or tracing its first step has `start_timeout`; the stall clock (`stall_timeout`) runs from its
first step; the reason says which limit fired. The pure decision, and the key's validation."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.engine.supervision.policy import StallWatch
from orchestrator.errors import InventoryError
from orchestrator.model.inventory import DEFAULT_START_TIMEOUT, Job
from orchestrator.model.vocabulary import FailureKind, WorkerState


def worker(state: WorkerState, step: int | None = None, **fields: object) -> WorkerStatus:
    declared = dataclasses.fields(WorkerStatus)
    unset = {f.name: None for f in declared if f.default is dataclasses.MISSING}
    given = {"name": "other", "index": 1, "host": "h1", "state": state, "step": step}
    return WorkerStatus(**{**unset, "devices": (), "log_tail": (), **given, **fields})  # type: ignore[arg-type]


def run(*workers: WorkerStatus) -> RunStatus:
    return RunStatus("r1", "demo", WorkerState.RUNNING, workers)


STARTING = run(worker(WorkerState.STARTING))


def test_a_slow_start_within_start_timeout_is_no_stall_and_past_it_names_start_timeout() -> None:
    watch = StallWatch(timeout=30, start_timeout=300)
    assert watch.check(STARTING, now=0) is None
    assert watch.check(STARTING, now=31) is None  # past stall_timeout: still importing
    assert watch.check(STARTING, now=299) is None
    failure = watch.check(STARTING, now=300)
    assert failure is not None
    assert (failure.worker, failure.kind, failure.step) == ("other", FailureKind.STALLED, None)
    assert failure.reason == "no first step within start_timeout 300 s (it reported no progress)"


def test_the_start_step_written_before_the_first_step_does_not_restart_the_start_clock() -> None:
    # The built-in loop writes its start step (a resume: the checkpoint's) before its first
    # step: that is still start-up, counted from the worker's start.
    watch = StallWatch(timeout=30, start_timeout=120)
    at_start = run(worker(WorkerState.RUNNING, 40, start_step=40))
    assert watch.check(STARTING, now=0) is None
    assert watch.check(at_start, now=100) is None  # past stall_timeout since the write
    failure = watch.check(at_start, now=120)
    assert failure is not None and failure.step == 40
    assert failure.reason == (
        "no first step within start_timeout 120 s (it reported its start step 40 and none past it)"
    )


def test_after_the_first_step_stall_timeout_is_the_limit_and_is_named() -> None:
    watch = StallWatch(timeout=30, start_timeout=300)
    stepped = run(worker(WorkerState.RUNNING, 41, start_step=40))
    assert watch.check(STARTING, now=0) is None
    assert watch.check(stepped, now=200) is None  # its first step, late but within 300 s
    assert watch.check(stepped, now=229) is None
    failure = watch.check(stepped, now=230)
    assert failure is not None and failure.kind is FailureKind.STALLED
    assert failure.reason == "stalled: no progress for 30 s (stall_timeout) at step 41"


def test_a_worker_started_again_by_itself_gets_a_new_start_clock() -> None:
    # A ParameterServerStrategy worker restarted alone, or a Slurm launcher's restart in place:
    # it starts again long after the attempt began.
    watch = StallWatch(timeout=30, start_timeout=100)
    assert watch.check(STARTING, now=0) is None
    assert watch.check(run(worker(WorkerState.RUNNING, 5)), now=50) is None
    assert watch.check(STARTING, now=70) is None  # started again: no step yet
    assert watch.check(STARTING, now=169) is None
    failure = watch.check(STARTING, now=170)
    assert failure is not None and "start_timeout 100 s" in failure.reason


def test_a_host_that_does_not_answer_while_starting_has_stall_timeout() -> None:
    watch = StallWatch(timeout=30, start_timeout=300)
    silent = run(worker(WorkerState.UNKNOWN, reason="host did not answer"))
    assert watch.check(silent, now=0) is None
    failure = watch.check(silent, now=30)
    assert failure is not None and failure.kind is FailureKind.UNREACHABLE


def test_without_a_start_timeout_the_watch_keeps_one_limit() -> None:
    watch = StallWatch(timeout=30)
    assert watch.check(STARTING, now=0) is None
    failure = watch.check(STARTING, now=30)
    assert failure is not None and "start_timeout 30 s" in failure.reason


def test_start_limit_defaults_to_the_larger_of_300_and_stall_timeout() -> None:
    assert Job("demo", script="t.py").start_limit == DEFAULT_START_TIMEOUT == 300
    assert Job("demo", script="t.py", stall_timeout=30).start_limit == 300
    assert Job("demo", script="t.py", stall_timeout=900).start_limit == 900
    assert Job("demo", script="t.py", stall_timeout=900, start_timeout=60).start_limit == 60


def _inventory(tmp_path: Path, job_line: str) -> Path:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(f"""\
        hosts:
          - {{name: a, address: localhost, port: 20000, connection: local}}
        job:
          script: train.py
          {job_line}
        """))  # fmt: skip
    return path


def test_the_inventory_sets_start_timeout_and_refuses_what_is_not_a_positive_integer(
    tmp_path: Path,
) -> None:
    assert load_inventory(_inventory(tmp_path, "start_timeout: 600")).job.start_limit == 600
    for bad in ("0", "-5", "soon", "1.5"):
        with pytest.raises(InventoryError) as caught:
            load_inventory(_inventory(tmp_path, f"start_timeout: {bad}"))
        assert "job.start_timeout" in str(caught.value.problems), bad

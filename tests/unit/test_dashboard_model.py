"""The dashboard's pure parts: ETA, root cause, history parsing, charts, token rule."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.dashboard import model
from orchestrator.dashboard.charts import Marker, Series, line_chart, nice_ticks
from orchestrator.dashboard.server import may_go_without_token
from orchestrator.dashboard.watch import attempt_dir
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.records import Restart, RunRecord
from orchestrator.model.vocabulary import WorkerState
from worker import progress


def record(**fields: object) -> RunRecord:
    inventory = Inventory(
        path="inv.yaml",
        base_dir=".",
        hosts=(WorkerSlot(name="a", address="localhost", port=1),),
        job=Job(name="demo", script="train.py"),
    )
    return RunRecord(run_id="r1", inventory=inventory, created_at=0.0, **fields)  # type: ignore[arg-type]


def worker(name: str = "a", state: str = "running", **fields: object) -> WorkerStatus:
    """A worker's status: what is not given unset (None; no devices, no log)."""
    declared = dataclasses.fields(WorkerStatus)
    unset = {f.name: None for f in declared if f.default is dataclasses.MISSING}
    given = {"name": name, "index": 0, "host": "localhost", "state": WorkerState(state)}
    return WorkerStatus(**{**unset, "devices": (), "log_tail": (), **given, **fields})  # type: ignore[arg-type]


def status(state: str, *workers: WorkerStatus) -> RunStatus:
    return RunStatus(run_id="r1", job="demo", state=WorkerState(state), workers=workers)


def test_eta_from_rate_and_remaining_steps() -> None:
    # The estimate itself is engine/observe/eta.py's (tests/unit/test_notify_events.py).
    view = model.worker_view(worker(step=150, target_steps=300, steps_per_sec=10.0))
    assert view["progress"] == 0.5 and view["eta_seconds"] == 15.0


def test_root_cause_prefers_the_supervisors_verdict() -> None:
    failed = status(
        "failed",
        worker("b", "failed", step=7, reason="exit 1", finished_at=2.0),
        worker("a", "failed", step=5, reason="killed", finished_at=1.0),
    )
    assert model.root_cause(record(), failed) == "a at step 5: killed"
    assert model.root_cause(record(outcome="gave up: x"), failed) == "gave up: x"
    assert model.root_cause(record(), status("running")) is None


def test_history_skips_a_half_written_line() -> None:
    text = '{"step": 10, "loss": 1.0}\n{"step": 20, "loss": 0.5}\n{"step": 3'
    assert [p["step"] for p in model.parse_history(text)] == [10, 20]


def test_charts_mark_restarts_and_colour_attempts() -> None:
    run = record(restarts=(Restart(at=0.0, attempt=0, worker="a", reason="x", step=None),))
    history = {0: [{"step": 10, "loss": 1.0}], 1: [{"step": 8, "loss": 0.9, "steps_per_sec": 3}]}
    charts = model.charts(run, history)
    assert charts["loss"].count("<polyline") == 2
    assert 'data-attempt="1"' in charts["loss"]
    assert "restart 1" in charts["loss"]  # placed where attempt 1 resumed (step 8)
    assert "no data" not in charts["steps_per_sec"]
    assert "waiting" in line_chart("loss", [], empty="waiting")


def test_nice_ticks_cover_the_range() -> None:
    assert nice_ticks(0, 1.7) == [0.0, 0.5, 1.0, 1.5, 2.0]
    ticks = nice_ticks(120, 310)
    assert ticks[0] <= 120 and ticks[-1] >= 310
    svg = line_chart("t", [Series(0, ((0.0, 1.0), (5.0, 2.0)))], [Marker(3.0, "r<1>")])
    assert "r&lt;1&gt;" in svg  # labels are escaped


def test_the_history_file_name_matches_the_worker() -> None:
    assert model.HISTORY_FILE == progress.HISTORY_FILE


def test_attempt_dir_of_another_attempt() -> None:
    path = "/w/demo/runs/r1/attempt-3/chief"
    assert attempt_dir(path, 0) == "/w/demo/runs/r1/attempt-0/chief"


@pytest.mark.parametrize(
    ("host", "token"),
    [("127.0.0.1", False), ("localhost", False), ("::1", False), ("0.0.0.0", True),
     ("192.0.2.1", True), ("example.org", True)],
)  # fmt: skip
def test_only_loopback_may_go_without_a_token(host: str, token: bool) -> None:
    assert may_go_without_token(host) is not token

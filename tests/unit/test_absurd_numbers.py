"""A worker's numbers are finite and bounded before any arithmetic (issue 41): a script that
reports steps_per_sec=1e-320, a NaN loss or a 400-digit step shows them as unknown, and
nothing (the ETA, status's table and JSON, up's live line) crashes on them."""

from __future__ import annotations

import dataclasses
import json
import math
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.render import progress_line, status_table
from orchestrator.dashboard import model
from orchestrator.engine.observe.eta import MAX_ETA_SECONDS, eta_seconds
from orchestrator.engine.observe.status import RunStatus, WorkerStatus, worker_status
from orchestrator.engine.supervision.policy import conclude
from orchestrator.model.answers import Progress, WorkerProbe
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.printable import strict_json
from orchestrator.model.reading import (
    INTEGER_LIMIT,
    MAX_STEPS,
    MIN_RATE,
    integer,
    number,
    number_as_written,
    rate,
    steps,
)
from orchestrator.model.records import RunRecord, WorkerRecord
from orchestrator.model.timetext import duration
from orchestrator.model.vocabulary import WorkerState

REPO = Path(__file__).resolve().parents[2]
ABSURD = [math.nan, math.inf, -math.inf, float("1e999"), 10**400, -(10**400)]


@pytest.mark.parametrize("value", ABSURD)
def test_a_non_finite_or_huge_number_reads_as_absent(value: float) -> None:
    assert number(value) is None and number_as_written(value) is None
    assert integer(value) is None and steps(value) is None and rate(value) is None


def test_finite_numbers_read_as_before() -> None:
    assert number(3) == 3.0 and isinstance(number(3), float) and number(-2.5) == -2.5
    assert number_as_written(3) == 3 and isinstance(number_as_written(3), int)
    assert integer(INTEGER_LIMIT - 1) == INTEGER_LIMIT - 1 and integer(INTEGER_LIMIT) is None
    assert number(True) is None and integer(True) is None  # a bool is no number here


def test_steps_are_a_count_and_a_rate_is_at_least_a_step_a_year() -> None:
    assert steps(0) == 0 and steps(MAX_STEPS) == MAX_STEPS
    assert steps(-1) is None and steps(MAX_STEPS + 1) is None and steps(2.0) is None
    assert rate(2.5) == 2.5 and rate(3) == 3 and rate(MIN_RATE) == MIN_RATE
    for absurd in (1e-320, 5e-324, 0.0, -1.0, -math.inf):  # a denormal, none, negative
        assert rate(absurd) is None, absurd


def test_a_progress_file_of_absurd_numbers_reads_as_unknown() -> None:
    progress = Progress.parse({
        "step": 10**400, "target_steps": -5, "loss": math.nan, "accuracy": math.inf,
        "checkpoint_step": 2.5, "steps_per_sec": 1e-320, "val_loss": -math.inf,
    })  # fmt: skip
    assert progress is not None
    assert progress.step is None and progress.target_steps is None
    assert progress.loss is None and progress.accuracy is None and progress.val_loss is None
    assert progress.checkpoint_step is None and progress.steps_per_sec is None


@pytest.mark.parametrize(
    ("step", "target", "per_second"),
    [
        (1, 300, 1e-320),  # (299 / 1e-320) is infinite
        (1, 300, 5e-324),
        (1, 300, -2.0),
        (1, 300, math.nan),
        (1, 300, math.inf),  # no time left is no estimate either: it would be 0 s
        (0, 10**400, 1.0),  # int / float: OverflowError
        (0, 10**18, 1e-9),  # finite, but centuries
    ],
)
def test_an_eta_that_would_overflow_or_mean_nothing_is_unknown(
    step: int, target: int, per_second: float
) -> None:
    assert eta_seconds(step, target, per_second) is None


def test_a_sane_eta_is_unchanged_and_bounded() -> None:
    assert eta_seconds(100, 300, 4.0) == 50.0
    assert eta_seconds(0, 100, 100 / MAX_ETA_SECONDS) == pytest.approx(MAX_ETA_SECONDS)


@pytest.mark.parametrize("seconds", [math.inf, -math.inf, math.nan])
def test_a_duration_that_is_not_a_number_shows_as_unknown(seconds: float) -> None:
    assert duration(seconds) == "-"


HOST = WorkerSlot("alpha", "localhost", 2222)
RECORD = WorkerRecord(name="alpha", index=0, host=HOST, run_dir="/r/alpha",
                      log_path="/r/alpha/worker.log", checkpoint_dir="/r/ckpt", pid=7)  # fmt: skip


def probe_of(progress: dict[str, Any], **fields: Any) -> WorkerProbe:
    return WorkerProbe.parse({"exists": True, "pid": 7, "alive": True, "progress": progress,
                              **fields}, now=100.0)  # fmt: skip


def running(progress: dict[str, Any], **fields: Any) -> WorkerStatus:
    return worker_status(RECORD, probe_of(progress, **fields))


def test_the_reported_absurdities_render_and_serialise_as_unknown() -> None:
    worker = running(
        {"step": 3, "target_steps": 300, "loss": math.nan, "steps_per_sec": 1e-320},
        usage={"cpu_percent": math.inf, "rss_bytes": 10**400, "create_time": -1.7e308},
    )
    assert worker.state is WorkerState.RUNNING and worker.step == 3
    assert worker.steps_per_sec is None and worker.eta_seconds is None and worker.loss is None
    assert worker.cpu_percent is None and worker.rss_bytes is None
    now = RunStatus("r1", "demo", WorkerState.RUNNING, (worker,))
    assert "ETA" not in progress_line(worker) and "ETA" not in str(status_table(now).title)
    document = json.loads(strict_json(now.to_json()), parse_constant=_refuse)
    assert document["eta_seconds"] is None and document["workers"][0]["steps_per_sec"] is None


@pytest.mark.parametrize("started", [-1.7e308, 1e9, 101.0])  # now is 100.0
def test_an_uptime_between_far_apart_or_reversed_clock_readings_is_unknown(
    started: float,
) -> None:
    worker = running({"step": 3}, usage={"create_time": started, "cpu_percent": 1.0})
    assert worker.uptime is None
    assert running({"step": 3}, usage={"create_time": 40.0}).uptime == 60.0


def test_a_snapshot_read_back_bounds_its_numbers_too() -> None:
    written = running({"step": 3, "target_steps": 300, "steps_per_sec": 2.0}).to_json()
    hostile = {**written, "step": 10**400, "steps_per_sec": 1e-320, "target_steps": -1}
    read = WorkerStatus.from_json(hostile)
    assert read is not None
    assert (read.step, read.steps_per_sec, read.target_steps) == (None, None, None)
    assert WorkerStatus.from_json(written) == dataclasses.replace(
        running({"step": 3, "target_steps": 300, "steps_per_sec": 2.0}), log_tail=()
    )


def test_a_success_with_an_unknown_val_loss_is_concluded() -> None:
    # A NaN val_loss beside a real val_accuracy reads as absent: the conclusion says "-".
    record = RunRecord("r1", Inventory("inv.yaml", ".", (HOST,), Job("demo", script="t.py")),
                       0.0, workers=(RECORD,))  # fmt: skip
    done = running({"step": 5, "val_loss": math.nan, "val_accuracy": 0.5},
                   exit={"returncode": 0}, alive=False)  # fmt: skip
    final = RunStatus("r1", "demo", WorkerState.SUCCEEDED, (done,))
    assert "val_loss - val_accuracy 0.500" in conclude(final, record)


# The dashboard's charts read the worker's history file itself.


def charted(points: tuple[tuple[float, float], ...]) -> str:
    """line_chart of `points` in a child process bounded in time and memory: the chart of a
    value of 1e-13 or 1e-320 once looped forever, growing a list of ticks."""
    code = ("from orchestrator.dashboard.charts import Series, line_chart\n"
            f"print(line_chart('steps/s', [Series(0, {points!r})]))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO, preexec_fn=_at_most_a_gib, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _at_most_a_gib() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))


def test_a_chart_of_tiny_real_values_has_ticks() -> None:
    svg = charted(((1.0, 1e-13), (2.0, 3e-14)))  # a loss converged to 1e-13
    assert "<polyline" in svg and "1e-13" in svg


@pytest.mark.parametrize(
    "points",
    [((1.0, 1e-320), (2.0, 2e-320)), ((1.0, 1e308), (2.0, -1e308)), ((-1e308, 1.0), (1e308, 2.0))],
)
def test_a_chart_of_absurd_values_says_so_instead_of_hanging_or_raising(
    points: tuple[tuple[float, float], ...],
) -> None:
    svg = charted(points)
    assert "no chart can scale" in svg and "<polyline" not in svg


def test_a_history_line_of_a_400_digit_number_is_skipped_or_a_gap() -> None:
    huge = 10**400
    history = model.parse_history(f'{{"step": {huge}, "loss": 1}}\n{{"step": 2, "loss": {huge}}}\n'
                                  '{"step": 3, "loss": 0.5}\n')  # fmt: skip
    assert [p["step"] for p in history] == [2, 3]
    (series,) = model.curve({0: history}, "loss")
    assert math.isnan(series.points[0][1]) and series.points[1] == (3.0, 0.5)


def _refuse(name: str) -> None:
    raise ValueError(f"{name} is not JSON")

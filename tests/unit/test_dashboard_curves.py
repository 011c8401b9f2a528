"""The dashboard's validation curves across restarts (from the worker's progress history) and
its axis labels: short (10k, 20k) and never cut at the chart's edge (issue 28)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.dashboard import model
from orchestrator.dashboard.charts import HEIGHT, WIDTH, Series, line_chart, tick_label
from orchestrator.model.records import Restart
from tests.unit.test_dashboard_model import record
from worker import progress

X_LABEL = re.compile(
    rf'<text x="([\d.]+)" y="{HEIGHT - 10}" text-anchor="(\w+)" class="tick">([^<]*)</text>'
)


def train(path: Path, steps: range, eval_every: int) -> None:
    """What the built-in loop writes: a training write per logged step, an evaluation's write
    at the same step every eval_every."""
    writer = progress.ProgressWriter(str(path))
    for step in steps:
        writer.write(step=step, loss=1.0 / step, steps_per_sec=5.0)
        if step % eval_every == 0:
            writer.write(val_loss=2.0 / step, val_accuracy=step / 100, eval_step=step)


def test_evaluations_are_lines_of_their_own_in_the_history(tmp_path: Path) -> None:
    train(tmp_path / "progress.json", range(10, 60, 10), eval_every=20)
    text = (tmp_path / progress.HISTORY_FILE).read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    evaluations = [line for line in lines if "val_loss" in line]
    assert [(e["step"], e["val_accuracy"]) for e in evaluations] == [(20, 0.2), (40, 0.4)]
    assert all("loss" not in e for e in evaluations)  # the loss curve gets no second point
    assert [line["step"] for line in lines if "loss" in line] == [10, 20, 30, 40, 50]


def test_thinning_keeps_the_few_evaluations(tmp_path: Path) -> None:
    history = progress.History(str(tmp_path / progress.HISTORY_FILE), limit=40)
    for step in range(1, 200):
        history.append({"step": step, "time": float(step), "loss": 1.0})
        if step % 25 == 0:
            history.append_evaluation({"step": step, "time": float(step), "val_loss": 0.5})
    lines = Path(history.path).read_text().splitlines()
    assert len(lines) <= 40
    assert [json.loads(line)["step"] for line in lines if "val_loss" in line] == [
        25, 50, 75, 100, 125, 150, 175]  # fmt: skip


def test_val_curves_across_restarts(tmp_path: Path) -> None:
    for attempt, steps in ((0, range(10, 50, 10)), (1, range(40, 90, 10))):
        directory = tmp_path / f"attempt-{attempt}"
        directory.mkdir()
        train(directory / "progress.json", steps, eval_every=20)
    history = {
        attempt: model.parse_history((tmp_path / f"attempt-{attempt}" / progress.HISTORY_FILE)
                                     .read_text())
        for attempt in (0, 1)
    }  # fmt: skip
    run = record(restarts=(Restart(at=0.0, attempt=0, worker="a", reason="x", step=45),))
    charts = model.charts(run, history)
    for key in ("val_loss", "val_accuracy"):
        assert charts[key].count("<polyline") == 2, key
        assert 'data-attempt="0"' in charts[key] and 'data-attempt="1"' in charts[key]
        assert "restart 1" in charts[key]
        assert charts[key].count("<circle") == 5  # every evaluation a dot: 20, 40 | 40, 60, 80
    assert [s.points for s in model.curve(history, "val_accuracy")] == [
        ((20.0, 0.2), (40.0, 0.4)), ((40.0, 0.4), (60.0, 0.6), (80.0, 0.8))]  # fmt: skip
    empty = model.charts(run, {0: [{"step": 10, "loss": 1.0}]})
    assert "no evaluation yet" in empty["val_loss"]


@pytest.mark.parametrize(
    ("value", "spacing", "text"),
    [(10_000, 5_000, "10k"), (20_000, 5_000, "20k"), (2_500, 500, "2.5k"),
     (1_500_000, 500_000, "1.5M"), (2.0, 0.5, "2"), (1.5, 0.5, "1.5"), (0.25, 0.05, "0.25"),
     (0.0002, 0.0001, "2e-4"), (0, 0.5, "0"), (120, 20, "120")],
)  # fmt: skip
def test_tick_labels_are_short(value: float, spacing: float, text: str) -> None:
    assert tick_label(value, spacing) == text


@pytest.mark.parametrize("last", [2.0, 300.0, 20_000.0, 1_234_567.0])
def test_x_labels_stay_inside_the_chart(last: float) -> None:
    svg = line_chart("loss", [Series(0, ((0.0, 1.0), (last, 0.5)))])
    labels = X_LABEL.findall(svg)
    assert labels, svg
    for x, anchor, text in labels:
        assert "e+" not in text
        width = len(text) * 6.5  # about a 10 px character
        left = {"start": float(x), "middle": float(x) - width / 2, "end": float(x) - width}
        assert left[anchor] >= 0 and left[anchor] + width <= WIDTH + 1, (x, anchor, text)

"""The dashboard's loss views (smoothed, log scale) and its preflight panel's choice of check
(issue 56)."""

from __future__ import annotations

import math

from orchestrator.dashboard.charts import Series
from orchestrator.dashboard.curves import log10, smoothed
from orchestrator.dashboard.model import PREFLIGHT_WINDOW, charts, run_preflight
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.records import RunRecord


def a_record(created_at: float) -> RunRecord:
    inventory = Inventory("inv.yaml", ".", (WorkerSlot("a", "x", 1),), Job("j", script="t.py"))
    return RunRecord("r", inventory, created_at=created_at)


def test_smoothing_is_debiased_per_attempt_and_keeps_gaps() -> None:
    (line,) = smoothed([Series(0, ((1, 2.0), (2, 2.0), (3, math.nan), (4, 2.0)))], weight=0.6)
    values = [v for _, v in line.points]
    assert values[0] == 2.0 and values[1] == 2.0  # a flat curve stays flat from its first point
    assert math.isnan(values[2]) and abs(values[3] - 2.0) < 1e-12
    noisy = smoothed([Series(0, tuple((s, 1.0 if s % 2 else 3.0) for s in range(1, 41)))])
    tail = [v for _, v in noisy[0].points[-10:]]
    assert max(tail) - min(tail) < 2.0 * 0.5  # the swing of the raw curve, halved at least


def test_log10_leaves_values_at_or_below_zero_out() -> None:
    (line,) = log10([Series(1, ((1, 100.0), (2, 0.01), (3, 0.0), (4, -1.0)))])
    assert line.attempt == 1
    assert [v for _, v in line.points][:2] == [2.0, -2.0]
    assert all(math.isnan(v) for _, v in line.points[2:])


def test_the_charts_carry_the_loss_views() -> None:
    record = a_record(1000.0)
    history = {0: [{"step": s, "loss": 1.0 / s} for s in range(1, 30)]}
    found = charts(record, history)
    assert "<polyline" in found["loss_smoothed"] and "<polyline" in found["loss_log"]
    assert "log10(loss)" in found["loss_log"]


def test_the_preflight_panel_shows_only_this_runs_check() -> None:
    record = a_record(10_000.0)
    ours = {"inventory": "inv.yaml", "checked_at": 9_990.0, "findings": []}
    assert run_preflight(ours, record) == ours
    assert run_preflight({**ours, "inventory": "other.yaml"}, record) is None
    stale = {**ours, "checked_at": 10_000.0 - PREFLIGHT_WINDOW - 1}
    assert run_preflight(stale, record) is None
    assert run_preflight({**ours, "checked_at": 10_050.0}, record) is None  # after it began
    assert run_preflight(None, record) is None

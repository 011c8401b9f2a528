"""The loss chart's other views: smoothed (an exponential moving average per attempt, debiased
at its start as TensorBoard's is) and on a log scale (log10 of the positive values). Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.dashboard.charts import Series

SMOOTHING = 0.6  # the weight of the past, TensorBoard's default


def smoothed(series: Sequence[Series], weight: float = SMOOTHING) -> list[Series]:
    """Each attempt's curve as an exponential moving average; a gap (a non-finite value) stays
    a gap and the average goes on over it."""
    out = []
    for line in series:
        average, seen, points = 0.0, 0, []
        for step, value in line.points:
            if not math.isfinite(value):
                points.append((step, value))
                continue
            seen += 1
            average = average * weight + (1 - weight) * value
            points.append((step, average / (1 - weight**seen)))  # debiased: no dip towards 0
        out.append(Series(line.attempt, tuple(points)))
    return out


def log10(series: Sequence[Series]) -> list[Series]:
    """log10 of each value; a value at or below 0 has none (a gap)."""
    return [
        Series(
            line.attempt, tuple((s, math.log10(v) if v > 0 else math.nan) for s, v in line.points)
        )
        for line in series
    ]

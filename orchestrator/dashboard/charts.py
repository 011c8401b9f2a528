"""Server-rendered SVG line charts: nothing to load from the internet, nothing to vendor. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 560, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 14, 26, 30
# One colour per attempt, so a restart shows where one curve stops and the next starts.
ATTEMPT_COLOURS = ("#38bdf8", "#a78bfa", "#34d399", "#fbbf24", "#f472b6", "#fb923c")


@dataclass(frozen=True)
class Series:
    attempt: int
    points: tuple[tuple[float, float], ...]  # (step, value)


@dataclass(frozen=True)
class Marker:
    step: float
    label: str


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1, 2, 5 times a power of ten apart)."""
    if not math.isfinite(low) or not math.isfinite(high):
        return []
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = [round(first, 12)]
    while ticks[-1] < high:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 10000 or abs(value) < 0.01:
        return f"{value:.1e}"
    return f"{value:.4g}"


def line_chart(
    title: str, series: Sequence[Series], markers: Sequence[Marker] = (), empty: str = ""
) -> str:
    """An SVG chart of value over step: one polyline per attempt, a dashed line per marker."""
    points = [p for s in series for p in s.points]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'class="chart" role="img" aria-label="{escape(title)}">'
        f'<text x="{LEFT}" y="16" class="chart-title">{escape(title)}</text>'
    )
    if not points:
        message = escape(empty or "no data yet")
        return (
            f'{head}<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
            f'class="chart-empty">{message}</text></svg>'
        )
    steps = [p[0] for p in points] + [m.step for m in markers]
    values = [p[1] for p in points]
    x_ticks = nice_ticks(min(steps), max(steps))
    y_ticks = nice_ticks(min(0.0, *values), max(values))  # from 0: the scale stays honest
    x_low, x_high = x_ticks[0], x_ticks[-1]
    y_low, y_high = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + (step - x_low) / ((x_high - x_low) or 1) * plot_w

    def y(value: float) -> float:
        return TOP + plot_h - (value - y_low) / ((y_high - y_low) or 1) * plot_h

    parts = [head]
    for tick in y_ticks:
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            f'class="grid"/><text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" '
            f'class="tick">{_label(tick)}</text>'
        )
    for tick in x_ticks:
        parts.append(
            f'<text x="{x(tick):.1f}" y="{HEIGHT - 10}" text-anchor="middle" '
            f'class="tick">{_label(tick)}</text>'
        )
    for marker in markers:
        mx = x(marker.step)
        parts.append(
            f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{TOP}" y2="{TOP + plot_h}" class="marker"/>'
            f'<text x="{mx + 4:.1f}" y="{TOP + 12}" class="marker-label">'
            f"{escape(marker.label)}</text>"
        )
    for line in series:
        if not line.points:
            continue
        colour = ATTEMPT_COLOURS[line.attempt % len(ATTEMPT_COLOURS)]
        coords = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in line.points)
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2" '
            f'stroke-linejoin="round" data-attempt="{line.attempt}"/>'
        )
        last_s, last_v = line.points[-1]
        parts.append(f'<circle cx="{x(last_s):.1f}" cy="{y(last_v):.1f}" r="3" fill="{colour}"/>')
    parts.append(
        f'<text x="{WIDTH - RIGHT}" y="16" text-anchor="end" class="axis">over step</text>'
    )
    parts.append("</svg>")
    return "".join(parts)

"""Server-rendered SVG line charts: nothing to load from the internet, nothing to vendor. Pure."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 560, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 14, 26, 30
_PLOT_W, _PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
SPARSE = 24  # a series of at most this many points shows each of them
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
    """Round tick values covering [low, high] (1, 2, 5 times a power of ten apart); none for a
    range no float step splits: wider than the largest float (-1e308 to 1e308), or narrower
    than the smallest normal one (a worker that reports 1e-320)."""
    if not math.isfinite(low) or not math.isfinite(high):
        return []
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count - 1, 1)
    if not sys.float_info.min < raw < math.inf:
        return []
    exponent = math.floor(math.log10(raw))
    step = next(m * 10.0**exponent for m in (1, 2, 5, 10) if m * 10.0**exponent >= raw)
    first = math.floor(low / step) * step
    # A decimal more than the step has: the float noise of first + n * step rounds away (a
    # fixed 12 decimals rounded a step of 5e-14 to 0, and the ticks never reached `high`).
    digits = max(0, 1 - exponent)
    ticks = [round(first, digits)]
    while ticks[-1] < high and len(ticks) <= 2 * count:
        ticks.append(round(first + len(ticks) * step, digits))
    return ticks


def tick_label(value: float, spacing: float) -> str:
    """A tick's text, short and with the digits its spacing needs: 10k, 2.5M, 0.25, 2e-4."""
    if value == 0:
        return "0"
    size = abs(value)
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= factor:
            return _decimals(value / factor, spacing / factor) + suffix
    if size < 1e-3:
        mantissa, _, exponent = f"{value:.1e}".partition("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return _decimals(value, spacing)


def _decimals(value: float, spacing: float) -> str:
    decimals = max(0, -math.floor(math.log10(spacing))) if spacing > 0 else 0
    text = f"{value:.{min(decimals, 6)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


# About the width of a character of a tick label (10 px, the page's sans-serif font): enough to
# keep a label inside the chart's box (a label centred on the last tick would be cut).
_CHAR_W = 6.5


def _spacing(ticks: Sequence[float]) -> float:
    return ticks[1] - ticks[0] if len(ticks) > 1 else abs(ticks[0]) if ticks else 1.0


def line_chart(
    title: str, series: Sequence[Series], markers: Sequence[Marker] = (), empty: str = ""
) -> str:
    """An SVG chart of value over step: one polyline per attempt, a dashed line per marker;
    a point that is not finite (NaN, infinity) is a gap in its line."""
    points = [p for s in series for p in s.points if _finite(p)]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'class="chart" role="img" aria-label="{escape(title)}">'
        f'<text x="{LEFT}" y="16" class="chart-title">{escape(title)}</text>'
    )
    if not points:
        return _message(head, empty or "no data yet")
    steps = [p[0] for p in points] + [m.step for m in markers]
    values = [p[1] for p in points]
    x_ticks = nice_ticks(min(steps), max(steps))
    y_ticks = nice_ticks(min(0.0, *values), max(values))  # from 0: the scale stays honest
    if not x_ticks or not y_ticks:
        return _message(head, "values no chart can scale (a step or value near 1e308, 1e-320)")
    scale = _Scale(x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1])
    parts = [
        head,
        *_y_grid(scale, y_ticks),
        *_x_labels(scale, x_ticks),
        *_marker_lines(scale, markers),
        *_attempt_lines(scale, series),
        f'<text x="{WIDTH - RIGHT}" y="16" text-anchor="end" class="axis">over step</text>',
        "</svg>",
    ]
    return "".join(parts)


def _message(head: str, message: str) -> str:
    """The chart's box with a line of text instead of lines."""
    return (
        f'{head}<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
        f'class="chart-empty">{escape(message)}</text></svg>'
    )


@dataclass(frozen=True)
class _Scale:
    """Steps and values to SVG coordinates: the first and last ticks span the plot area."""

    x_low: float
    x_high: float
    y_low: float
    y_high: float

    def x(self, step: float) -> float:
        return LEFT + (step - self.x_low) / ((self.x_high - self.x_low) or 1) * _PLOT_W

    def y(self, value: float) -> float:
        return TOP + _PLOT_H - (value - self.y_low) / ((self.y_high - self.y_low) or 1) * _PLOT_H


def _y_grid(scale: _Scale, ticks: Sequence[float]) -> list[str]:
    """A horizontal grid line per value tick, labelled on the left."""
    spacing = _spacing(ticks)
    return [
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{scale.y(tick):.1f}" '
        f'y2="{scale.y(tick):.1f}" class="grid"/><text x="{LEFT - 6}" '
        f'y="{scale.y(tick) + 4:.1f}" text-anchor="end" class="tick">'
        f"{tick_label(tick, spacing)}</text>"
        for tick in ticks
    ]


def _x_labels(scale: _Scale, ticks: Sequence[float]) -> list[str]:
    """A label under each step tick, centred on it, but kept inside the chart at its edges."""
    spacing = _spacing(ticks)
    parts = []
    for tick in ticks:
        text = tick_label(tick, spacing)
        x, half, anchor = scale.x(tick), len(text) * _CHAR_W / 2, "middle"
        if x + half > WIDTH - 1:
            x, anchor = WIDTH - 1.0, "end"
        elif x - half < 1:
            x, anchor = 1.0, "start"
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - 10}" text-anchor="{anchor}" class="tick">{text}</text>'
        )
    return parts


def _marker_lines(scale: _Scale, markers: Sequence[Marker]) -> list[str]:
    parts = []
    for marker in markers:
        mx = scale.x(marker.step)
        parts.append(
            f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{TOP}" y2="{TOP + _PLOT_H}" class="marker"/>'
            f'<text x="{mx + 4:.1f}" y="{TOP + 12}" class="marker-label">'
            f"{escape(marker.label)}</text>"
        )
    return parts


def _finite(point: tuple[float, float]) -> bool:
    return math.isfinite(point[0]) and math.isfinite(point[1])


def _runs(points: Sequence[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """The stretches of finite points between the non-finite ones."""
    runs: list[list[tuple[float, float]]] = [[]]
    for point in points:
        if _finite(point):
            runs[-1].append(point)
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _attempt_lines(scale: _Scale, series: Sequence[Series]) -> list[str]:
    """A polyline per attempt in the attempt's colour (one per stretch between gaps), and a dot
    on its latest point."""
    parts = []
    for line in series:
        stretches = _runs(line.points)
        if not stretches:
            continue
        colour = ATTEMPT_COLOURS[line.attempt % len(ATTEMPT_COLOURS)]
        for stretch in stretches:
            coords = " ".join(f"{scale.x(s):.1f},{scale.y(v):.1f}" for s, v in stretch)
            parts.append(
                f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2" '
                f'stroke-linejoin="round" data-attempt="{line.attempt}"/>'
            )
        # A dot on the latest point; on every point of a sparse series (evaluations).
        finite = [point for stretch in stretches for point in stretch]
        dotted = finite if len(finite) <= SPARSE else finite[-1:]
        parts.extend(
            f'<circle cx="{scale.x(s):.1f}" cy="{scale.y(v):.1f}" r="3" fill="{colour}"/>'
            for s, v in dotted
        )
    return parts


# The goodput bar's colours, one per part (engine/observe/goodput.PARTS): training green, the rest
# the colours of what went wrong or waited.
PART_COLOURS = {"productive": "#34d399", "startup": "#38bdf8", "checkpoint": "#a78bfa",
                "evaluation": "#818cf8", "lost": "#f87171", "restart": "#fb923c",
                "stall": "#fbbf24", "queue": "#94a3b8", "shutdown": "#64748b",
                "unknown": "#475569"}  # fmt: skip
BAR_W, BAR_H = 560, 44


def stacked_bar(title: str, parts: Sequence[tuple[str, str, float]], empty: str = "") -> str:
    """A horizontal bar of the whole time, one segment per part (`parts`: name, label,
    seconds), widths in proportion; each segment says its label, share and time on hover,
    and a legend names the parts of half a percent or more."""
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {BAR_W} {BAR_H}" '
        f'class="chart goodput-bar" role="img" aria-label="{escape(title)}">'
    )
    shown = [(n, label, s) for n, label, s in parts if math.isfinite(s) and s > 0]
    total = sum(seconds for _, _, seconds in shown)
    if total <= 0:
        note = escape(empty or "no data yet")
        return f'{head}<text x="0" y="20" class="axis">{note}</text></svg>'
    out, x, legend_x = [head], 0.0, 0.0
    for name, label, seconds in shown:
        share = seconds / total
        colour = PART_COLOURS.get(name, "#475569")
        out.append(
            _segment(name, x, share, colour, f"{label} {share * 100:.1f} % ({seconds:.1f} s)")
        )
        x += BAR_W * share
        if share >= 0.005 and legend_x < BAR_W - 60:
            short = f"{label} {share * 100:.0f} %"
            out.append(_legend(legend_x, colour, short))
            legend_x += 14 + 6.2 * len(short)
    return "".join([*out, "</svg>"])


def _segment(name: str, x: float, share: float, colour: str, text: str) -> str:
    return (
        f'<rect x="{x:.2f}" y="2" width="{BAR_W * share:.2f}" height="18" fill="{colour}" '
        f'data-part="{escape(name)}" data-share="{share:.4f}"><title>{escape(text)}</title></rect>'
    )


def _legend(x: float, colour: str, text: str) -> str:
    return (
        f'<rect x="{x:.0f}" y="30" width="8" height="8" fill="{colour}"/>'
        f'<text x="{x + 11:.0f}" y="38" class="axis">{escape(text)}</text>'
    )

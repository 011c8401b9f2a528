"""Which worker the others wait for, from the built-in loop's step timing (pure).

Each worker's loop reports, per log window, the seconds per step inside its step calls
(`step_call_seconds`) and the wall seconds per step (`step_seconds`, the same on every worker of
a synchronous job). The step's one collective makes every worker wait inside its call for the
last one to arrive, so the worker the others wait for is the one whose calls return soonest: it
spends the most of each step outside them (its own host-side work between steps, a slow
Python, a loaded CPU). `status`, the dashboard and a stall's root cause name it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

CALL_RATIO = 0.7  # its calls take below this much of the others' median ...
OUTSIDE_SHARE = 0.25  # ... and at least this share of its step is outside them


def pace_outlier(timings: Mapping[str, tuple[float | None, float | None]]) -> str | None:
    """The worker the others wait for, as a sentence, or None. `timings`: each running
    worker's (step_call_seconds, step_seconds) as it reported them."""
    timed = {
        name: (call, step)
        for name, (call, step) in timings.items()
        if call is not None and step is not None and step > 0
    }
    if len(timed) < 2:
        return None
    found = []
    for name, (call, step) in timed.items():
        others = statistics.median(c for n, (c, _) in timed.items() if n != name)
        outside = 1 - call / step
        if others > 0 and call / others < CALL_RATIO and outside >= OUTSIDE_SHARE:
            found.append((call / others, name, outside))
    if not found:
        return None
    _, name, outside = min(found)
    return (
        f"{name} spends {outside * 100:.0f} % of each step outside its step calls: the other "
        "workers wait for it"
    )

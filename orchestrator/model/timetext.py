"""A span of seconds as people read it (1h05m, 3m07s, 42s): said the same way by the status
table, the live view, the notifications and the goodput advice."""

from __future__ import annotations

import math


def duration(seconds: float | None) -> str:
    """`-` for an unknown span (None, inf or nan: int(inf) raises, and an unknown ETA is not
    a crash)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"

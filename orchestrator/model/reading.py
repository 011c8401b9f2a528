"""Lenient readers of JSON values, shared by every typed answer and document: a value of the
wrong type reads as absent (None, or empty), never as an error.

A number is finite and bounded when it is read, before any arithmetic: JSON from a host or a
worker's file may say NaN, Infinity, 1e-320 or a 400-digit integer (Python's json reads them
all), and a rate of 1e-320 steps/s makes an ETA overflow. Such a value reads as absent, which
every view shows as unknown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

INTEGER_LIMIT = 2**63  # past a signed 64-bit integer no count, pid or size is meant
MAX_STEPS = 10**15  # a million steps a second for thirty years
# The slowest rate that means something: a step a year. Below it (1e-320, a denormal) an
# ETA is not an estimate, and divided into the steps left it overflows.
MIN_RATE = 1 / (365 * 86400)


def number(value: Any) -> float | None:
    """A finite number as a float."""
    found = number_as_written(value)
    return None if found is None else float(found)


def number_as_written(value: Any) -> float | None:
    """A finite number as it was written: an int stays one, so a document reads back the same."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return value if -INTEGER_LIMIT <= value < INTEGER_LIMIT else None
    return value if math.isfinite(value) else None


def integer(value: Any) -> int | None:
    """An integer within 64 bits."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if -INTEGER_LIMIT <= value < INTEGER_LIMIT else None


def steps(value: Any) -> int | None:
    """A step count: 0 up to MAX_STEPS."""
    found = integer(value)
    return found if found is not None and 0 <= found <= MAX_STEPS else None


def rate(value: Any) -> float | None:
    """A rate per second (steps/s), as written: MIN_RATE up to what a float holds."""
    found = number_as_written(value)
    return found if found is not None and found >= MIN_RATE else None


def text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def texts(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else ()


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}

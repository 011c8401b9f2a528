"""Lenient readers of JSON values, shared by every typed answer and document: a value of the
wrong type reads as absent (None, or empty), never as an error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def number(value: Any) -> float | None:
    """A number as a float."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def number_as_written(value: Any) -> float | None:
    """A number as it was written: an int stays one, so a document reads back the same."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def texts(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else ()


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}

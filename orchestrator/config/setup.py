"""`setup:`: shell commands run on every host before a start (backends/hosts/setup.py runs them)."""

from __future__ import annotations

from typing import Any

from orchestrator.config.report import Report
from orchestrator.values import describe, multiline_string


def parse_setup(value: Any, line: int | None, report: Report) -> tuple[str, ...]:
    """`setup:` is a list of shell commands (strings)."""
    message = f"expected a non-empty list of shell commands, got {describe(value)}"
    return report.checked_list(
        value, line, "setup", multiline_string, not_a_list=message, non_empty=True
    )

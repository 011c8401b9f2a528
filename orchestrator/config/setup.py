"""`setup:`: shell commands run on every host before a start (backends/hosts/setup.py runs them)."""

from __future__ import annotations

from typing import Any

from orchestrator.config.report import Report
from orchestrator.values import describe, string
from orchestrator.yamlsource import LineList


def parse_setup(value: Any, line: int | None, report: Report) -> tuple[str, ...]:
    """`setup:` is a list of shell commands (strings)."""
    if not isinstance(value, LineList) or not value:
        report.add(line, "setup", f"expected a non-empty list of shell commands, got "
                   f"{describe(value)}")  # fmt: skip
        return ()
    commands = []
    for index, item in enumerate(value):
        command, problem = string(item)
        if problem:
            report.add(value.item_lines[index], f"setup[{index}]", problem)
        else:
            commands.append(command)
    return tuple(commands)

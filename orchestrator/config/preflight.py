"""`preflight:`: what `up`'s preflight check does beyond the checks it always runs."""

from __future__ import annotations

from typing import Any

from orchestrator.config.report import Report
from orchestrator.values import Key, boolean, describe, key_names
from orchestrator.yamlsource import LineMap

# `preflight:`'s keys; the manual's key reference is written from these entries.
PREFLIGHT_KEY_ENTRIES: tuple[Key, ...] = (
    Key("perf", "boolean", "`false`",
        "`true`: `up` runs `check --perf`'s performance round too (each host's compute, each "
        "ring link's throughput; a warning names the slow ones). Off by default: it adds a few "
        "seconds, and `up` then starts the first attempt's standbys after the checks"),
)  # fmt: skip
PREFLIGHT_KEYS = key_names(PREFLIGHT_KEY_ENTRIES)


def parse_preflight(value: Any, line: int | None, report: Report) -> bool:
    """`preflight: {perf: BOOL}`: whether `up` measures performance (an empty block: no)."""
    if value is None:
        return False
    if not isinstance(value, LineMap):
        report.add(line, "preflight", f"expected a mapping (`perf:`), got {describe(value)}")
        return False
    report.unknown_keys(value, PREFLIGHT_KEYS, "preflight")
    perf, problem = boolean(value.get("perf", False))
    if problem:
        report.add(value.key_lines.get("perf", line), "preflight.perf", problem)
        return False
    return bool(perf)

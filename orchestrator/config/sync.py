"""`sync:`: a directory of this machine mirrored to every host (backends/hosts/sync.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.config.report import Report
from orchestrator.model.inventory import SyncSpec
from orchestrator.paths import controller_path
from orchestrator.values import Key, boolean, describe, key_names, string
from orchestrator.yamlsource import LineList, LineMap

# `sync:`'s keys (or `sync: DIR`, its source alone); the manual's key reference is written from
# these entries.
SYNC_KEY_ENTRIES: tuple[Key, ...] = (
    Key("source", "string (a directory on this machine)", "required",
        "mirrored to `{workdir}/{job}/code/` on every host (rsync over OpenSSH)"),
    Key("exclude", "list of rsync patterns", "`[]`",
        "left out of the mirror, and left alone on the hosts"),
    Key("git", "boolean", "`false`", "`true` keeps `.git` in the mirror (left out by default)"),
)  # fmt: skip
SYNC_KEYS = key_names(SYNC_KEY_ENTRIES)


def parse_sync(value: Any, line: int | None, report: Report, base: Path) -> SyncSpec | None:
    """`sync: DIR` or `sync: {source: DIR, exclude: [...], git: false}` (paths relative to the
    inventory file)."""
    block = LineMap() if not isinstance(value, LineMap) else value
    if isinstance(value, str):
        block["source"] = value
    elif not isinstance(value, LineMap):
        report.add(line, "sync", f"expected a directory or a mapping, got {describe(value)}")
        return None
    report.unknown_keys(block, SYNC_KEYS, "sync")
    source, problem = string(block.get("source"))
    if problem:
        report.add(block.key_lines.get("source", line), "sync.source", f"{problem}; the "
                   "directory to mirror to every host")  # fmt: skip
        return None
    path = controller_path(source, base)
    if not path.is_dir():
        report.add(block.key_lines.get("source", line), "sync.source", f"no such directory: {path}")
        return None
    raw = block.get("exclude", LineList())
    excludes = report.checked_list(raw, block.key_lines.get("exclude"), "sync.exclude", string,
                                   not_a_list="expected a list of patterns")  # fmt: skip
    git, problem = boolean(block.get("git", False))
    if problem:
        report.add(block.key_lines.get("git"), "sync.git", problem)
    return SyncSpec(str(path), excludes, bool(git))

"""MkDocs hook: the manual's reference pages, written at build time from the code itself.

`mkdocs.yml` names this file under `hooks:`. Each page is generated from the table the code
reads, so it cannot drift from it: the failure kinds from `orchestrator.engine.failures`
(MEANINGS, HINTS, DETERMINISTIC). Nothing here is a page of its own: edit the tables.
"""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

from orchestrator.engine.failures import DETERMINISTIC, HINTS, MEANINGS, FailureKind


def cell(text: str) -> str:
    """Text made safe for one cell of a Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def failures_page() -> str:
    lines = [
        "# Failure kinds",
        "",
        "Every kind of failure the supervisor tells apart, what it means and what to do: the hint",
        "that `up`'s root cause, `status` (`what to do:`; `failure_kind` and `hint` in",
        "`status --json`) and the dashboard show. Generated from",
        "`orchestrator/engine/failures.py`.",
        "A kind that is not retried ends the run at once: it fails the same way on every restart.",
        "",
        "| kind | what it means | retried | what to do |",
        "| --- | --- | --- | --- |",
    ]
    for kind in FailureKind:
        retried = "no" if kind in DETERMINISTIC else "yes"
        lines.append(
            f"| `{kind.value}` | {cell(MEANINGS[kind])} | {retried} | {cell(HINTS[kind])} |"
        )
    return "\n".join(lines) + "\n"


PAGES = {
    "reference/failures.md": failures_page,
}


def on_files(files: Files, config: Any) -> Files:
    for path, build in PAGES.items():
        files.append(File.generated(config, path, content=build()))
    return files

"""MkDocs hook: the manual's reference pages, written at build time from the code itself.

`mkdocs.yml` names this file under `hooks:`. Each page is generated from the table the code
reads, so it cannot drift from it: the inventory keys from the loader's one key registry
(`orchestrator.backends.registry.key_reference`: the loader's `key_reference` with the host
sources of the registry's table, the entries every known-key check is derived from)
and the failure kinds from `orchestrator.engine.observe.failures` (MEANINGS, HINTS, DETERMINISTIC).
Nothing here is a page of its own: edit the tables. tests/unit/test_key_reference.py renders
the pages without MkDocs.
"""

from __future__ import annotations

from typing import Any

from orchestrator.backends.registry import key_reference
from orchestrator.engine.observe.failures import DETERMINISTIC, HINTS, MEANINGS
from orchestrator.model.vocabulary import FailureKind


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
        "`orchestrator/engine/observe/failures.py`.",
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


def inventory_page() -> str:
    lines = [
        "# Inventory keys",
        "",
        "Every key the inventory loader accepts, block by block, with its type, default and",
        "meaning. Generated from the loader's key registry",
        "(`orchestrator/config/loader.py`, `key_reference`, with the host sources of",
        "`orchestrator/backends/registry.py`): a key the loader accepts is",
        "described here. A key that is not listed is refused, with a guess at the one you meant.",
        "The [inventory page](../inventory.md) shows the keys at work.",
    ]
    for where, about, entries in key_reference():
        lines += [
            "",
            f"## `{where}`" if where != "top level" else "## Top level",
            "",
            f"{about[0].upper()}{about[1:]}.",
            "",
            "| key | type | default | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for key in entries:
            lines.append(
                f"| `{key.name}` | {cell(key.type)} | {cell(key.default)} | {cell(key.meaning)} |"
            )
    return "\n".join(lines) + "\n"


PAGES = {
    "reference/inventory.md": inventory_page,
    "reference/failures.md": failures_page,
}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File  # MkDocs only when it builds: the tests need none

    for path, build in PAGES.items():
        files.append(File.generated(config, path, content=build()))
    return files

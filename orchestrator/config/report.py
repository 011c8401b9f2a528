"""Problems of one inventory file, collected (not only the first), each with the file, the line,
the key path and what was expected. Every parser of config/ reports through a Report."""

from __future__ import annotations

import difflib
from collections.abc import Collection
from typing import Any

from orchestrator.errors import Problem
from orchestrator.values import Checker
from orchestrator.yamlsource import LineList, LineMap


class Report:
    """Collects problems of one file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[Problem] = []

    def add(self, line: int | None, key: str, message: str) -> None:
        self.problems.append(Problem(self.path, line, key, message))

    def checked(self, mapping: LineMap, checkers: dict[str, Checker], where: str,
                skip: Collection[str] = ()) -> dict[str, Any]:  # fmt: skip
        """The values of `mapping` that pass their checker; a problem for each that does not."""
        values: dict[str, Any] = {}
        for key, check in checkers.items():
            if key not in mapping or key in skip:
                continue
            value, problem = check(mapping[key])
            if problem:
                self.add(line_of(mapping, key), join_key(where, key), problem)
            else:
                values[key] = value
        return values

    def checked_list(self, raw: Any, line: int | None, where: str, check: Checker, *,
                     not_a_list: str, extra: Checker | None = None,
                     non_empty: bool = False) -> tuple[Any, ...]:  # fmt: skip
        """The items of the YAML list `raw` (at `line`, key `where`) that pass `check` and then
        `extra` (whose value replaces the item's: a resolved path); a problem for each item that
        does not, at its own line and `where[index]`. Anything but a list (or an empty one, with
        `non_empty`) is one problem, `not_a_list`, and no items."""
        if not isinstance(raw, LineList) or (non_empty and not raw):
            self.add(line, where, not_a_list)
            return ()
        items = []
        for index, item in enumerate(raw):
            value, problem = check(item)
            if not problem and extra is not None:
                value, problem = extra(value)
            if problem:
                self.add(raw.item_lines[index], f"{where}[{index}]", problem)
            else:
                items.append(value)
        return tuple(items)

    def unknown_keys(self, mapping: LineMap, known: tuple[str, ...] | dict[str, Any], where: str):
        for key in mapping:
            if key in known:
                continue
            guess = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"did you mean '{guess[0]}'?" if guess else f"known keys: {', '.join(known)}"
            self.add(mapping.key_lines.get(key), join_key(where, key), f"unknown key; {hint}")
        for key, line in mapping.duplicate_keys:
            self.add(line, join_key(where, key), "repeated key; each key may appear once")


def join_key(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def line_of(mapping: Any, key: Any) -> int | None:
    if isinstance(mapping, LineMap):
        return mapping.key_lines.get(key, mapping.line)
    return None

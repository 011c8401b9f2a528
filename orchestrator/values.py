"""Checkers for inventory values: each returns (value, None) or (None, "what was expected"). Pure.

Shared by the inventory and the connection kinds, which declare their own keys with them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.yamlsource import LineList, LineMap

Checked = tuple[Any, str | None]
Checker = Callable[[Any], Checked]

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # always fullmatch: never re.match
# C0, DEL and C1: what `string` refuses (job.env values and job.args travel as JSON or argv).
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Key:
    """One inventory key of a block: what the loader checks it with, and what the manual's key
    reference says of it (docs/hooks/reference.py writes that page from these entries). Each
    block's table of known keys is derived from its entries, so a key the loader accepts is a
    key the reference describes."""

    name: str
    type: str  # for people: "integer, 1 to 65535"
    default: str  # for people: "required", "`ssh`", "" when unset means "none"
    meaning: str
    check: Checker | None = None  # None: the block's parser reads the key itself


def checkers(keys: Iterable[Key]) -> dict[str, Checker]:
    """A block's known keys with their checkers, in the entries' order."""
    return {key.name: key.check for key in keys if key.check is not None}


def key_names(keys: Iterable[Key]) -> tuple[str, ...]:
    return tuple(key.name for key in keys)


SHOWN = 60  # characters of a value shown in a message; a longer one is described by its size


def describe(value: Any) -> str:
    """A value as a message shows it: short, never whole when it is long (an alias-expanded
    YAML value can be gigabytes once printed)."""
    if isinstance(value, (LineMap, dict)):
        return "a mapping"
    if isinstance(value, (LineList, list)):
        return "a list"
    if isinstance(value, str) and len(value) > SHOWN:
        return f"a string of {len(value)} characters starting {value[:SHOWN]!r}"
    return repr(value)[: SHOWN * 2]


def brief_list(value: list[Any]) -> str:
    """A list in a message: written out when short and flat, else its length."""
    flat = all(not isinstance(item, (dict, list)) for item in value[:9])
    if len(value) <= 8 and flat:
        return "[" + ", ".join(describe(item) for item in value) + "]"
    return f"a list of {len(value)} items"


def control_problem(text: str) -> str | None:
    """What is wrong with a name or path holding a control character (a newline, a tab, an
    escape): it could end a line of a generated batch script, or of a log, and start another."""
    found = CONTROL_CHARACTERS.search(text)
    if found is None:
        return None
    return f"expected no control characters (found {found.group()!r}), got {text!r}"


def string(value: Any) -> Checked:
    """A non-empty string without control characters: names, paths, addresses, options."""
    if isinstance(value, str) and value.strip():
        problem = control_problem(value)
        return (None, problem) if problem else (value, None)
    return None, f"expected a non-empty string, got {describe(value)}"


def multiline_string(value: Any) -> Checked:
    """A non-empty string that may span lines (a shell command of `setup:`)."""
    if isinstance(value, str) and value.strip():
        return value, None
    return None, f"expected a non-empty string, got {describe(value)}"


def scalar_string(value: Any) -> Checked:
    # YAML turns `5` into an int; arguments and environment values are text on the command line.
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return None, f"expected a string or number, got {describe(value)}"
    return str(value), None


def integer(low: int, high: int | None = None) -> Checker:
    def check(value: Any) -> Checked:
        bounds = f"from {low} to {high}" if high else f"of at least {low}"
        if isinstance(value, bool) or not isinstance(value, int):
            return None, f"expected an integer {bounds}, got {describe(value)}"
        if value < low or (high is not None and value > high):
            return None, f"expected an integer {bounds}, got {value}"
        return value, None

    return check


def choice(*options: str) -> Checker:
    def check(value: Any) -> Checked:
        if value in options:
            return value, None
        return None, f"expected one of {', '.join(options)}, got {describe(value)}"

    return check


def boolean(value: Any) -> Checked:
    if isinstance(value, bool):
        return value, None
    return None, f"expected true or false, got {describe(value)}"


def integers(low: int, length: int | None = None) -> Checker:
    """A list of integers of at least `low` (exactly `length` of them, when given)."""

    def check(value: Any) -> Checked:
        wanted = f"a list of {length} " if length else "a list of "
        expected = f"expected {wanted}integers of at least {low}, got {describe(value)}"
        if not isinstance(value, list) or (length is not None and len(value) != length):
            return None, expected
        if any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in value):
            return None, expected + f" ({brief_list(value)})"
        if len(set(value)) != len(value):
            return None, f"expected distinct integers, got {brief_list(value)}"
        return tuple(value), None

    return check


def name(value: Any) -> Checked:
    if isinstance(value, str) and NAME_PATTERN.fullmatch(value):
        return value, None
    return None, (
        f"expected a name of letters, digits, '.', '_' or '-' (it names files and log prefixes), "
        f"got {describe(value)}"
    )


PORT = integer(1, 65535)
POSITIVE = integer(1)

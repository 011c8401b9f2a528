"""The house's size limits, held in CI: no function over 60 lines and no module over 500 lines in
orchestrator/ or worker/.

A function counts from its `def` line to its last line (its decorators not included, its
docstring included); a nested function counts apart, and inside the one that holds it. A module
counts every line of its file.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "worker")
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500


def modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))


def function_lines(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(name, line of its def, its length) of every function and method in the tree."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno if node.end_lineno is not None else node.lineno
            found.append((node.name, node.lineno, end - node.lineno + 1))
    return found


def test_no_function_is_over_60_lines() -> None:
    over = []
    for path in modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, line, length in function_lines(tree):
            if length > MAX_FUNCTION_LINES:
                over.append(f"{path.relative_to(REPO)}:{line} {name}: {length} lines")
    assert over == []


def test_no_module_is_over_500_lines() -> None:
    over = []
    for path in modules():
        length = len(path.read_text(encoding="utf-8").splitlines())
        if length > MAX_MODULE_LINES:
            over.append(f"{path.relative_to(REPO)}: {length} lines")
    assert over == []


def test_the_count_starts_at_the_def_and_ends_at_the_last_line() -> None:
    source = "@decorator\ndef f(\n    x,\n):\n    '''doc'''\n    return x\n"
    assert function_lines(ast.parse(source)) == [("f", 2, 5)]

"""A run directory's file names are spelled once, in orchestrator/hostside/rundir.py (those that
orchestrator/contract.py defines, there, and rundir re-exports them): everything else, the host
programs and the controller alike, names them by rundir's constants, so that no two places can
drift apart on what a file is called.

A literal counts when it is the whole name: "exit.json" anywhere but a docstring; a name that
is also a common word elsewhere ("pid" an answer's key, "node" a JobSet's job, "stop_requested"
a probe's field) only where a path is made of it: an argument of a join, Path() or open(), an
operand of `/`, or beside another run-directory name in a tuple, list or set."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator import contract
from orchestrator.hostside import rundir

REPO = Path(__file__).resolve().parents[2]
RUNDIR = REPO / "orchestrator" / "hostside" / "rundir.py"
CONTRACT = REPO / "orchestrator" / "contract.py"
CONTRACT_NAMES = {v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str)}
PATH_CALLS = ("join", "joinpath", "Path", "PurePosixPath", "open")
# Where the same text names something else, and why.
ELSEWHERE = {
    ("orchestrator/machines/hostclient.py", rundir.AGENT_FILE): "the program's own file in "
    "hostside/, whose copy in a run directory is named after it",
}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the constants that are docstrings (or other bare strings)."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}


def in_path(node: ast.Constant, parents: dict[int, ast.AST]) -> bool:
    parent = parents.get(id(node))
    if isinstance(parent, ast.Call):
        func = parent.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in PATH_CALLS and node in parent.args
    if isinstance(parent, ast.BinOp):
        return isinstance(parent.op, ast.Div)
    if isinstance(parent, (ast.Tuple, ast.List, ast.Set)):
        others = [e for e in parent.elts if e is not node and isinstance(e, ast.Constant)]
        return any(other.value in rundir.NAMES for other in others)
    return False


def spelled(source: str) -> list[tuple[int, str]]:
    """(line, name) of each run-directory file name the source spells as a literal."""
    tree = ast.parse(source)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    skipped = docstrings(tree)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and id(node) not in skipped
        and node.value in rundir.NAMES
        and ("." in node.value or in_path(node, parents))
    )


def test_run_directory_names_are_spelled_only_in_rundir() -> None:
    found = []
    for root in ("orchestrator", "worker"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path == RUNDIR:
                continue
            where = path.relative_to(REPO).as_posix()
            for line, name in spelled(path.read_text(encoding="utf-8")):
                if path == CONTRACT and name in CONTRACT_NAMES:
                    continue
                if (where, name) not in ELSEWHERE:
                    found.append(f"{where}:{line}: {name!r}")
    assert found == [], "use orchestrator.hostside.rundir's constants:\n" + "\n".join(found)


def test_the_check_sees_a_name_where_a_path_is_made_of_it() -> None:
    source = (
        '"""Writes exit.json."""\nimport os\nos.path.join(run_dir, "stop_requested")\n'
        'x = {"stop_requested": True, "pid": 1}\ny = "exit.json"\n'
        'for name in ("pid", "worker.pid"):\n    pass\nz = Path(run_dir) / "node"\n'
    )
    assert spelled(source) == [(3, "stop_requested"), (5, "exit.json"), (6, "pid"),
                               (6, "worker.pid"), (8, "node")]  # fmt: skip


def test_rundir_reexports_the_contracts_names() -> None:
    for name in (contract.WORKER_LOG, contract.PROGRESS_FILE, contract.HISTORY_FILE,
                 contract.STACKS_FILE, contract.STACKS_PID_FILE):  # fmt: skip
        assert name in rundir.NAMES
    assert len(set(rundir.NAMES)) == len(rundir.NAMES)

"""Records that cross a process boundary are declared once (issue 55): the string keys spelled as
literals on both sides of one, counted, may not grow.

A key is a string literal used as a dict display's key, a subscript (`data["step"]`) or the first
argument of `.get`, `.pop` or `.setdefault`. The sides:
- the controller: orchestrator/ without hostside/ and without contract.py;
- the worker: worker/;
- the host programs: orchestrator/hostside/.
orchestrator/contract.py is where a key the controller and the worker share is declared once, as
a constant both sides import, and hostside/protocol.py (or the host module that writes or
validates the record: rundir.py's exit record, leasepolicy.py's leases, slurm_launcher.py's plan,
withenv.py's request) where a key of the controller and the host programs is: the literals of
contract.py and protocol.py are on neither side.

A key on both sides is either one record spelled twice (what this counts down) or two records
that happen to share a word ("name", "pid"): the count holds both, and may only go down. Print
the keys with `.venv/bin/python -m tests.unit.test_shared_keys`.

Figures (issue 55): controller/worker 23 before the records moved to contract.py; 21 with
TF_CONFIG built there; 3 with the progress file's keys, TF_CONFIG's, the standby's records, the
strategy names and the tensorboard directory there too. The 3 left are words two records share:
"name" and "step" (regex groups of a checkpoint's file name, worker/restore.py) and "outcome"
(the evaluator's last line).
Controller/host: 124 before (issue 55 counted 123); 103 with the probe record, the usage, the
exit record and the standby listing declared in protocol.py and rundir.py; 68 with the launch
request, the standby request, the verbs' request fields, info's answer and the host probe's
requests and answers there too; 23 with the lease program's requests, answers, lease records
and tickets declared in hostside/leasepolicy.py; 9 with the Slurm plan declared in
hostside/slurm_launcher.py (its tasks with the launch spec's keys) and TF_CONFIG's keys read by
contract.py's names in the launcher and procwatch.py; 1 with withenv's request and answer
declared in withenv.py (it imports nothing shipped: Python 3.6) and the stop file's in rundir.py.
The 1 left is a word two records share: "PYTHONPATH", Python's own variable (the TrainJob
export sets it for a pod, hostside/workerpath.py reads it as a worker's Python would).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORCHESTRATOR = REPO / "orchestrator"
HOSTSIDE = ORCHESTRATOR / "hostside"
DECLARED = (ORCHESTRATOR / "contract.py", HOSTSIDE / "protocol.py")

# The most keys spelled on both sides; lower it when a record moves (never raise it).
MAX_CONTROLLER_WORKER = 3
MAX_CONTROLLER_HOST = 1


def _key_literals(node: ast.AST) -> list[ast.expr | None]:
    if isinstance(node, ast.Dict):
        return list(node.keys)
    if isinstance(node, ast.Subscript):
        return [node.slice]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("get", "pop", "setdefault")
        and node.args
    ):
        return [node.args[0]]
    return []


def keys(paths: Iterable[Path]) -> dict[str, list[str]]:
    """Each string key spelled in the files, with where (path:line)."""
    found: dict[str, list[str]] = {}
    for path in sorted(paths):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for literal in _key_literals(node):
                if isinstance(literal, ast.Constant) and isinstance(literal.value, str):
                    where = f"{path.relative_to(REPO)}:{literal.lineno}"
                    found.setdefault(literal.value, []).append(where)
    return found


def controller() -> list[Path]:
    return [
        path
        for path in ORCHESTRATOR.rglob("*.py")
        if HOSTSIDE not in path.parents and path not in DECLARED
    ]


def worker() -> list[Path]:
    return list((REPO / "worker").rglob("*.py"))


def host() -> list[Path]:
    return [path for path in HOSTSIDE.rglob("*.py") if path not in DECLARED]


def shared(one: list[Path], other: list[Path]) -> dict[str, tuple[list[str], list[str]]]:
    """The keys spelled on both sides, with where on each."""
    first, second = keys(one), keys(other)
    return {key: (first[key], second[key]) for key in sorted(set(first) & set(second))}


def test_the_keys_spelled_by_both_the_controller_and_the_worker_do_not_grow() -> None:
    both = shared(controller(), worker())
    assert len(both) <= MAX_CONTROLLER_WORKER, sorted(both)


def test_the_keys_spelled_by_both_the_controller_and_the_host_programs_do_not_grow() -> None:
    both = shared(controller(), host())
    assert len(both) <= MAX_CONTROLLER_HOST, sorted(both)


if __name__ == "__main__":
    for title, other in (("controller/worker", worker()), ("controller/host", host())):
        both = shared(controller(), other)
        print(f"{title}: {len(both)}")
        for key, (here, there) in both.items():
            print(f"  {key}: {', '.join(here[:2])} | {', '.join(there[:2])}")

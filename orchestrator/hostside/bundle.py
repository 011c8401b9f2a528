"""The shipped form of a stdlib-only program: its source with the modules it imports carried in
front of it, as one text. Pure.

A program is sent alone (`python -c SOURCE` over SSH or locally, the agent's copy of itself in
a run directory, the launcher inside a Slurm batch script, the pod's command of a TrainJob), so
what it imports of its own has to travel inside it: the modules of orchestrator/hostside/, and
orchestrator/contract.py (what the controller, the worker and the host programs agree on). The
text first puts each module it imports (procwatch, rundir, contract, and theirs, dependencies
first) into sys.modules under its plain name, then runs the program, whose shipped branch
imports them by that name (`if __package__: from orchestrator.hostside import rundir else:
import rundir`; `from orchestrator import contract` else `import contract`). A host never looks
for them on its sys.path: nothing planted in the working directory, nor an orchestrate
installed there (a container's image), is imported.

Host programs need Python 3.7 or newer: contract.py has `from __future__ import annotations`.
A program itself never has a __future__ import: the text in front of it would make it a
SyntaxError (only a carried module may have one, compiled on its own).
"""

from __future__ import annotations

import ast
import threading
from functools import cache
from importlib import resources

HOSTSIDE = "orchestrator.hostside"
# The one module of orchestrator outside hostside/ that host programs import: by this plain name.
CONTRACT = "contract"
# CPython 3.11's ast.parse is not safe in several threads at once (it fails with "SystemError:
# AST constructor recursion depth mismatch"; python/cpython#106905), and the fan-out opens every
# host's session from its own thread: one parse at a time, and each program bundled once.
_PARSING = threading.Lock()


@cache
def hostside_source(name: str) -> str:
    """The source of hostside/NAME (e.g. "agent.py"); "contract.py" is orchestrator/contract.py."""
    package = "orchestrator" if name == f"{CONTRACT}.py" else HOSTSIDE
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


# The package's face, and this module: the controller's, never carried to a host.
NOT_SHIPPED = ("__init__.py", "bundle.py")


def _shipped_modules() -> frozenset[str]:
    names = (entry.name for entry in resources.files(HOSTSIDE).iterdir())
    own = {n[: -len(".py")] for n in names if n.endswith(".py") and n not in NOT_SHIPPED}
    return frozenset({*own, CONTRACT})


def imported(source: str) -> list[str]:
    """The shippable modules `source` imports by their plain name (`import procwatch`)."""
    shipped = _shipped_modules()
    found = []
    with _PARSING:
        tree = ast.parse(source)
    for node in ast.walk(tree):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [name for name in names if name in shipped and name not in found]
    return found


def companions(source: str) -> list[str]:
    """Every module the program needs shipped with it, each after the ones it imports."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in path:
            raise ValueError(f"{name}.py imports itself: {' -> '.join((*path, name))}")
        for needed in imported(hostside_source(f"{name}.py")):
            visit(needed, (*path, name))
        order.append(name)

    for name in imported(source):
        visit(name, ())
    return order


def bundle(source: str, label: str) -> str:
    """`source` as it is shipped: unchanged when it imports nothing shippable."""
    names = companions(source)
    if not names:
        return source
    entries = "".join(f"    ({name!r}, {hostside_source(name + '.py')!r}),\n" for name in names)
    # Python 3.7 and newer (contract.py's __future__ import); names kept out of the program's.
    preamble = (
        f"# orchestrate: {label} shipped with {', '.join(n + '.py' for n in names)} "
        "(orchestrator/hostside/bundle.py)\n"
        "import sys as _bundle_sys, types as _bundle_types\n"
        "for _bundle_name, _bundle_source in (\n"
        f"{entries}"
        "):\n"
        "    _bundle_module = _bundle_types.ModuleType(_bundle_name)\n"
        "    _bundle_module.__file__ = '<shipped ' + _bundle_name + '.py>'\n"
        "    _bundle_sys.modules[_bundle_name] = _bundle_module\n"
        "    exec(compile(_bundle_source, _bundle_module.__file__, 'exec'), "
        "_bundle_module.__dict__)\n"
        "del _bundle_sys, _bundle_types, _bundle_name, _bundle_source, _bundle_module\n"
    )
    return preamble + source


@cache
def shipped_program(name: str) -> str:
    """hostside/NAME as it is sent to a host (a Slurm node, a pod)."""
    return bundle(hostside_source(name), name)

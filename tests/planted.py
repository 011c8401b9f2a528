"""Modules a neighbour plants where orchestrate's host programs start (issue 40): in the working
directory, on PYTHONPATH, in the user site. Each planted module writes one line naming the
program that imported it (its argv[0]) to a marker file, then steps aside for the real module,
so the run goes on and the test sees every import at the end instead of one crash.

A host program is started as `python -c SOURCE` (argv[0] "-c") or from its copy in a run
directory (`agent.py supervise`, `agent.py standby`): `host_program_imports` lists what such a
program imported of the planted ones. A worker is the job's own program, run in the job's
environment: what it imports from PYTHONPATH is the user's business, and is not counted.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

# Standard-library modules a host program imports after start-up (site.py has not imported them
# yet, so sys.path decides which file is found), and the names of the modules shipped with it.
STDLIB_NAMES = ("json", "select", "fcntl", "hashlib", "socket", "subprocess", "selectors", "shlex")
SHIPPED_NAMES = ("procwatch", "safefiles", "contract", "rundir", "protocol", "psutil")
HOST_PROGRAM_FILES = ("agent.py",)

PLANTED = """\
# planted by a test: say who imported this, then step aside for the real module
import os as _os, sys as _sys
with open({marker!r}, "a") as _file:
    _file.write(repr(_sys.argv[0]) + " " + __name__ + "\\n")
_kept = list(_sys.path)
_sys.path[:] = [p for p in _kept if _os.path.abspath(p or ".") != {directory!r}]
del _sys.modules[__name__]
import importlib as _importlib
try:
    _sys.modules[__name__] = _importlib.import_module(__name__)
finally:  # ImportError for a name with no real module (psutil not installed): as if absent
    _sys.path[:] = _kept
"""


ALL_NAMES = STDLIB_NAMES + SHIPPED_NAMES


def plant(directory: Path, marker: Path, names: tuple[str, ...] = ALL_NAMES) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        text = PLANTED.format(marker=str(marker), directory=str(directory.resolve()))
        (directory / f"{name}.py").write_text(text)


def python_with(path: Path, python: str, **env: Path) -> str:
    """A host's `python`: `python` with these variables set (a login environment of a shared
    machine: every process started through it, host programs and workers, gets them)."""
    settings = " ".join(f"{name}={value}" for name, value in env.items())
    path.write_text(f'#!/bin/sh\n{settings} exec {python} "$@"\n')
    path.chmod(0o755)
    return str(path)


def user_site(python: str, user_base: Path) -> Path:
    """Where `python` looks for the user's site-packages under PYTHONUSERBASE=user_base."""
    found = subprocess.run(
        [python, "-c", "import site; print(site.getusersitepackages())"],
        env={"PYTHONUSERBASE": str(user_base), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(found.stdout.strip())


def host_program_imports(marker: Path) -> list[str]:
    """The planted modules a host program imported (a line per import)."""
    if not marker.exists():
        return []
    lines = marker.read_text().splitlines()
    return [
        line for line in lines
        if line.startswith("'-c' ") or any(f"{name}' " in line for name in HOST_PROGRAM_FILES)
    ]  # fmt: skip


def all_imports(marker: Path) -> list[str]:
    return marker.read_text().splitlines() if marker.exists() else []

"""Where a worker started by this interpreter will import from. STANDARD LIBRARY ONLY; shipped
with the host probe (hostprobe.py) and the Slurm node probe (backends/slurm/checks.py).

Both probes run isolated (`python -I`: no working directory, PYTHONPATH or user site on their
own sys.path, so nothing planted there runs in them); a worker does not. They answer what the
worker will find (TensorFlow's version, the worker package) by reading these directories as
data: package metadata, finders given a path, never an import from them.
"""

import os
import site
import sys

SITE_DIRECTORIES = ("site-packages", "dist-packages")  # dist-packages: Debian's python3


def worker_path(cwd=None):
    """A built-in worker's sys.path: PYTHONPATH, then this interpreter's own path with the user
    site before its site-packages; `cwd` last where Python has the safe path (3.11+: the
    controller starts `python -m worker` with it, contract.SAFE_PATH_ENV), else first."""
    extra = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    path = [entry for entry in sys.path if entry]
    sites = [i for i, entry in enumerate(path) if entry.endswith(SITE_DIRECTORIES)]
    path.insert(sites[0] if sites else len(path), site.getusersitepackages())
    if not cwd:
        return list(dict.fromkeys(extra + path))
    if sys.version_info >= (3, 11):
        return list(dict.fromkeys([*extra, *path, cwd]))
    return list(dict.fromkeys([cwd, *extra, *path]))

"""Where a built-in worker's modules come from: orchestrate's first, the user's directory last.

`python -m worker` puts its working directory first on sys.path, so a `worker.py` of the user's
there (a common name in training code) replaced orchestrate's package and the job failed. The
controller starts built-in workers with Python's safe path instead (contract.SAFE_PATH_ENV,
Python 3.11+); `user_directory_last()` then puts the directory back, at the end, before the
task's module is imported.
"""

from __future__ import annotations

import os
import sys

from orchestrator.contract import SAFE_PATH_ENV, USER_DIRECTORY_LAST_ENV


def user_directory_last() -> None:
    """The working directory at the end of sys.path, and the safe-path variables dropped (the
    user's own subprocesses start as usual); nothing unless the controller asked for it."""
    if os.environ.pop(USER_DIRECTORY_LAST_ENV, None) != "1":
        return
    os.environ.pop(SAFE_PATH_ENV, None)
    directory = os.getcwd()
    if directory not in sys.path:
        sys.path.append(directory)

"""The worker's own log lines. The controller tails them from the worker's log file while it runs,
so every line is flushed at once."""

from __future__ import annotations

import sys


def log(message: str) -> None:
    """One line on stdout."""
    print(message, flush=True)


def warn(message: str) -> None:
    """One line on stderr: something was asked for that this run does not do, but it goes on."""
    print(message, file=sys.stderr, flush=True)

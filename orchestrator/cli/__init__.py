"""The command line: the only place that prints and picks exit codes.

`app` holds the command group and main(); the other modules add their commands to it.
"""

from orchestrator.cli import dashboard, local, preflight, run, views  # noqa: F401 - they register
from orchestrator.cli.app import cli, main

__all__ = ["cli", "main"]

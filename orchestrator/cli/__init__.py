"""The command line: the only place that prints and picks exit codes.

`app` holds the command group and main(); the other modules add their commands to it when a
command of theirs is asked for (app.COMMAND_MODULES).
"""

from orchestrator.cli.app import cli, main

__all__ = ["cli", "main"]

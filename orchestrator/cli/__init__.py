"""The command line: the only place that prints and picks exit codes.

`app` holds the command group and main(); the other modules add their commands to it.
"""

from orchestrator.cli import (  # noqa: F401 - they register commands
    check,
    dashboard,
    export,
    hosts,
    jobs,
    local,
    notify,
    run,
    views,
)
from orchestrator.cli.app import cli, main

__all__ = ["cli", "main"]

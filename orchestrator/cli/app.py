"""The `orchestrate` command group, its consoles and shared options, and main()."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click
from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

from orchestrator import __version__
from orchestrator.paths import DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import (
    OrchestrateError,
)
from orchestrator.model.printable import printable


class PlainTextConsole(Console):
    """A Console that passes on no control character it was handed (issue 41): a worker's log
    line, a host's error or a lease file's name printed here cannot retitle or clear the
    terminal it reaches, or the log a detached supervisor writes.

    Every string goes through model/printable before Rich reads it (Rich itself drops BEL and
    CR but keeps ESC); a Text built elsewhere is checked once rendered, before Rich adds its
    own styles and cursor moves (segments marked as control). The render layer (render.py)
    makes the cells of host text printable itself, so that a table is measured as it shows."""

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(printable(text, multiline=True), **options)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or segment.text.isprintable():
                yield segment
            else:
                yield segment._replace(text=printable(segment.text, multiline=True))


WIDTH_ENV = "ORCHESTRATE_WIDTH"


def output_width(stream: TextIO) -> int | None:
    """$ORCHESTRATE_WIDTH when set (a number); else a terminal's own width (None: Rich asks
    it); else 160: piped output is read by people too (CI logs, `| less`), give tables room.
    Not $COLUMNS: shells and CI runners export it (80) where output goes to a log."""
    columns = os.environ.get(WIDTH_ENV, "")
    if columns.isdigit() and 20 <= int(columns) <= 1000:
        return int(columns)
    return None if stream.isatty() else 160


console = PlainTextConsole(width=output_width(sys.stdout))
errors = PlainTextConsole(stderr=True, width=output_width(sys.stderr))

EXIT_INTERRUPTED = 130


class Context:
    """What every command shares: the state directory's run store, made when first used (the
    store's import pulls in every backend: `--version` and `--help` need none of it)."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self._store: RunStore | None = None

    @property
    def store(self) -> RunStore:
        if self._store is None:
            from orchestrator.engine.store.runstore import RunStore

            self._store = RunStore(self.state_dir)
        return self._store


pass_context = click.make_pass_decorator(Context)
run_option = click.option(
    "--run", "run_id", metavar="RUN_ID", help="Act on this run instead of the latest one."
)
# The inventory file a command reads; `inventory` names the Inventory loaded from it.
inventory_argument = click.argument(
    "inventory_file", metavar="INVENTORY", type=click.Path(dir_okay=False, path_type=Path)
)


# Each command's module, imported when the command runs (or `--help` lists it): the CLI starts
# without importing what other commands need (tests/unit/test_cli_start.py keeps this complete).
COMMAND_MODULES = {
    "check": "check", "firewall": "check", "dashboard": "dashboard", "export": "export",
    "hosts": "hosts", "setup": "hosts", "jobs": "jobs", "up": "run", "supervise": "run",
    "attach": "run", "down": "run", "local": "local", "notify": "notify", "status": "views",
    "tail": "views", "stacks": "views", "tensorboard": "views", "pull-export": "views",
}  # fmt: skip


class LazyGroup(click.Group):
    """A group whose commands register themselves when their module is imported, on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMAND_MODULES) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            importlib.import_module(f"orchestrator.cli.{COMMAND_MODULES[cmd_name]}")
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orchestrate")
@click.option(
    "--state-dir",
    envvar="ORCHESTRATE_STATE_DIR",
    default=DEFAULT_STATE_DIR,
    show_default=True,
    metavar="DIR",
    help="Where runs are recorded, so later commands from any shell find them "
    "(env: ORCHESTRATE_STATE_DIR).",
)
@click.pass_context
def cli(ctx: click.Context, state_dir: str) -> None:
    """Launch, watch and stop TensorFlow MultiWorkerMirroredStrategy training on several machines
    from one YAML inventory.

    \b
    orchestrate check inventory/local.yaml  find what would make the cluster fail or hang
    orchestrate up inventory/local.yaml     check, start every worker, watch until the job ends
    orchestrate status                      state, step, loss and checkpoint of each worker
    orchestrate tail -f                     follow every worker's log, prefixed by its name
    orchestrate down                        stop every worker of the run
    """
    ctx.obj = Context(state_dir)


class StoppedWatching(OrchestrateError):
    exit_code = EXIT_INTERRUPTED

    def __init__(self) -> None:
        super().__init__(
            "stopped watching; the workers keep running",
            hint="'orchestrate status', 'orchestrate tail -f', or 'orchestrate down' to stop them",
        )


class StillSupervised(OrchestrateError):
    """Ctrl-C on a process that supervised a run: the supervision goes on, detached."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, run_id: str, pid: int) -> None:
        super().__init__(
            f"stopped watching; run {run_id} stays supervised: a detached supervisor (pid {pid}) "
            "restarts it when a worker fails",
            hint="'orchestrate attach' re-enters the live view; 'orchestrate down' stops the run",
        )


def main() -> None:
    try:
        cli.main(standalone_mode=False, prog_name="orchestrate")
    except OrchestrateError as error:
        # A host's error carries its words (stderr, an answer): shown, never obeyed.
        message = printable(error.message, multiline=True)
        errors.print(Text.assemble(("error: ", "bold red"), message), highlight=False)
        if error.hint:
            errors.print(f"hint: {error.hint}", markup=False, highlight=False)
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        errors.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)

"""Small formatters the terminal views share: a size, a number, a worker's step, a cell of
text orchestrate did not write (a duration is model/timetext's). Pure; no printing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from orchestrator.model.printable import printable
from orchestrator.model.vocabulary import WorkerState

if TYPE_CHECKING:  # only a type here: the status module pulls in the engine (`check`'s start)
    from orchestrator.engine.observe.status import WorkerStatus

STATE_STYLES = {
    WorkerState.PENDING: "dim",
    WorkerState.STARTING: "yellow",
    WorkerState.RUNNING: "cyan",
    WorkerState.SUCCEEDED: "green",
    WorkerState.FAILED: "bold red",
    WorkerState.STOPPED: "magenta",
    WorkerState.UNKNOWN: "red",
}


def shown(value: str) -> Text:
    """A table cell of text orchestrate did not write: printable, and no markup."""
    return Text(printable(value))


def size(rss: int | None) -> str:
    return "-" if rss is None else f"{rss / 2**20:.0f} MiB"


def number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def devices(names: tuple[str, ...]) -> str:
    """ "/device:GPU:0" → "GPU:0"; the worker lists only its own devices."""
    return ", ".join(name.removeprefix("/device:") for name in names) or "-"


def step_text(worker: WorkerStatus) -> str:
    if worker.step is None:
        return "-"
    return f"{worker.step}/{worker.target_steps}" if worker.target_steps else str(worker.step)


def checkpoint_text(worker: WorkerStatus) -> str:
    return "-" if worker.checkpoint_step is None else str(worker.checkpoint_step)

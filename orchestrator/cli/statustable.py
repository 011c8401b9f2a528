"""The status table, sized to the terminal it is printed on: `status`, and the live view of `up`
and `attach`.

At 80 columns every column cannot show whole, and a table that squeezes them all shows none
(`w… s… l…`). So the table picks its columns when it is rendered, from the width it is given:
the ones a person reads first (worker, state, step, loss) whole, then the others in the order of
COLUMN_PRIORITY while they fit; the rest are left out, never folded. What every worker shares
(the lockstep step and loss of MultiWorkerMirroredStrategy, a checkpoint) is said once, on the
run's line above the table, instead of once per worker."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from orchestrator.cli.format import (
    STATE_STYLES,
    checkpoint_text,
    devices,
    number,
    shown,
    size,
    step_text,
)
from orchestrator.engine.observe.rolepolicy import labelled
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.model.printable import printable
from orchestrator.model.timetext import duration

Cell = Callable[[WorkerStatus], str]


@dataclass(frozen=True)
class Column:
    header: str
    cell: Cell
    right: bool = False  # numbers are right-justified
    shared: bool = False  # said once on the run's line when every worker has the same value


# The table's order, left to right.
COLUMNS = (
    Column("worker", lambda w: labelled(w.name, w.role)),
    Column("#", lambda w: str(w.index), right=True),
    Column("host", lambda w: w.host),
    Column("state", lambda w: w.state.value),
    Column("pid", lambda w: str(w.pid or "-"), right=True),
    Column("step", step_text, right=True, shared=True),
    Column("loss", lambda w: number(w.loss), shared=True),
    Column("acc", lambda w: number(w.accuracy, 3), shared=True),
    Column("val_loss", lambda w: number(w.val_loss), shared=True),
    Column("val_acc", lambda w: number(w.val_accuracy, 3), shared=True),
    Column("ckpt", checkpoint_text, shared=True),
    Column("steps/s", lambda w: number(w.steps_per_sec, 3), right=True),
    Column("uptime", lambda w: duration(w.uptime), right=True),
    Column("cpu%", lambda w: number(w.cpu_percent, 3), right=True),
    Column("mem", lambda w: size(w.rss_bytes), right=True),
    Column("devices", lambda w: devices(w.devices)),
)

# Which columns a narrower terminal keeps, first to last.
COLUMN_PRIORITY = (
    "worker", "state", "step", "loss", "acc", "val_loss", "val_acc", "ckpt", "steps/s",
    "host", "pid", "#", "uptime", "cpu%", "mem", "devices",
)  # fmt: skip

# Rich's default box: one border on the left, then each column's text, a space either side and
# its right border.
BORDER, PER_COLUMN = 1, 3


def fitted(widths: Mapping[str, int], width: int) -> list[str]:
    """The columns that fit `width`, in the table's order: taken in COLUMN_PRIORITY while they
    fit whole (a column that does not fit is skipped; a narrower one after it may still fit).
    The first column is always kept."""
    chosen: set[str] = set()
    used = BORDER
    for name in COLUMN_PRIORITY:
        if name not in widths:
            continue
        needed = widths[name] + PER_COLUMN
        if used + needed <= width or not chosen:
            chosen.add(name)
            used += needed
    return [c.header for c in COLUMNS if c.header in chosen]


def shared_values(workers: Sequence[WorkerStatus]) -> dict[str, str]:
    """The shared columns whose value every worker has (two workers or more), with a value:
    under MultiWorkerMirroredStrategy the step and loss are the run's, not a worker's."""
    if len(workers) < 2:
        return {}
    found = {}
    for column in COLUMNS:
        if column.shared:
            values = {column.cell(w) for w in workers}
            if len(values) == 1 and values != {"-"}:
                found[column.header] = values.pop()
    return found


def cell_widths(rows: Iterable[dict[str, str]], headers: Iterable[str]) -> dict[str, int]:
    widths = {header: Text(header).cell_len for header in headers}
    for row in rows:
        for header, value in row.items():
            if header in widths:
                widths[header] = max(widths[header], Text(printable(value)).cell_len)
    return widths


@dataclass(frozen=True)
class StatusTable:
    """The run's line and its workers' table; columns chosen when rendered (a Rich renderable,
    so the console it is printed on decides the width)."""

    status: RunStatus
    title: Text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        workers = self.status.workers
        once = shared_values(workers)
        title = self.title.copy()
        if once:
            title.append("\n" + "  ".join(f"{k} {printable(v)}" for k, v in once.items()))
        rows = [{c.header: c.cell(w) for c in COLUMNS} for w in workers]
        headers = [c.header for c in COLUMNS if c.header not in once]
        names = fitted(cell_widths(rows, headers), options.max_width)
        table = Table(title=title, title_justify="left", expand=False)
        columns = {c.header: c for c in COLUMNS}
        for name in names:
            table.add_column(name, justify="right" if columns[name].right else "left",
                             no_wrap=True)  # fmt: skip
        for worker, row in zip(workers, rows, strict=True):
            cells = [shown(row[name]) for name in names]
            if "state" in names:
                state = names.index("state")
                cells[state] = Text(row["state"], STATE_STYLES[worker.state])
            table.add_row(*cells)
        yield table


def run_progress(workers: Sequence[WorkerStatus]) -> tuple[int, int] | None:
    """The run's step and target: the slowest stepping worker's (a synchronous run moves at its
    pace), None before any worker says both."""
    pairs = [(w.step, w.target_steps) for w in workers if w.step is not None and w.target_steps]
    if not pairs:
        return None
    step = min(step for step, _ in pairs)
    target = max(target for _, target in pairs if target is not None)
    return step, target


def progress_bar(status: RunStatus, now: float) -> Table | None:
    """The live view's last line: a bar of the run's steps, its elapsed time and ETA."""
    progress = run_progress(status.workers)
    elapsed = None if status.started_at is None else max(0.0, now - status.started_at)
    if progress is None and elapsed is None:
        return None
    words = []
    if progress is not None:
        words.append(f"step {progress[0]}/{progress[1]}")
    if elapsed is not None:
        words.append(f"elapsed {duration(elapsed)}")
    if status.eta_seconds is not None:
        words.append(f"ETA {duration(status.eta_seconds)}")
    line = Table.grid(padding=(0, 2))
    line.add_column(width=30 if progress else 0)
    line.add_column()
    bar = ProgressBar(total=progress[1], completed=min(progress), width=30) if progress else ""
    line.add_row(bar, "  ".join(words))
    return line

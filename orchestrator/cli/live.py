"""The live view of a run, and supervising it in this process (`up`, `supervise`, `attach`): a
table on a terminal, a line per change elsewhere; at the end, the run's goodput, what it leaves
warm and its conclusion."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from rich.console import Group
from rich.live import Live
from rich.text import Text

from orchestrator.backends.base import Backend
from orchestrator.cli.app import StoppedWatching, console, errors
from orchestrator.cli.render import kept_warm, problems, progress_line, status_table
from orchestrator.engine.goodput import run_account, summary
from orchestrator.engine.locks import SupervisorLock
from orchestrator.engine.policy import conclude
from orchestrator.engine.runstore import RunStore
from orchestrator.engine.status import RunStatus
from orchestrator.engine.supervise import Supervisor
from orchestrator.errors import JobFailed, OrchestrateError, RunStateError
from orchestrator.model.printable import printable
from orchestrator.model.records import RunRecord
from orchestrator.model.vocabulary import WorkerState

PLAIN_REPORT_EVERY = 15.0  # seconds between progress lines when the output is not a terminal


@contextmanager
def view() -> Iterator[tuple[Callable[[RunStatus], None], Callable[[str], None]]]:
    """A live table on a terminal; plain lines on state changes elsewhere (logs, pipes)."""
    if console.is_terminal:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            yield (
                lambda status: live.update(  # a problem's line is plain text, not markup
                    Group(status_table(status), *map(Text, problems(status))), refresh=True
                ),
                lambda message: live.console.print(message, markup=False, highlight=False),
            )
    else:
        yield (
            PlainReporter().report,
            lambda message: console.print(message, markup=False, highlight=False),
        )


class PlainReporter:
    """Prints a worker's line when its state changes, and all of them every few seconds."""

    def __init__(self) -> None:
        self.states: dict[str, WorkerState] = {}
        self.last = 0.0

    def report(self, status: RunStatus) -> None:
        now = time.monotonic()
        periodic = now - self.last >= PLAIN_REPORT_EVERY
        for worker in status.workers:
            if periodic or self.states.get(worker.name) != worker.state:
                console.print(progress_line(worker), markup=False, highlight=False)
            self.states[worker.name] = worker.state
        if periodic:
            self.last = now


def supervise_here(store: RunStore, backend: Backend, record: RunRecord, interval: float) -> None:
    lock = SupervisorLock(store.lock_path(record.run_id))
    if not lock.acquire():
        raise RunStateError(
            f"run {record.run_id} is already supervised by another process",
            hint="'orchestrate attach' shows its live view",
        )
    try:
        with view() as (show, say):
            supervisor = Supervisor(store, backend, record, show=show, say=say, interval=interval)
            try:
                final = supervisor.run()
            except JobFailed:
                with suppress(OrchestrateError):  # the failure is what the user must see
                    epilogue(store.load(record.run_id), supervisor.last_status, backend)
                raise
    except KeyboardInterrupt:
        raise StoppedWatching() from None
    finally:
        lock.release()
    ended = store.load(record.run_id)
    epilogue(ended, final, backend)
    finish(final, ended)


def epilogue(record: RunRecord, final: RunStatus | None, backend: Backend) -> None:
    """The run's goodput, and what it leaves running: its standbys kept warm (the hosts'
    own listing; a host not answering lists none)."""
    errors.print(summary(run_account(record, final, time.time())), markup=False,
                 highlight=False)  # fmt: skip
    if backend.keeper is None:  # a backend that keeps no standbys (Slurm)
        return
    try:
        standbys = {n: s for n, s in backend.keeper.standbys(record.workers).ok.items() if s}
    except OrchestrateError:
        return
    warm = kept_warm(standbys)
    if warm:
        errors.print(warm, markup=False, highlight=False)


def finish(final: RunStatus, record: RunRecord) -> None:
    # The conclusion names the root cause, a worker's own words: printable, and not markup.
    errors.print(Text(printable(conclude(final, record)), style="green"), highlight=False)

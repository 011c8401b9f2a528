"""The live view of a run, and supervising it in this process (`up`, `supervise`, `attach`): a
table on a terminal, a line per change elsewhere; at the end, the run's goodput, what it leaves
warm and its conclusion."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from rich.console import Group
from rich.live import Live
from rich.text import Text

from orchestrator.backends.base import Backend
from orchestrator.backends.capabilities import Reach
from orchestrator.cli.app import StillSupervised, StoppedWatching, console, errors
from orchestrator.cli.render import kept_warm, problems, progress_line, run_line, status_table
from orchestrator.cli.statustable import progress_bar
from orchestrator.engine.observe.advice import goodput_advice
from orchestrator.engine.observe.goodput import run_account, summary
from orchestrator.engine.observe.status import RunStatus
from orchestrator.engine.store.exports import chief_export_dir, export_is_remote
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.locks import SupervisorLock, wait_held
from orchestrator.engine.supervision.policy import conclude
from orchestrator.engine.supervision.supervise import Supervisor
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
                lambda status: live.update(terminal_view(status), refresh=True),
                lambda message: live.console.print(message, markup=False, highlight=False),
            )
    else:
        yield (
            PlainReporter().report,
            lambda message: console.print(message, markup=False, highlight=False),
        )


def terminal_view(status: RunStatus) -> Group:
    """The table, the progress bar and each problem's line (plain text, not markup)."""
    bar = progress_bar(status, time.time())
    return Group(status_table(status), *([bar] if bar else []), *map(Text, problems(status)))


class PlainReporter:
    """Prints a worker's line when its state changes, and all of them every few seconds: one
    line for the run when its workers step in lockstep (MultiWorkerMirroredStrategy), where a
    line per worker would say the same step and loss N times."""

    def __init__(self) -> None:
        self.states: dict[str, WorkerState] = {}
        self.last = 0.0

    def report(self, status: RunStatus) -> None:
        now = time.monotonic()
        periodic = now - self.last >= PLAIN_REPORT_EVERY
        changed = [w for w in status.workers if self.states.get(w.name) != w.state]
        together = run_line(status)
        shown = status.workers if periodic and together is None else changed
        for worker in shown:
            console.print(progress_line(worker), markup=False, highlight=False)
        if periodic and together is not None and not changed:
            console.print(together, markup=False, highlight=False)
        self.states = {w.name: w.state for w in status.workers}
        if periodic:
            self.last = now


def supervise_here(
    store: RunStore, backend: Backend, record: RunRecord, interval: float, hand_over: bool = True
) -> None:
    """Supervise the run in this process until it ends. Ctrl-C stops watching, not supervising:
    with `hand_over` a detached supervisor takes the run over (a person at a terminal expects
    the run to stay looked after, as `up -d`'s is)."""
    lock = SupervisorLock(store.lock_path(record.run_id))
    if not lock.wait(SUPERVISOR_START_WAIT):
        raise RunStateError(
            f"run {record.run_id} is already supervised by another process",
            hint="'orchestrate attach' shows its live view",
        )
    interrupted = False
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
        interrupted = True
    finally:
        lock.release()  # before the hand-over: the detached supervisor takes this lock
    if interrupted:
        raise hand_over_supervision(store, record.run_id) if hand_over else StoppedWatching()
    ended = store.load(record.run_id)
    epilogue(ended, final, backend)
    finish(final, ended)


SUPERVISOR_START_WAIT = 2.0  # seconds a supervisor waits out a look at its lock (FileLock.wait)
HANDOVER_WAIT = 30.0  # seconds a Ctrl-C waits for the detached supervisor to hold the run


def hand_over_supervision(store: RunStore, run_id: str) -> OrchestrateError:
    """After Ctrl-C: a detached supervisor for the run, unless it gave up or was stopped
    meanwhile (one started for a run that has just succeeded ends at its first look). A second
    Ctrl-C while it starts is ignored (it would leave the run with no supervisor)."""
    record = store.load(run_id)
    if record.outcome is not None or record.stop_requested:
        return StoppedWatching()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        pid = spawn_supervisor(store, run_id)
        # Said once it is true: the new supervisor holds the run (a worker lost in between is
        # its first poll's), or it has already ended (the run ended meanwhile).
        wait_held(SupervisorLock(store.lock_path(run_id)), lambda: child_running(pid),
                  HANDOVER_WAIT)  # fmt: skip
        return StillSupervised(run_id, pid)
    finally:
        signal.signal(signal.SIGINT, previous)


def child_running(pid: int) -> bool:
    """Whether this process's child `pid` has not exited (an exited one is reaped here)."""
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def spawn_supervisor(store: RunStore, run_id: str) -> int:
    """The detached `orchestrate supervise RUN_ID`: its own session, so it outlives this
    command and its terminal; its output goes to the run's log in the state directory. It
    inherits this environment: the job's secret_env values for restarts live there, in memory."""
    with store.open_private(store.log_path(run_id), append=True) as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "--state-dir", str(store.root.resolve()),
             "supervise", run_id],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return process.pid


def epilogue(record: RunRecord, final: RunStatus | None, backend: Backend) -> None:
    """The run's goodput and what it advises, where its exported model is, and what it leaves
    running: its standbys kept warm (the hosts' own listing; a host not answering lists none)."""
    account = run_account(record, final, time.time())
    errors.print(summary(account), markup=False, highlight=False)
    for line in goodput_advice(account, record.inventory.job):
        errors.print(f"  advice: {line}", markup=False, highlight=False)
    if final is not None and final.state is WorkerState.SUCCEEDED:
        exported = export_line(record, backend)
        if exported:
            errors.print(exported, markup=False, highlight=False)
    if backend.keeper is None:  # a backend that keeps no standbys (Slurm)
        return
    try:
        standbys = {n: s for n, s in backend.keeper.standbys(record.workers).ok.items() if s}
    except OrchestrateError:
        return
    warm = kept_warm(standbys)
    if warm:
        errors.print(warm, markup=False, highlight=False)


def export_line(record: RunRecord, reach: Reach) -> str | None:
    """Where the job's exported model is (job.export), and how to fetch it from a remote chief."""
    if record.inventory.job.export is None:
        return None
    chief = record.workers[0]
    where = chief_export_dir(chief)
    if export_is_remote(record, reach):
        return printable(f"exported model: {where} on {chief.host.name} ('orchestrate "
                         "pull-export' copies it here)")  # fmt: skip
    return printable(f"exported model: {where}")


def finish(final: RunStatus, record: RunRecord) -> None:
    # The conclusion names the root cause, a worker's own words: printable, and not markup.
    errors.print(Text(printable(conclude(final, record)), style="green"), highlight=False)

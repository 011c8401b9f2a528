"""`up`, `supervise`, `attach` and `down`: starting, supervising and stopping a run."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Group
from rich.live import Live

from orchestrator.cli.app import (
    Context,
    StoppedWatching,
    cli,
    console,
    errors,
    pass_context,
    run_option,
)
from orchestrator.cli.dashboard import DEFAULT_PORT as DASHBOARD_PORT
from orchestrator.cli.dashboard import spawn_dashboard
from orchestrator.cli.preflight import (
    blocking_error,
    min_free_option,
    probe_timeout_option,
    run_checks,
    show_findings,
)
from orchestrator.connect import Machines
from orchestrator.errors import (
    JobFailed,
    MissingTool,
    PartialFailure,
    RunStateError,
)
from orchestrator.inventory import load_inventory
from orchestrator.lifecycle import (
    DEFAULT_GRACE,
    StopReport,
    start_run,
    stop_run,
)
from orchestrator.render import (
    failure_report,
    problems,
    progress_line,
    status_table,
)
from orchestrator.runstore import RunRecord, RunStore
from orchestrator.state import WorkerState
from orchestrator.status import RunStatus, collect_status
from orchestrator.supervise import Supervisor, SupervisorLock, refuse_if_active, stop_flag

PLAIN_REPORT_EVERY = 15.0  # seconds between progress lines when the output is not a terminal


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--detach", "-d", is_flag=True, help="Return once every worker has started.")
@click.option("--skip-checks", is_flag=True, help="Start without the preflight checks.")
@probe_timeout_option
@min_free_option
@click.option(
    "--interval", default=1.0, show_default=True, metavar="SECONDS", help="How often to poll."
)
@click.option(
    "--dashboard",
    "with_dashboard",
    is_flag=True,
    help="Also serve the live web dashboard (see 'orchestrate dashboard'), detached; it stays "
    "up 10 minutes after the run ends.",
)
@click.option(
    "--dashboard-port", default=DASHBOARD_PORT, show_default=True, help="The dashboard's port."
)
@pass_context
def up(  # noqa: PLR0917 - click passes every option by position
    context: Context,
    inventory: Path,
    detach: bool,
    skip_checks: bool,
    probe_timeout: float,
    min_free_gb: float,
    interval: float,
    with_dashboard: bool,
    dashboard_port: int,
) -> None:
    """Validate INVENTORY, run the preflight checks (see 'orchestrate check'), start every worker
    detached, and watch them until the job ends.

    The workers keep running if this command is interrupted or its terminal closes; Ctrl-C only
    stops watching. Exit status: 0 when every worker succeeded, 1 when the job failed, 2 for an
    invalid inventory, 3 when a host could not be reached, 4 when a run of the state directory is
    still active, 5 when a preflight check failed.
    """
    spec = load_inventory(inventory)
    with Machines() as machines:
        refuse_if_active(context.store, machines)
        if not skip_checks:
            report = run_checks(spec, machines, probe_timeout, min_free_gb)
            show_findings(report, only_problems=True)
            if report.blocking:
                raise blocking_error(report)
        errors.print(
            f"starting job [bold]{spec.job.name}[/] on {len(spec.hosts)} worker(s) from {inventory}"
        )
        record = start_run(
            spec,
            context.store,
            machines,
            say=lambda message: errors.print(f"  {message}", markup=False, highlight=False),
        )
        errors.print(f"run {record.run_id}: logs and progress in {record.workers[0].run_dir}")
        if with_dashboard:
            try:
                url = spawn_dashboard(context.store, record.run_id, dashboard_port)
                errors.print(f"dashboard: {url}", markup=False, highlight=False)
            except MissingTool as error:  # the workers run already: supervise them anyway
                errors.print(f"warning: {error.message}; the run goes on without a dashboard "
                             f"({error.hint})", markup=False, highlight=False)  # fmt: skip
        if detach:
            pid = _spawn_supervisor(context.store, record.run_id)
            errors.print(
                f"detached; a supervisor (pid {pid}) restarts the cluster when a worker fails. "
                "Follow with 'orchestrate attach', 'orchestrate status', 'orchestrate tail -f'"
            )
            return
        _supervise_here(context.store, machines, record, interval)


def _spawn_supervisor(store: RunStore, run_id: str) -> int:
    """The detached `orchestrate supervise RUN_ID`: its own session, so it outlives this
    command and its terminal; its output goes to the run's log in the state directory."""
    log_path = store.log_path(run_id)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "--state-dir", str(store.root.resolve()),
             "supervise", run_id],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return process.pid


@contextmanager
def _view() -> Iterator[tuple[Callable[[RunStatus], None], Callable[[str], None]]]:
    """A live table on a terminal; plain lines on state changes elsewhere (logs, pipes)."""
    if console.is_terminal:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            yield (
                lambda status: live.update(
                    Group(status_table(status), *problems(status)), refresh=True
                ),
                lambda message: live.console.print(message, markup=False, highlight=False),
            )
    else:
        yield (
            _PlainReporter().report,
            lambda message: console.print(message, markup=False, highlight=False),
        )


class _PlainReporter:
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


def _supervise_here(
    store: RunStore, machines: Machines, record: RunRecord, interval: float
) -> None:
    lock = SupervisorLock(store.lock_path(record.run_id))
    if not lock.acquire():
        raise RunStateError(
            f"run {record.run_id} is already supervised by another process",
            hint="'orchestrate attach' shows its live view",
        )
    try:
        with _view() as (show, say):
            supervisor = Supervisor(store, machines, record, show=show, say=say, interval=interval)
            final = supervisor.run()
    except KeyboardInterrupt:
        raise StoppedWatching() from None
    finally:
        lock.release()
    _finish(final, store.load(record.run_id))


def _finish(final: RunStatus, record: RunRecord) -> None:
    if final.state is WorkerState.SUCCEEDED:
        steps = max((w.step or 0) for w in final.workers)
        restarts = f" after {len(record.restarts)} restart(s)" if record.restarts else ""
        errors.print(
            f"[green]job {final.job} succeeded[/] at step {steps}{restarts}; "
            f"checkpoints in {record.workers[0].checkpoint_dir}"
        )
        return
    preempted = [w for w in final.workers if w.reason and "preempted" in w.reason]
    if preempted:
        step = max((w.checkpoint_step or 0) for w in final.workers)
        raise JobFailed(
            f"the run was preempted and saved a checkpoint at step {step}",
            hint="run 'orchestrate up' with the same inventory again to resume",
        )
    if record.outcome:
        raise JobFailed(record.outcome, hint="'orchestrate tail' shows every worker's log")
    if final.state is WorkerState.STOPPED:
        raise JobFailed(
            "the run was stopped by 'orchestrate down'",
            hint="'orchestrate up' with the same inventory resumes from the latest checkpoint",
        )
    raise JobFailed(failure_report(final), hint="'orchestrate tail' shows every worker's log")


@cli.command(hidden=True)
@click.argument("run_id")
@click.option("--interval", default=1.0)
@pass_context
def supervise(context: Context, run_id: str, interval: float) -> None:
    """Supervise RUN_ID in this process (started detached by 'up --detach')."""
    record = context.store.load(run_id)
    with Machines() as machines:
        _supervise_here(context.store, machines, record, interval)


@cli.command()
@run_option
@click.option("--interval", default=1.0, show_default=True, metavar="SECONDS")
@pass_context
def attach(context: Context, run_id: str | None, interval: float) -> None:
    """Re-enter the live view of the latest (or named) run.

    If no process supervises the run any more (its 'up' was killed or its terminal closed), attach
    takes over supervision, restarts included. Ctrl-C leaves the workers running.
    """
    record = context.store.load(run_id)
    with Machines() as machines:
        lock = SupervisorLock(context.store.lock_path(record.run_id))
        if not lock.held_elsewhere():
            errors.print(f"run {record.run_id}: nothing supervises it; supervising it here")
            _supervise_here(context.store, machines, record, interval)
            return
        errors.print(f"run {record.run_id}: watching (another process supervises it)")
        try:
            with _view() as (show, _say):
                while True:
                    record = context.store.load(record.run_id)
                    final = collect_status(record, machines)
                    show(final)
                    if final.state.finished and not lock.held_elsewhere():
                        break
                    time.sleep(interval)
        except KeyboardInterrupt:
            raise StoppedWatching() from None
    _finish(final, context.store.load(record.run_id))


@cli.command()
@click.option(
    "--grace",
    type=float,
    metavar="SECONDS",
    help="Time between SIGTERM and SIGKILL [default: 10, or 300 with --save].",
)
@click.option(
    "--save",
    is_flag=True,
    help="Wait for the workers to save a checkpoint at their current step and exit.",
)
@run_option
@pass_context
def down(context: Context, grace: float | None, save: bool, run_id: str | None) -> None:
    """Stop every worker of the run: SIGTERM to each process group, SIGKILL after --grace.

    On SIGTERM the built-in training loop saves a checkpoint at the current step on every worker
    and exits; --save waits for that and says at which step. A supervisor of the run stops too.
    """
    record = context.store.load(run_id)
    grace = grace if grace is not None else (300.0 if save else DEFAULT_GRACE)
    stop_flag(context.store, record.run_id).touch()
    with Machines() as machines:
        report = stop_run(record, machines, grace)
        newer = _after_supervisor(context.store, record, machines, grace)
        if newer is not None:
            report = stop_run(newer, machines, grace)
        final = collect_status(context.store.load(record.run_id), machines) if save else None
    for name, outcome in report.outcome.items():
        console.print(f"{name}: {outcome}", markup=False, highlight=False)
    failed = [n for n, o in report.outcome.items() if o.startswith("unreachable")]
    if failed or report.leftovers:
        left = ", ".join(f"{n} (pids {p})" for n, p in report.leftovers.items())
        raise PartialFailure(
            "some workers could not be stopped: " + ", ".join(failed) + left,
            hint="check those hosts, then run 'orchestrate down' again",
        )
    if final is not None:
        _report_saved(final, report)
    errors.print(f"run {record.run_id} is down")


def _after_supervisor(
    store: RunStore, record: RunRecord, machines: Machines, grace: float
) -> RunRecord | None:
    """Wait for a supervisor of the run to let go; if it started a new attempt meanwhile, that
    attempt is returned to be stopped too."""
    lock = SupervisorLock(store.lock_path(record.run_id))
    deadline = time.monotonic() + grace + 15
    while lock.held_elsewhere() and time.monotonic() < deadline:
        time.sleep(0.2)
    newer = store.load(record.run_id)
    return newer if newer.attempt != record.attempt else None


def _report_saved(final: RunStatus, report: StopReport) -> None:
    killed = [n for n, o in report.outcome.items() if o == "killed"]
    if killed:
        raise PartialFailure(
            f"{', '.join(killed)} did not save and exit within the grace period and was killed",
            hint="the latest checkpoint is the last periodic one; a longer --grace may help",
        )
    steps = {w.checkpoint_step for w in final.workers}
    errors.print(f"saved a checkpoint at step {max(s for s in steps if s is not None)}"
                 if steps - {None} else "no checkpoint was saved")  # fmt: skip

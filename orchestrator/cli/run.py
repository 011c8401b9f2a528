"""`up`, `supervise`, `attach` and `down`: starting, supervising and stopping a run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import click

from orchestrator.backends.base import Backend
from orchestrator.backends.registry import load_inventory, open_backend
from orchestrator.cli.app import (
    Context,
    StoppedWatching,
    cli,
    console,
    errors,
    pass_context,
    run_option,
)
from orchestrator.cli.check import (
    blocking_error,
    min_free_option,
    probe_timeout_option,
    run_checks,
    show_findings,
)
from orchestrator.cli.dashboard import DEFAULT_PORT as DASHBOARD_PORT
from orchestrator.cli.dashboard import spawn_dashboard
from orchestrator.cli.hosts import prepare_before_checks
from orchestrator.cli.live import finish, spawn_supervisor, supervise_here, view
from orchestrator.engine.observe.notify import RunEvents, missing_notify_secrets
from orchestrator.engine.observe.status import RunStatus, collect_status
from orchestrator.engine.start.queue import Withdrawn, pending, wait_for_leases, withdraw
from orchestrator.engine.start.rerun import Trained
from orchestrator.engine.start.start import StartHooks, StartOptions, start_first_attempt
from orchestrator.engine.supervision.contact import stop_everything, stop_unrecorded, watch
from orchestrator.engine.supervision.locks import (
    SupervisorLock,
    interrupted_launch,
    relaunch,
)
from orchestrator.engine.supervision.policy import linger_seconds, with_warm_default
from orchestrator.engine.workers.lifecycle import (
    DEFAULT_GRACE,
    StopReport,
)
from orchestrator.engine.workers.secretenv import missing_secrets, secret_values, shown_env
from orchestrator.errors import (
    MissingTool,
    PartialFailure,
    QueueWithdrawn,
    RecordDamaged,
    RunStateError,
)
from orchestrator.model.inventory import Inventory
from orchestrator.model.records import RunRecord
from orchestrator.model.timetext import duration


@cli.command()
@click.argument(
    "inventory_file", metavar="INVENTORY", type=click.Path(dir_okay=False, path_type=Path)
)
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
@click.option(
    "--force-setup",
    is_flag=True,
    help="Run the inventory's 'setup:' commands on every host even where they ran already.",
)
@click.option(
    "--queue",
    is_flag=True,
    help="When another job holds a port or GPU this job leases, wait as pending (in the order "
    "of arrival) instead of failing, and start when everything is free (as 'job.queue: true').",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Start over from step 0: once the checks pass, the job's checkpoint directory on every "
    "host (and spare) is emptied into a sibling DIRECTORY.set-aside-TIME on that host (moved, "
    "never deleted; each move is said), then the job trains from no checkpoint. Without it, a "
    "job whose last checkpoint already reaches job.steps starts nothing and exits 0.",
)
@pass_context
def up(  # noqa: PLR0917 - click passes every option by position
    context: Context,
    inventory_file: Path,
    detach: bool,
    skip_checks: bool,
    probe_timeout: float,
    min_free_gb: float,
    interval: float,
    with_dashboard: bool,
    dashboard_port: int,
    force_setup: bool,
    queue: bool,
    fresh: bool,
) -> None:
    """Validate INVENTORY, mirror its 'sync:' directory and run its 'setup:' commands where they
    have not run yet (see 'orchestrate setup'), run the preflight checks (see 'orchestrate
    check'), start every worker detached, and watch them until the job ends. A built-in loop's
    job whose chief's last checkpoint already reaches job.steps (and whose export is there) is
    not started again: 'up' says so and exits 0, and 'orchestrate status' still shows the run
    that trained (--fresh starts over).

    The workers keep running if this command is interrupted or its terminal closes; Ctrl-C only
    stops watching. Exit status: 0 when every worker succeeded (or nothing was left to train), 1
    when the job failed, 2 for an invalid inventory, 3 when a host could not be reached, 4 when a
    run of the state directory is still active (or a port or GPU it leases is held, without
    --queue), 5 when a preflight check failed.
    """
    inventory = load_inventory(inventory_file)
    queue = queue or inventory.job.queue
    if queue and detach:  # the waiting goes on in a detached `up --queue`, its supervisor
        _spawn_queued(context, inventory_file, skip_checks=skip_checks,
                      probe_timeout=probe_timeout, min_free_gb=min_free_gb, interval=interval,
                      with_dashboard=with_dashboard, dashboard_port=dashboard_port,
                      force_setup=force_setup, fresh=fresh)  # fmt: skip
        return
    start_and_supervise(context, inventory, str(inventory_file), detach=detach,
                        skip_checks=skip_checks,
                        probe_timeout=probe_timeout, min_free_gb=min_free_gb, interval=interval,
                        with_dashboard=with_dashboard, dashboard_port=dashboard_port,
                        force_setup=force_setup, queue=queue, fresh=fresh)  # fmt: skip


def _spawn_queued(context: Context, inventory_file: Path, **options: object) -> None:
    """`up -d --queue`: a detached `up --queue` waits its turn, starts the run and supervises
    it (its output in the state directory's queued.log); this one returns once it is queued
    or started."""
    command = [sys.executable, "-m", "orchestrator", "--state-dir",
               str(context.store.root.resolve()), "up", "--queue",
               "--probe-timeout", str(options["probe_timeout"]),
               "--min-free-gb", str(options["min_free_gb"]),
               "--interval", str(options["interval"]),
               "--dashboard-port", str(options["dashboard_port"])]  # fmt: skip
    for flag in ("skip_checks", "with_dashboard", "force_setup", "fresh"):
        if options[flag]:
            command.append("--dashboard" if flag == "with_dashboard" else
                           "--" + flag.replace("_", "-"))  # fmt: skip
    command.append(str(inventory_file.resolve()))
    before = context.store.current_id()
    log_path = context.store.root / "queued.log"
    with context.store.open_private(log_path) as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        waiting = pending(context.store)
        if waiting is not None and waiting.pid == process.pid:
            errors.print(f"run {waiting.run_id}: pending, {waiting.reason}", markup=False,
                         highlight=False)  # fmt: skip
            errors.print(f"detached; the queued 'up' (pid {process.pid}) starts it when "
                         "everything it needs is free, then supervises it. Follow with "
                         "'orchestrate status', 'orchestrate jobs'; 'orchestrate down' "
                         "withdraws it", markup=False, highlight=False)  # fmt: skip
            return
        current = context.store.current_id()
        if current is not None and current != before and context.store.load(current).launched:
            errors.print(f"run {current}: started; a supervisor (pid {process.pid}) restarts "
                         "the cluster when a worker fails. Follow with 'orchestrate attach', "
                         "'orchestrate status', 'orchestrate tail -f'", markup=False,
                         highlight=False)  # fmt: skip
            return
        code = process.poll()
        if code is not None:
            errors.print(log_path.read_text(errors="replace").rstrip(), markup=False,
                         highlight=False)  # fmt: skip
            raise SystemExit(code)
        time.sleep(0.2)
    raise RunStateError(f"the queued 'up' (pid {process.pid}) neither queued nor started the "
                        "run in 600 s", hint=f"see {log_path}")  # fmt: skip


def _checks(
    inventory: Inventory, backend: Backend, probe_timeout: float, min_free_gb: float, *, perf: bool
) -> None:
    report = run_checks(inventory, backend, probe_timeout, min_free_gb, perf=perf)
    show_findings(report, only_problems=True)
    if report.blocking:
        raise blocking_error(report)


def start_and_supervise(
    context: Context,
    inventory: Inventory,
    source: str,
    *,
    detach: bool,
    skip_checks: bool,
    probe_timeout: float,
    min_free_gb: float,
    interval: float,
    with_dashboard: bool = False,
    dashboard_port: int = DASHBOARD_PORT,
    force_setup: bool = False,
    queue: bool = False,
    fresh: bool = False,
) -> None:
    """What `up` does with a loaded inventory (`orchestrate local` builds its own); `queue`:
    wait for held leases (engine/start/queue.py) instead of failing; `fresh`: start over from no
    checkpoint (engine/start/rerun.py)."""
    secrets, inventory = _ready_to_start(context, inventory)
    with open_backend(inventory) as backend:
        hooks = StartHooks(
            say=_say,
            prepare=prepare_before_checks,
            wait_in_queue=lambda inv, run_id, be: _wait_in_queue(context, inv, run_id, be),
            check=lambda leased, be, perf: _checks(leased, be, probe_timeout, min_free_gb,
                                                  perf=perf),
            announce=lambda leased: _announce(leased, source, secrets),
            step=lambda message: errors.print(f"  {message}", markup=False, highlight=False),
        )  # fmt: skip
        options = StartOptions(skip_checks=skip_checks, force_setup=force_setup, queue=queue,
                               fresh=fresh)  # fmt: skip
        record = start_first_attempt(context.store, backend, inventory, hooks, options)
        if isinstance(record, Trained):  # nothing started, no run made: `status` keeps the last
            _say(f"job {inventory.job.name}: {record.message}")
            return
        errors.print(f"run {record.run_id}: logs and progress in {record.workers[0].run_dir}")
        if with_dashboard:
            _start_dashboard(context, record.run_id, dashboard_port)
        if detach:
            pid = spawn_supervisor(context.store, record.run_id)
            errors.print(
                f"detached; a supervisor (pid {pid}) restarts the cluster when a worker fails. "
                "Follow with 'orchestrate attach', 'orchestrate status', 'orchestrate tail -f'"
            )
            return
        supervise_here(context.store, backend, record, interval)


def _ready_to_start(context: Context, inventory: Inventory) -> tuple[dict[str, str], Inventory]:
    """What `up` refuses before it touches a host (a missing secret, a bad environment
    setting, a run queued in this state directory); the secrets' values and the inventory with
    the environment's defaults."""
    secrets = secret_values(inventory.job.secret_env, os.environ, doing="'up'")  # before anything
    linger_seconds(inventory.job, os.environ)  # a bad $ORCHESTRATE_LINGER: refused before too
    inventory = with_warm_default(inventory, os.environ)
    missing_notify_secrets(inventory.notify, os.environ, doing="'up'")
    waiting = pending(context.store)
    if waiting is not None:  # it holds the start lock while it waits
        raise RunStateError(
            f"run {waiting.run_id} of job {waiting.job} is queued in this state directory "
            f"({waiting.reason})",
            hint="'orchestrate down' withdraws it; or use another state directory (--state-dir)",
        )
    return secrets, inventory


QUEUE_REPORT_EVERY = 30.0  # seconds between two "still queued" lines while nothing changes


def _wait_in_queue(context: Context, inventory: Inventory, run_id: str, backend: Backend) -> float:
    """Wait for the run's turn, saying why while it waits; Ctrl-C (or `down`) withdraws it.
    The seconds it waited (the run's goodput counts them as queue)."""
    started = time.time()
    said: list[tuple[str, float]] = []  # the last reason said, and when
    events = RunEvents(context.store, RunRecord(run_id, inventory, time.time()), _say)

    def on_wait(reason: str, since: float) -> None:
        now = time.monotonic()
        if not said:
            events.queued(reason)
        if not said or reason != said[-1][0] or now - said[-1][1] >= QUEUE_REPORT_EVERY:
            waited = duration(time.time() - since)
            _say(f"run {run_id}: pending, {reason} (waiting {waited})")
            said.append((reason, now))

    try:
        wait_for_leases(inventory, run_id, backend.leasing, context.store, on_wait)
    except Withdrawn:
        raise QueueWithdrawn(f"run {run_id} was withdrawn from the queue; nothing started") \
            from None  # fmt: skip
    except KeyboardInterrupt:
        raise QueueWithdrawn(f"run {run_id}: stopped waiting; its place in the queue is "
                             "withdrawn and nothing started") from None  # fmt: skip
    finally:
        events.close()
    if said:
        _say(f"run {run_id}: its turn; starting")
    return time.time() - started


def _announce(inventory: Inventory, source: str, secrets: Mapping[str, str]) -> None:
    """What is about to start, and with which environment (secrets redacted)."""
    errors.print(f"starting job [bold]{inventory.job.name}[/] on {len(inventory.hosts)} "
                 f"worker(s) from {source}")  # fmt: skip
    shown = shown_env({**inventory.job.env, **secrets}, inventory.job.secret_env)
    if shown:
        errors.print("  environment: " + " ".join(f"{k}={v}" for k, v in shown.items()),
                     markup=False, highlight=False)  # fmt: skip


def _start_dashboard(context: Context, run_id: str, port: int) -> None:
    try:
        url = spawn_dashboard(context.store, run_id, port)
        errors.print(f"dashboard: {url}", markup=False, highlight=False)
    except MissingTool as error:  # the workers run already: supervise them anyway
        errors.print(f"warning: {error.message}; the run goes on without a dashboard "
                     f"({error.hint})", markup=False, highlight=False)  # fmt: skip


def _say(message: str) -> None:
    errors.print(message, markup=False, highlight=False)


@cli.command(hidden=True)
@click.argument("run_id")
@click.option("--interval", default=1.0)
@pass_context
def supervise(context: Context, run_id: str, interval: float) -> None:
    """Supervise RUN_ID in this process (started detached by 'up --detach', or by Ctrl-C on a
    supervising 'up' or 'attach', possibly in the middle of a restart's launch)."""
    record = context.store.load(run_id)
    secret_values(record.inventory.job.secret_env, os.environ, doing="supervising the run")
    with open_backend(record.inventory) as backend:
        if interrupted_launch(context.store, record) and not record.stop_requested:
            record = relaunch(context.store, backend, record, _say)
        supervise_here(context.store, backend, record, interval, hand_over=False)


@cli.command()
@run_option
@click.option("--interval", default=1.0, show_default=True, metavar="SECONDS")
@pass_context
def attach(context: Context, run_id: str | None, interval: float) -> None:
    """Re-enter the live view of the latest (or named) run.

    If no process supervises the run any more (its 'up' was killed or its terminal closed), attach
    takes over supervision, restarts included. Ctrl-C leaves the workers running. A run still
    queued ('up --queue') is shown as pending, with what it waits behind.
    """
    waiting = pending(context.store)
    if waiting is not None and run_id in (None, waiting.run_id):
        errors.print(f"run {waiting.run_id}: pending, {waiting.reason}; the queued 'up' (pid "
                     f"{waiting.pid}) starts it when everything it needs is free",
                     markup=False, highlight=False)  # fmt: skip
        return
    record = context.store.load(run_id)
    with open_backend(record.inventory) as backend:
        lock = SupervisorLock(context.store.lock_path(record.run_id))
        if not lock.held_elsewhere():
            _require_secrets_to_supervise(record, backend)
            errors.print(f"run {record.run_id}: nothing supervises it; supervising it here")
            if interrupted_launch(context.store, record) and not record.stop_requested:
                record = relaunch(context.store, backend, record, _say)
            supervise_here(context.store, backend, record, interval)
            return
        errors.print(f"run {record.run_id}: watching (another process supervises it)")
        try:
            with view() as (show, _message):
                final = watch(context.store, backend, backend.scheduler, record.run_id,
                              show=show, interval=interval)  # fmt: skip
        except KeyboardInterrupt:
            raise StoppedWatching() from None
    finish(final, context.store.load(record.run_id))


def _require_secrets_to_supervise(record: RunRecord, backend: Backend) -> None:
    """A supervisor must be able to restart the run, which needs job.secret_env's values: they
    were never written down, so this shell must have them (a finished run needs none)."""
    if not missing_secrets(record.inventory.job.secret_env, os.environ):
        return
    if collect_status(record, backend, backend.scheduler).state.finished:
        return
    doing = f"taking over the supervision of run {record.run_id} (a restart)"
    secret_values(record.inventory.job.secret_env, os.environ, doing=doing)


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
    grace = grace if grace is not None else (300.0 if save else DEFAULT_GRACE)
    waiting = pending(context.store)
    if waiting is not None and run_id in (None, waiting.run_id):
        if not withdraw(context.store, waiting):
            raise PartialFailure(f"the queued 'up' of run {waiting.run_id} (pid {waiting.pid}) "
                                 "did not end within 30 s",
                                 hint="stop that process; its tickets expire with it")  # fmt: skip
        errors.print(f"run {waiting.run_id} was queued: withdrawn, nothing had started")
        return
    try:
        inventory = context.store.load(run_id).inventory
    except RecordDamaged as damaged:  # its live supervisor still knows where the workers are
        for name, outcome in stop_unrecorded(context.store, damaged, grace).outcome.items():
            console.print(f"{name}: {outcome}", markup=False, highlight=False)
        errors.print(f"run {damaged.run_id} is down: its supervisor stopped it")
        return
    with open_backend(inventory) as backend:
        record, report = stop_everything(context.store, backend, run_id, grace)
        final = collect_status(record, backend, backend.scheduler) if save else None
    events = RunEvents(context.store, record, _say)  # notify: targets hear of the stop
    events.stopped()
    events.close()
    for name, outcome in report.outcome.items():
        console.print(f"{name}: {outcome}", markup=False, highlight=False)
    if report.unreachable or report.leftovers:
        parts = report.unreachable + [f"{n} (pids {p})" for n, p in report.leftovers.items()]
        raise PartialFailure(
            "some workers could not be stopped: " + ", ".join(parts),
            hint="check those hosts, then run 'orchestrate down' again",
        )
    if final is not None:
        _report_saved(final, report)
    errors.print(f"run {record.run_id} is down")


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

"""The command line: the only place that prints and picks exit codes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from orchestrator import __version__
from orchestrator.connect import Machines
from orchestrator.errors import (
    JobFailed,
    MissingTool,
    OrchestrateError,
    PartialFailure,
    PreflightFailed,
    RunStateError,
)
from orchestrator.firewall import FORMATS, controller_address, host_rules
from orchestrator.inventory import Inventory, load_inventory
from orchestrator.lifecycle import (
    DEFAULT_GRACE,
    StopReport,
    start_run,
    stop_run,
)
from orchestrator.logs import follow, last_lines, select_workers
from orchestrator.preflight import (
    DEFAULT_MIN_FREE_BYTES,
    DEFAULT_PROBE_TIMEOUT,
    PreflightReport,
    Status,
    run_preflight,
)
from orchestrator.render import (
    failure_report,
    finding_hints,
    findings_table,
    firewall_script,
    problems,
    progress_line,
    status_table,
)
from orchestrator.runstore import DEFAULT_STATE_DIR, RunRecord, RunStore
from orchestrator.state import WorkerState
from orchestrator.status import RunStatus, collect_status
from orchestrator.supervise import Supervisor, SupervisorLock, refuse_if_active, stop_flag
from orchestrator.tensorboard import local_event_dir, pull_events

# Piped output is read by people too (CI logs, `| less`): give tables room instead of 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

EXIT_INTERRUPTED = 130
PLAIN_REPORT_EVERY = 15.0  # seconds between progress lines when the output is not a terminal


class Context:
    def __init__(self, state_dir: str) -> None:
        self.store = RunStore(state_dir)


pass_context = click.make_pass_decorator(Context)
run_option = click.option(
    "--run", "run_id", metavar="RUN_ID", help="Act on this run instead of the latest one."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


probe_timeout_option = click.option(
    "--probe-timeout",
    default=DEFAULT_PROBE_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="How long each port probe between two hosts may take.",
)
min_free_option = click.option(
    "--min-free-gb",
    default=DEFAULT_MIN_FREE_BYTES / 2**30,
    show_default=True,
    metavar="GIB",
    help="Free space wanted under the workdir and checkpoint directory.",
)


def _preflight(
    spec: Inventory, machines: Machines, probe_timeout: float, min_free_gb: float
) -> PreflightReport:
    with errors.status("preflight: checking every host and every port between them"):
        return run_preflight(
            spec,
            machines,
            probe_timeout=probe_timeout,
            min_free_bytes=int(min_free_gb * 2**30),
        )


def _show_findings(report: PreflightReport, only_problems: bool) -> None:
    if only_problems:
        report = PreflightReport(tuple(f for f in report.findings if f.status is not Status.OK))
        if not report.findings:
            return
    errors.print(findings_table(report))
    for hint in finding_hints(report):
        errors.print(f"hint: {hint}", markup=False, highlight=False)


def _blocking(report: PreflightReport) -> PreflightFailed:
    hosts = sorted({f.host for f in report.blocking})
    return PreflightFailed(
        f"preflight found {len(report.blocking)} problem(s) on {', '.join(hosts)}",
        hint="fix them and run 'orchestrate check INVENTORY' again "
        "('orchestrate up --skip-checks' starts anyway)",
    )


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per finding.")
@probe_timeout_option
@min_free_option
def check(inventory: Path, as_json: bool, probe_timeout: float, min_free_gb: float) -> None:
    """Find every reason the cluster would fail or hang, on every host at once, before starting.

    \b
    SSH login; Python, TensorFlow and worker versions (the same everywhere); each TensorFlow port
    free on its host (and who holds it if not); each port reachable from every other host
    (timed out: a firewall drops packets; refused: nothing listens or a REJECT rule); loopback
    addresses mixed with remote hosts; writable directories with free space; proxy variables that
    would capture the workers' gRPC traffic. Leaves no listener or process behind.
    Exit status 5 when something blocks the run.
    """
    spec = load_inventory(inventory)
    with Machines() as machines:
        report = _preflight(spec, machines, probe_timeout, min_free_gb)
    if as_json:
        click.echo(json.dumps([f.to_json() for f in report.findings], indent=2))
    else:
        _show_findings(report, only_problems=False)
    if report.blocking:
        raise _blocking(report)
    errors.print(f"[green]preflight passed[/] on {len(spec.hosts)} host(s)")


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="iptables",
    show_default=True,
    help="The firewall tool the hosts use.",
)
@click.option(
    "--controller",
    metavar="ADDRESS",
    help="This machine's address as the hosts see it, for the SSH rule "
    "(default: the source address of the route to the first SSH host).",
)
def firewall(inventory: Path, fmt: str, controller: str | None) -> None:
    """Print, per host, the commands that open its TensorFlow port to the other cluster hosts only.

    The TensorFlow gRPC port is unauthenticated: anyone who can reach it can join or disturb the
    job. These rules admit the cluster's own addresses, never the world, plus SSH from this
    machine. Nothing is applied: review them and run each block on its host.
    """
    spec = load_inventory(inventory)
    remote = [h for h in spec.hosts if h.connection == "ssh"]
    if controller is None and remote:
        controller = controller_address(remote[0].address)
    click.echo(firewall_script(host_rules(spec, fmt, controller), fmt))


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--detach", "-d", is_flag=True, help="Return once every worker has started.")
@click.option("--skip-checks", is_flag=True, help="Start without the preflight checks.")
@probe_timeout_option
@min_free_option
@click.option(
    "--interval", default=1.0, show_default=True, metavar="SECONDS", help="How often to poll."
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
            report = _preflight(spec, machines, probe_timeout, min_free_gb)
            _show_findings(report, only_problems=True)
            if report.blocking:
                raise _blocking(report)
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
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
@run_option
@pass_context
def status(context: Context, as_json: bool, run_id: str | None) -> None:
    """Show each worker's state, pid, step, loss, checkpoint step, uptime, CPU and memory."""
    record = context.store.load(run_id)
    with Machines() as machines:
        result = collect_status(record, machines)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    console.print(status_table(result))
    for line in problems(result):
        console.print(line, style="red", markup=False, highlight=False)


@cli.command(name="tail")
@click.argument("names", nargs=-1, metavar="[WORKER]...")
@click.option("--follow", "-f", "follow_logs", is_flag=True, help="Keep printing new lines.")
@click.option("--lines", "-n", default=20, show_default=True, help="Lines of each log to show.")
@run_option
@pass_context
def tail_command(
    context: Context, names: tuple[str, ...], follow_logs: bool, lines: int, run_id: str | None
) -> None:
    """Print the last lines of every worker's log (or the named ones), each prefixed by its name.

    With -f, keep following all of them until Ctrl-C.
    """
    record = context.store.load(run_id)
    workers = select_workers(record, names)
    width = max(len(w.name) for w in workers)
    colors = ["cyan", "magenta", "green", "yellow", "blue", "red"]
    prefixes = {
        w.name: click.style(f"{w.name:<{width}} |", fg=colors[w.index % len(colors)])
        for w in workers
    }
    with Machines() as machines:
        stream = (
            follow(workers, machines, lines)
            if follow_logs
            else last_lines(workers, machines, lines)
        )
        try:
            for name, line in stream:
                click.echo(f"{prefixes[name]} {line}")
        except KeyboardInterrupt:
            return  # the normal way to end `tail -f`


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


@cli.command()
@click.option("--port", default=6006, show_default=True, help="TensorBoard's port on this machine.")
@click.option(
    "--refresh",
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How often a remote chief's new event files are pulled.",
)
@run_option
@pass_context
def tensorboard(context: Context, port: int, refresh: float, run_id: str | None) -> None:
    """Start TensorBoard on the run's event files and print its URL; Ctrl-C stops it.

    The chief writes the events beside its checkpoints. A remote chief's files are pulled over
    SSH into the state directory and refreshed while TensorBoard runs, so no port has to be
    opened on the hosts. Needs TensorBoard on this machine (pip install tensorboard).
    """
    if importlib.util.find_spec("tensorboard") is None:
        raise MissingTool(
            "TensorBoard is not installed for this Python",
            hint="pip install tensorboard (or 'orchestrate[worker]')",
        )
    record = context.store.load(run_id)
    logdir = local_event_dir(record, context.store)
    with Machines() as machines:
        pulled = pull_events(record, machines, logdir)
        if pulled:
            errors.print(f"pulled {pulled} event file(s) from {record.workers[0].name}")
        server_log = context.store.root / "tensorboard.log"
        server_log.parent.mkdir(parents=True, exist_ok=True)
        with server_log.open("w") as log:  # a file, not a pipe: a full pipe would stall it
            server = subprocess.Popen(
                [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                 "--port", str(port), "--host", "127.0.0.1"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        click.echo(f"TensorBoard for run {record.run_id}: http://127.0.0.1:{port}/ ({logdir})")
        try:
            while server.poll() is None:
                time.sleep(refresh if record.workers[0].host.connection != "local" else 1.0)
                pull_events(record, machines, logdir)
        except KeyboardInterrupt:
            server.terminate()
            server.wait(timeout=15)
            errors.print("TensorBoard stopped")
            return
    last = server_log.read_text().strip().splitlines()[-1:] or ["no output"]
    raise MissingTool(
        f"TensorBoard exited {server.returncode}: {last[0]}",
        hint=f"is port {port} free? try --port; its log is {server_log}",
    )


class StoppedWatching(OrchestrateError):
    exit_code = EXIT_INTERRUPTED

    def __init__(self) -> None:
        super().__init__(
            "stopped watching; the workers keep running",
            hint="'orchestrate status', 'orchestrate tail -f', or 'orchestrate down' to stop them",
        )


def main() -> None:
    try:
        cli.main(standalone_mode=False, prog_name="orchestrate")
    except OrchestrateError as error:
        errors.print(Text.assemble(("error: ", "bold red"), error.message), highlight=False)
        if error.hint:
            errors.print(f"hint: {error.hint}", markup=False, highlight=False)
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        errors.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)

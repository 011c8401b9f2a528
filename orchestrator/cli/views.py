"""`status`, `tail`, `tensorboard` and `pull-export`: looking at a run and what it made."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from orchestrator.backends.registry import open_backend
from orchestrator.cli.app import (
    Context,
    cli,
    console,
    errors,
    pass_context,
    run_option,
)
from orchestrator.cli.render import problems, standby_lines, status_table
from orchestrator.contract import install_hint
from orchestrator.engine.observe.goodput import run_account, summary
from orchestrator.engine.observe.loggroups import WINDOW, Grouper, Line, label, merge
from orchestrator.engine.observe.logs import follow, follow_timed, last_lines, select_workers
from orchestrator.engine.observe.stacks import grouped
from orchestrator.engine.observe.status import collect_status
from orchestrator.engine.start.queue import pending
from orchestrator.engine.store.exports import export_is_remote, local_export, pull_export
from orchestrator.engine.store.tensorboard import events_are_remote, local_event_dir, pull_events
from orchestrator.engine.supervision.hangs import collect
from orchestrator.engine.supervision.locks import is_supervised
from orchestrator.engine.trackers.tracking import tracking_json, tracking_lines
from orchestrator.errors import MissingTool, PartialFailure
from orchestrator.model.leases import clock
from orchestrator.model.printable import printable, strict_json
from orchestrator.model.records import WorkerRecord
from orchestrator.model.vocabulary import WorkerState


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
@run_option
@pass_context
def status(context: Context, as_json: bool, run_id: str | None) -> None:
    """Show each worker's state, pid, step, loss, checkpoint step, uptime, CPU and memory.

    Exit status 3 when a host did not answer (its workers show as unknown), 4 when there is no
    run to show. A run queued by 'up --queue' shows as pending, with what it waits behind.
    """
    waiting = pending(context.store)
    if waiting is not None and run_id in (None, waiting.run_id):
        if as_json:
            click.echo(strict_json(waiting.to_json(), indent=2))
        else:
            console.print(f"run {waiting.run_id}  job {waiting.job}  pending since "
                          f"{clock(waiting.since)}: {waiting.reason}", markup=False,
                          highlight=False)  # fmt: skip
        return
    record = context.store.load(run_id)
    # Asked before the status is collected: a run whose supervisor had ended by then shows its
    # end; asked after, a run that ended meanwhile showed `running` and `supervised: false`.
    supervised = is_supervised(context.store, record.run_id)
    with open_backend(record.inventory) as backend:
        result = collect_status(record, backend, backend.scheduler)
        # The slots' standbys, from the hosts' own listing (a host not answering lists none).
        kept = backend.keeper.standbys(record.workers).ok if backend.keeper else {}
        standbys = {n: s for n, s in kept.items() if s}
    account = run_account(record, result, time.time())
    if as_json:
        data = result.to_json()
        data["supervised"] = supervised
        data["standbys"] = [s.to_json() for s in standbys.values()]
        data["goodput"] = account.to_json()
        data["tracking"] = tracking_json(record.inventory.job.tracking)
        click.echo(strict_json(data, indent=2))
    else:
        console.print(status_table(result))
        console.print(summary(account), markup=False, highlight=False)
        for line in tracking_lines(record.inventory.job.tracking):
            console.print(printable(line), markup=False, highlight=False)
        for line in standby_lines(standbys):
            console.print(line, style="dim", markup=False, highlight=False)
        for line in problems(result):
            console.print(line, style="red", markup=False, highlight=False)
        if supervised and result.state is WorkerState.FAILED:
            console.print("its supervisor is restarting it ('orchestrate attach' watches)",
                          markup=False, highlight=False)  # fmt: skip
    silent = [w.name for w in result.workers if w.state is WorkerState.UNKNOWN]
    if silent:
        raise PartialFailure(
            f"{', '.join(silent)}: the host did not answer, so the state shown is unknown",
            hint="check the network to those hosts; the workers may still be training",
        )


@cli.command(name="tail")
@click.argument("names", nargs=-1, metavar="[WORKER]...")
@click.option("--follow", "-f", "follow_logs", is_flag=True, help="Keep printing new lines.")
@click.option("--lines", "-n", default=20, show_default=True, help="Lines of each log to show.")
@click.option(
    "--group/--no-group",
    default=None,
    help="Print the same line of several workers once, as [worker-0,1,2] (within 1 s with -f). "
    "Default: on when the output is a terminal.",
)
@click.option(
    "--raw",
    is_flag=True,
    help="Print each line as the worker wrote it, escape sequences (its colours) included. "
    "Without it, control characters are shown as escapes (ESC as \\x1b): a log line cannot "
    "retitle, clear or otherwise drive your terminal.",
)
@run_option
@pass_context
def tail_command(  # noqa: PLR0917 - click passes every option by position
    context: Context,
    names: tuple[str, ...],
    follow_logs: bool,
    lines: int,
    group: bool | None,
    raw: bool,
    run_id: str | None,
) -> None:
    """Print the last lines of every worker's log (or the named ones), each prefixed by its name.

    With -f, keep following all of them until Ctrl-C. On a terminal (or with --group) a line
    that several workers print alike is printed once, prefixed by all of them. A line's control
    characters are shown as escapes unless --raw.
    """
    record = context.store.load(run_id)
    workers = select_workers(record, names)
    echo = _log_printer(workers, raw)
    if group is None:
        group = sys.stdout.isatty()
    with open_backend(record.inventory) as backend:
        try:
            if not group:
                stream = (
                    follow(workers, backend, lines)
                    if follow_logs
                    else last_lines(workers, backend, lines)
                )
                for name, line in stream:
                    echo(Line((name,), line))
            elif not follow_logs:
                logs = last_lines(workers, backend, lines)
                by_worker = [(w.name, [line for n, line in logs if n == w.name]) for w in workers]
                for grouped in merge(by_worker):
                    echo(grouped)
            else:
                grouper = Grouper([w.name for w in workers])
                for item in follow_timed(workers, backend, lines, tick=WINDOW / 4):
                    ready = grouper.flush(time.monotonic()) if item is None else grouper.add(
                        item[1], item[2], item[0])  # fmt: skip
                    for grouped in ready:
                        echo(grouped)
        except KeyboardInterrupt:
            return  # the normal way to end `tail -f`


def _log_printer(workers: Sequence[WorkerRecord], raw: bool) -> Callable[[Line], None]:
    """How `tail` prints a line of one worker or of several: after who printed it (in the
    worker's colour), printable unless `raw`; raw, as written, escapes included, even into a
    pipe (where click.echo would strip colours, and only those)."""
    width = max(len(w.name) for w in workers)
    colors = ["cyan", "magenta", "green", "yellow", "blue", "red"]
    prefixes = {
        w.name: click.style(f"{w.name:<{width}} |", fg=colors[w.index % len(colors)])
        for w in workers
    }

    def echo(line: Line) -> None:
        if len(line.workers) == 1:
            prefix = prefixes[line.workers[0]]
        else:
            prefix = click.style(f"[{label(line.workers)}]", bold=True)
        if raw:
            click.echo(f"{prefix} ", nl=False)
            click.echo(line.text, color=True)
        else:
            click.echo(f"{prefix} {printable(line.text)}")

    return echo


@cli.command(name="stacks")
@click.option("--worker", "-w", "names", multiple=True, metavar="WORKER",
              help="Only this worker (repeat for more).")  # fmt: skip
@click.option(
    "--native",
    is_flag=True,
    help="Add native frames, with py-spy where it is installed on the host.",
)
@click.option("--wait", default=5.0, show_default=True, help="Seconds to wait for the answers.")
@run_option
@pass_context
def stacks_command(
    context: Context, names: tuple[str, ...], native: bool, wait: float, run_id: str | None
) -> None:
    """Print every thread's Python stack of each running worker, now (SIGUSR2 to the worker,
    which writes them with faulthandler). Identical stacks of several workers are shown once.
    The last line says where each worker is and which one the others wait for.

    Exit status 3 when a worker could not answer (it is named, with why).
    """
    record = context.store.load(run_id)
    workers = select_workers(record, names)
    with open_backend(record.inventory) as backend:
        found = collect(backend, workers, wait, native)
    # The stacks are the hosts' text (a file name, a thread's name): shown, never obeyed.
    for members, text in grouped(found.texts):
        same = " (identical stacks)" if len(members) > 1 else ""
        click.secho(f"== {', '.join(members)}{same}", bold=True)
        click.echo(printable(text.rstrip("\n"), multiline=True) + "\n")
    for name, native_text in found.native.items():
        click.secho(f"== {name}: native frames (py-spy)", bold=True)
        click.echo(printable(native_text.rstrip("\n"), multiline=True) + "\n")
    for name, why in found.silent.items():
        click.secho(f"== {name}: no stacks: {printable(why)}", fg="red")
    click.echo(printable(found.summary().describe(), multiline=True))
    if found.silent:
        raise PartialFailure(
            f"{', '.join(found.silent)} did not answer with stacks",
            hint="a worker answers while it runs; 'orchestrate status' shows which do",
        )


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
            hint=f"pip install tensorboard (or {install_hint('worker')})",
        )
    record = context.store.load(run_id)
    with open_backend(record.inventory) as backend:
        logdir = local_event_dir(record, context.store, backend)
        pulled = pull_events(record, backend, backend, logdir)
        if pulled:
            errors.print(f"pulled {pulled} event file(s) from {record.workers[0].name}")
        # A file, not a pipe: a full pipe would stall it.
        server_log = context.store.tensorboard_log()
        with context.store.open_private(server_log) as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                 "--port", str(port), "--host", "127.0.0.1"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:  # from here on Ctrl-C stops the server too (it was left running before the loop)
            click.echo(f"TensorBoard for run {record.run_id}: http://127.0.0.1:{port}/ ({logdir})")
            served = {"url": f"http://127.0.0.1:{port}/", "pid": server.pid,
                      "run_id": record.run_id}  # fmt: skip
            context.store.write_file(context.store.tensorboard_path(), json.dumps(served))
            while server.poll() is None:
                time.sleep(refresh if events_are_remote(record, backend) else 1.0)
                pull_events(record, backend, backend, logdir)
        except KeyboardInterrupt:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:  # still starting up on a loaded machine
                server.kill()
                server.wait(timeout=15)
            errors.print("TensorBoard stopped")
            return
    last = server_log.read_text().strip().splitlines()[-1:] or ["no output"]
    raise MissingTool(
        f"TensorBoard exited {server.returncode}: {last[0]}",
        hint=f"is port {port} free? try --port; its log is {server_log}",
    )


@cli.command(name="pull-export")
@click.option(
    "--to",
    "target",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to put it (replaced whole). Default: {state-dir}/export/{job}/ for a remote "
    "chief; a local chief's export is already on this machine and is only copied with --to.",
)
@run_option
@pass_context
def pull_export_command(context: Context, target: Path | None, run_id: str | None) -> None:
    """Copy the model the chief exported (job key export:) to this machine; print its path.

    The chief writes {workdir}/{job}/export/ at the end of a successful run: model.keras for
    'export: keras', a SavedModel directory saved_model/ for 'export: saved_model'.
    """
    record = context.store.load(run_id)
    chief = record.workers[0]
    with open_backend(record.inventory) as backend:
        if not export_is_remote(record, backend) and target is None:
            source = local_export(record)
            errors.print(f"{chief.name} shares this machine's files: its export is read in place")
            click.echo(str(source))
            return
        pulled = pull_export(record, backend, target or context.store.export_dir(record.job_name))
    errors.print(
        f"copied {pulled.files} file(s) ({pulled.size_bytes / 2**20:.1f} MiB) of "
        f"{chief.name}'s export {pulled.source} to {pulled.target}",
        markup=False,
        highlight=False,
    )
    click.echo(str(pulled.target))
